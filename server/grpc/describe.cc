// Describe: what this server runs (devices, backends, limits, supported specs), read from the
// device pool and each backend's own capability (Device::HeadDimSupported), never from a copy.
#include <cstdint>
#include <string>

#include "core/spec/attention_spec.h"
#include "server/grpc/service.h"

#ifndef ATTNSERVE_VERSION
#define ATTNSERVE_VERSION "0.0.0"
#endif

namespace attnserve {

grpc::ServerUnaryReactor* AttentionServiceImpl::Describe(grpc::CallbackServerContext* context,
                                                         const v1::DescribeRequest* request,
                                                         v1::DescribeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (options_.describe_needs_token) {  // --auth-discovery
    if (absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
        !caller.ok()) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.status().message())));
      return reactor;
    }
  }
  *response = BuildDescribe();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

v1::DescribeResponse AttentionServiceImpl::BuildDescribe() const {
  v1::DescribeResponse r;
  r.set_version(ATTNSERVE_VERSION);
  const BackendKind backend = pool_->backend();
  r.set_backend(std::string(BackendName(backend)));
  for (const Device* d : pool_->devices()) {
    const DeviceStats s = d->Stats();
    v1::DeviceInfo* info = r.add_devices();
    info->set_name(d->name());
    info->set_uuid(d->uuid());
    info->set_model(d->model());
    info->set_memory_total_bytes(s.memory_total_bytes);
    info->set_memory_free_bytes(s.memory_free_bytes);
  }
  v1::Limits* limits = r.mutable_limits();
  limits->set_max_request_bytes(options_.limits.max_request_bytes);
  limits->set_max_queue(options_.max_queue);
  limits->set_chunk_bytes(options_.limits.default_response_chunk_bytes);
  limits->set_max_chunk_bytes(options_.limits.max_chunk_bytes);
  for (int32_t b : kSupportedBlockSizes) limits->add_block_sizes(b);
  // The head dims every device of the pool runs (the backends' own capability tables).
  for (int32_t d = 1; d <= kMaxHeadDim; ++d) {
    bool all = true;
    for (const Device* dev : pool_->devices()) all = all && dev->HeadDimSupported(d);
    if (all) limits->add_head_dims(d);
  }
  for (const char* p : {"dense", "window", "dilated", "block_sparse"}) r.add_patterns(p);
  for (const char* g :
       {"local_window", "dilated_sparse", "global_local", "strided", "random", "csr"}) {
    r.add_generators(g);
  }
  for (const char* t : {"f32", "f16", "bf16"}) r.add_dtypes(t);
  r.add_placements("single");
  if (pool_->size() > 1) {
    r.add_placements("data_parallel");
    r.add_placements("ring");
  }
  if (backend == BackendKind::kCpu) {
    r.set_notes(
        "cpu backend: every dtype is computed with float32 accumulation (f16/bf16 inputs "
        "converted per tile, O rounded back to the input dtype). With several cpu devices a "
        "request "
        "may run data_parallel (batch x kv-head units over devices) or as a ring (sequence over "
        "devices, one rank per device worker, in-process transfers counted as "
        "attnserve_nccl_bytes_total). Device memory metrics of a cpu device count its tracker: "
        "the running request's q/k/v, outputs and workspaces (a ring rank: its share's "
        "estimate). A context larger than one device's share of --context-memory-bytes (or "
        "created with shards > 1) is split by sequence over devices, and an attend against it "
        "runs context_parallel: each device attends Q to its rows, the partials merge by LSE "
        "(dense and window specs).");
  } else {
    r.set_notes(
        "cuda backend: f32 inputs are converted to bf16 on the device; f16/bf16 run natively "
        "with float32 accumulation. With several GPUs a request may run data_parallel (each GPU's "
        "worker runs its share) or as a NCCL ring (each GPU's worker runs its own rank over a "
        "cached communicator; a dilated request whose segments are longer than a shard runs its "
        "composition from the first GPU's worker while the group's other GPUs are reserved for "
        "it). A context larger than one GPU's share of --context-memory-bytes (or created with "
        "shards > 1) is split by sequence over GPUs, and an attend against it runs "
        "context_parallel: each GPU attends Q to its rows in place, the partials merge by LSE "
        "(dense and window specs).");
  }
  for (const ContextInfo& info : contexts_->List("")) {
    ContextStatusToProto(info, r.add_contexts());
  }
  return r;
}

}  // namespace attnserve
