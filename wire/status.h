// The one mapping between absl::Status (every boundary inside attnserve) and grpc::Status (the
// wire). The codes share their numbering; the message travels unchanged.
#ifndef ATTNSERVE_WIRE_STATUS_H_
#define ATTNSERVE_WIRE_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace attnserve {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// "OK", "INVALID_ARGUMENT", ... as used for the `code` label of attnserve_requests_total.
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace attnserve

#endif  // ATTNSERVE_WIRE_STATUS_H_
