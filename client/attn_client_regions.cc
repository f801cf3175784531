// AttnClient's unary-style calls on server state: shared-memory regions (RegisterRegion,
// UnregisterRegion, ListRegions) and contexts (CreateContext, AppendContext, GetContext,
// DeleteContext, ListContexts).
#include <algorithm>

#include "absl/time/clock.h"
#include "client/attn_client.h"
#include "grpcpp/client_context.h"
#include "wire/convert.h"
#include "wire/status.h"

namespace attnserve::client {

namespace v1 = ::attnserve::v1;

namespace {

// The call options' deadline and wait-for-ready, on a call's context.
void ApplyCallOptions(const CallOptions& options, grpc::ClientContext& context) {
  if (options.timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  }
  context.set_wait_for_ready(options.wait_for_ready);
}

}  // namespace

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> AttnClient::Unary(Method method, const Request& request,
                                           const CallOptions& options) {
  grpc::ClientContext context;
  ApplyCallOptions(options, context);
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

absl::StatusOr<v1::ContextStatus> AttnClient::CreateContext(
    const std::string& name, DType dtype, int64_t kv_heads, int64_t head_dim,
    int64_t capacity_tokens, absl::Duration ttl, const CallOptions& options, int32_t shards) {
  v1::CreateContextRequest request;
  request.set_name(name);
  request.set_dtype(DTypeToProto(dtype));
  request.set_kv_heads(kv_heads);
  request.set_head_dim(head_dim);
  request.set_capacity_tokens(capacity_tokens);
  request.set_ttl_seconds(absl::ToInt64Seconds(ttl));
  request.set_shards(shards);
  auto r = Unary<v1::CreateContextRequest, v1::CreateContextResponse>(
      &v1::AttentionService::Stub::CreateContext, request, options);
  if (!r.ok()) return r.status();
  return r->context();
}

absl::StatusOr<v1::ContextStatus> AttnClient::AppendContext(const std::string& name,
                                                            const HostTensor& k,
                                                            const HostTensor& v,
                                                            std::optional<int64_t> expect_tokens,
                                                            const CallOptions& options) {
  const auto rows = [](const HostTensor& t) -> int64_t {
    if (t.rank() == 3) return t.dim(0);
    if (t.rank() == 4 && t.dim(0) == 1) return t.dim(1);
    return -1;
  };
  if (rows(k) < 1 || k.dims() != v.dims() || k.dtype() != v.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("k, v: must be [T, Hkv, D] (or [1, T, Hkv, D]) alike, T >= 1; got ",
                     k.DebugString(), " and ", v.DebugString()));
  }
  grpc::ClientContext context;
  ApplyCallOptions(options, context);
  v1::AppendContextResponse response;
  auto writer = stub_->AppendContext(&context, &response);
  v1::AppendContextRequest m;
  m.mutable_header()->set_context(name);
  m.mutable_header()->set_tokens(rows(k));
  if (expect_tokens) m.mutable_header()->set_expect_tokens(*expect_tokens);
  bool ok = writer->Write(m);
  const int64_t chunk = options_.chunk_bytes;
  Progress progress;
  progress.send_total_bytes = static_cast<int64_t>(k.nbytes() + v.nbytes());
  for (auto [kind, t] : {std::pair{v1::TENSOR_K, &k}, std::pair{v1::TENSOR_V, &v}}) {
    const int64_t total = static_cast<int64_t>(t->nbytes());
    for (int64_t off = 0; ok && off < total; off += chunk) {
      m.Clear();
      v1::TensorChunk* c = m.mutable_chunk();
      c->set_tensor(kind);
      c->set_offset(off);
      const int64_t n = std::min(chunk, total - off);
      c->set_data(reinterpret_cast<const char*>(t->data()) + off, n);
      ok = writer->Write(m);  // false: the server ended the call; Finish says why
      progress.sent_bytes += n;
      if (ok && options.progress) options.progress(progress);
    }
  }
  if (ok) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return response.context();
}

absl::StatusOr<v1::ContextStatus> AttnClient::AppendContextFromRegions(
    const std::string& name, int64_t tokens, const TensorRegion& k, const TensorRegion& v,
    std::optional<int64_t> expect_tokens, const CallOptions& options) {
  grpc::ClientContext context;
  ApplyCallOptions(options, context);
  v1::AppendContextResponse response;
  auto writer = stub_->AppendContext(&context, &response);
  v1::AppendContextRequest m;
  v1::AppendContextHeader* h = m.mutable_header();
  h->set_context(name);
  h->set_tokens(tokens);
  if (expect_tokens) h->set_expect_tokens(*expect_tokens);
  for (auto [ref, region] :
       {std::pair{h->mutable_k_region(), &k}, std::pair{h->mutable_v_region(), &v}}) {
    ref->set_region(region->region);
    ref->set_offset(region->offset);
    ref->set_bytes(region->bytes);
  }
  if (writer->Write(m)) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return response.context();
}

absl::StatusOr<v1::ContextStatus> AttnClient::GetContext(const std::string& name,
                                                         const CallOptions& options) {
  v1::GetContextRequest request;
  request.set_name(name);
  auto r = Unary<v1::GetContextRequest, v1::GetContextResponse>(
      &v1::AttentionService::Stub::GetContext, request, options);
  if (!r.ok()) return r.status();
  return r->context();
}

absl::StatusOr<v1::DeleteContextResponse> AttnClient::DeleteContext(const std::string& name,
                                                                    const CallOptions& options) {
  v1::DeleteContextRequest request;
  request.set_name(name);
  return Unary<v1::DeleteContextRequest, v1::DeleteContextResponse>(
      &v1::AttentionService::Stub::DeleteContext, request, options);
}

absl::StatusOr<v1::ListContextsResponse> AttnClient::ListContexts(const CallOptions& options) {
  return Unary<v1::ListContextsRequest, v1::ListContextsResponse>(
      &v1::AttentionService::Stub::ListContexts, v1::ListContextsRequest(), options);
}

}  // namespace attnserve::client
