// Context-parallel attention: a request whose keys are split by sequence over several devices (an
// attend against a sharded context, AttentionRequest::key_shards) runs on every shard's device at
// once. Each device attends the whole Q to its own key rows, with the spec evaluated on global
// positions (the shard's key row 0 sits at its start), which gives a partial O and LSE; the
// partials merge by the LSE rule
//   L = log sum_s exp(LSE_s),  O = sum_s exp(LSE_s - L) O_s
// (a row no shard admits a key for keeps O = 0, LSE = -inf). Nothing travels but Q and the
// partials: the K/V rows stay where the context keeps them.
#ifndef ATTNSERVE_CORE_PARALLEL_CONTEXT_PARALLEL_H_
#define ATTNSERVE_CORE_PARALLEL_CONTEXT_PARALLEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/engine/types.h"
#include "core/parallel/group_run.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

class HostMemory;

// What one shard computes: query rows [q_row0, q_row0 + q_rows) of the request (those that may
// admit a key of the shard; q_rows 0: none, the shard contributes nothing) against the shard's
// rows, as a request of its own (`spec`, `shape`) in the form every backend runs: positions
// shifted so that the lower of the first query's and the first key's is 0 (dense and window
// depend on differences of positions only), a key offset left only where queries come before
// the shard (non-causal window), and a non-causal dense shard a plain request.
struct KeyShardQuery {
  int64_t q_row0 = 0;
  int64_t q_rows = 0;
  AttentionSpec spec;
  AttentionShape shape;
};

// For a validated request (batch 1, not packed, dense or window; `spec` and `shape` are the whole
// request's: kv_len() is every shard's rows together) and its shard of `rows` key rows from row
// `start`. UNIMPLEMENTED for the kinds a key shard cannot run (block_sparse, dilated).
absl::StatusOr<KeyShardQuery> PlanKeyShard(const AttentionSpec& spec, const AttentionShape& shape,
                                           int64_t start, int64_t rows);

// The merge of the shards' partials into the request's outputs, in float32.
class KeyShardMerger {
 public:
  // Accumulators for a request of `shape` (batch 1): O 0, LSE -inf.
  static absl::StatusOr<std::unique_ptr<KeyShardMerger>> Create(const AttentionShape& shape);

  // Merges one shard's partial: o [1, q_rows, Hq, D] in any dtype, lse [1, Hq, q_rows] f32, for
  // the request's query rows from q_row0.
  absl::Status Merge(int64_t q_row0, const AttentionOutputs& part);
  // Merges float32 partials laid out like Merge's (o_f32 [q_rows, Hq, D], lse [Hq, q_rows]).
  void MergeF32(int64_t q_row0, int64_t q_rows, const float* o, const float* lse);

  // O in `dtype` and LSE, from `memory` (null: plain memory).
  absl::StatusOr<AttentionOutputs> Finish(DType dtype, HostMemory* memory) const;

 private:
  explicit KeyShardMerger(const AttentionShape& shape) : shape_(shape) {}
  AttentionShape shape_;
  HostTensor o_;    // [1, Nq, Hq, D] f32
  HostTensor lse_;  // [1, Hq, Nq] f32
};

// The group strategy of Placement::kContextParallel (group_run.h): rank r runs the r-th shard in
// ascending device order (the scheduler's rank order) on its own device. On GPUs with NCCL
// (context_parallel_cuda.cc) each rank computes its partial in place and sends it over the
// group's NCCL communicator to the rank holding the context's first rows, which merges on its
// GPU. Otherwise (CPU devices; GPU builds without NCCL) each rank runs Device::Run on host views
// of its rows (CPU) or Device::RunWithDeviceIo on the rows in place (GPU), and the partials merge
// on the host in shard order once every rank has finished.
std::unique_ptr<GroupStrategy> MakeContextParallelStrategy(AttentionRequest& request,
                                                           std::vector<Device*> devices,
                                                           const GroupEnv& env);
// The GPU + NCCL strategy; in builds without it, the host-merge strategy above.
std::unique_ptr<GroupStrategy> MakeContextParallelGpuStrategy(AttentionRequest& request,
                                                              std::vector<Device*> devices,
                                                              const GroupEnv& env);
// The host-merge strategy on any device kind.
std::unique_ptr<GroupStrategy> MakeContextParallelHostStrategy(AttentionRequest& request,
                                                               int ranks);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_CONTEXT_PARALLEL_H_
