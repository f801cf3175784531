// The service's side of authentication (server/auth/): who the caller of a call is, its streams,
// its resident bytes and its request-size limit. Every handler of AttentionService asks Authorize
// (or AdmitStream for the streams) first; Describe only with --auth-discovery.
#include <limits>
#include <optional>
#include <string>

#include "server/grpc/service.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

int64_t SatMul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > std::numeric_limits<int64_t>::max() / b ? std::numeric_limits<int64_t>::max() : a * b;
}

int64_t SatAdd(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

}  // namespace

absl::StatusOr<std::shared_ptr<auth::Principal>> AttentionServiceImpl::Authorize(
    const grpc::CallbackServerContext& context) const {
  if (options_.authenticator == nullptr) return anonymous_;  // no tokens: one anonymous caller
  std::optional<absl::string_view> authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  return options_.authenticator->Authenticate(authorization);
}

absl::StatusOr<std::shared_ptr<auth::Principal>> AttentionServiceImpl::AdmitStream(
    const grpc::CallbackServerContext& context, auth::StreamSlot* slot) const {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(context);
  if (!caller.ok()) return caller.status();
  absl::StatusOr<auth::StreamSlot> acquired = (*caller)->AcquireStream();
  if (!acquired.ok()) return acquired.status();
  *slot = *std::move(acquired);
  return caller;
}

int64_t AttentionServiceImpl::ResidentBytes(const std::string& owner) {
  int64_t bytes = 0;
  for (const ContextInfo& info : contexts_->List(owner)) bytes += info.bytes;
  for (const RegionInfo& info : regions_->List(owner)) bytes += info.bytes;
  return bytes;
}

absl::Status AttentionServiceImpl::CheckAttendHeader(const auth::Principal& caller,
                                                     const v1::AttendHeader& header) {
  if (caller.limits().max_request_bytes <= 0) return absl::OkStatus();
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "header.dtype");
  if (!dtype.ok()) return absl::OkStatus();  // the assembler reports it
  const int64_t elem = static_cast<int64_t>(DTypeSize(*dtype));
  const int64_t q = SatMul(
      SatMul(SatMul(SatMul(header.batch(), header.tokens()), header.q_heads()), header.head_dim()),
      elem);
  int64_t bytes = q;
  if (header.context().empty()) {
    const int64_t kv_len = header.kv_tokens() > 0 ? header.kv_tokens() : header.tokens();
    const int64_t kv = SatMul(
        SatMul(SatMul(SatMul(header.batch(), kv_len), header.kv_heads()), header.head_dim()), elem);
    bytes = SatAdd(q, SatAdd(kv, kv));
  }
  return caller.CheckRequestBytes(bytes, "header: q, k and v of the request");
}

}  // namespace attnserve
