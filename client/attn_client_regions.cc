// AttnClient's shared-memory region calls: RegisterRegion, UnregisterRegion, ListRegions.

#include "absl/time/clock.h"
#include "client/attn_client.h"
#include "grpcpp/client_context.h"
#include "wire/status.h"

namespace attnserve::client {

namespace v1 = ::attnserve::v1;

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> AttnClient::Unary(Method method, const Request& request,
                                           const CallOptions& options) {
  grpc::ClientContext context;
  if (options.timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  }
  context.set_wait_for_ready(options.wait_for_ready);
  Response response;
  const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::RegionStatus> AttnClient::RegisterSystemRegion(const std::string& name,
                                                                  const std::string& shm_key,
                                                                  int64_t offset, int64_t bytes,
                                                                  const CallOptions& options) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  request.mutable_system()->set_shm_key(shm_key);
  request.mutable_system()->set_offset(offset);
  request.mutable_system()->set_bytes(bytes);
  auto r = Unary<v1::RegisterRegionRequest, v1::RegisterRegionResponse>(
      &v1::AttentionService::Stub::RegisterRegion, request, options);
  if (!r.ok()) return r.status();
  return r->region();
}

absl::StatusOr<v1::RegionStatus> AttnClient::RegisterCudaIpcRegion(const std::string& name,
                                                                   const std::string& ipc_handle,
                                                                   int device, int64_t bytes,
                                                                   const CallOptions& options) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  request.mutable_cuda_ipc()->set_handle(ipc_handle);
  request.mutable_cuda_ipc()->set_device(device);
  request.mutable_cuda_ipc()->set_bytes(bytes);
  auto r = Unary<v1::RegisterRegionRequest, v1::RegisterRegionResponse>(
      &v1::AttentionService::Stub::RegisterRegion, request, options);
  if (!r.ok()) return r.status();
  return r->region();
}

absl::StatusOr<v1::UnregisterRegionResponse> AttnClient::UnregisterRegion(
    const std::string& name, const CallOptions& options) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  return Unary<v1::UnregisterRegionRequest, v1::UnregisterRegionResponse>(
      &v1::AttentionService::Stub::UnregisterRegion, request, options);
}

absl::StatusOr<v1::ListRegionsResponse> AttnClient::ListRegions(const CallOptions& options) {
  return Unary<v1::ListRegionsRequest, v1::ListRegionsResponse>(
      &v1::AttentionService::Stub::ListRegions, v1::ListRegionsRequest(), options);
}

}  // namespace attnserve::client
