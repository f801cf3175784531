#include "wire/status.h"

namespace attnserve {
namespace {

// Codes outside the canonical range (which neither side produces) become UNKNOWN.
constexpr int kMaxCanonicalCode = 16;  // UNAUTHENTICATED

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  int code = static_cast<int>(status.code());
  if (code < 0 || code > kMaxCanonicalCode) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  int code = static_cast<int>(status.error_code());
  if (code < 0 || code > kMaxCanonicalCode) code = static_cast<int>(absl::StatusCode::kUnknown);
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

std::string GrpcCodeName(grpc::StatusCode code) {
  int c = static_cast<int>(code);
  if (c < 0 || c > kMaxCanonicalCode) c = static_cast<int>(absl::StatusCode::kUnknown);
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
}

}  // namespace attnserve
