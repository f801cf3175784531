// AttendInput -> the request's AttendHeader, with the input checks (shapes, dtypes, region refs).
// Internal to the client library.
#ifndef ATTNSERVE_CLIENT_ATTEND_INPUT_H_
#define ATTNSERVE_CLIENT_ATTEND_INPUT_H_

#include "absl/status/statusor.h"
#include "attnserve/v1/attnserve.pb.h"
#include "client/attn_client.h"

namespace attnserve::client {

// INVALID_ARGUMENT naming the field: a tensor given both as a pointer and a region (or neither),
// shapes that disagree, q absent without `shape`, lse_region without o_region.
absl::StatusOr<attnserve::v1::AttendHeader> BuildAttendHeader(const AttendInput& input);

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_ATTEND_INPUT_H_
