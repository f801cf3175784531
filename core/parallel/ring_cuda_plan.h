// The CUDA ring's plan (core/parallel/ring_cuda.h): the shared ring schedule (ring_schedule.h:
// splits, query chunks, K/V pieces, ticks, slots and transfers) with every (query range, key
// range) pair of every tick classified for the kernel, and the device memory one rank holds. Pure
// host code, so it is unit-tested (and the schedule executed on the CPU) without GPUs.
//
// Boundaries are multiples of the kernel's block size (the block_sparse layout's block), so every
// key block of a piece is a whole block of the global layout and only the last block of the
// sequence is ragged. (q_chunks, kv_pieces) = (1, 1) runs the keep-home slot policy (the rank's
// own K/V stay in a read-only home buffer, P-1 transfers, repeatable without reloading); any other
// counts run the lean "circulating pieces" schedule with the restore-home policy (c + 1 slots).
// Each pair of a tick is:
// - skipped when nothing is admitted (e.g. a causal key chunk after the query chunk),
// - kFull when the pattern is dense and every pair is admitted (a key chunk before the query
//   chunk, or any chunk when not causal): the kernel's implicit dense row, no mask,
// - kCausalDiagonal when dense causal and the ranges are the same chunk: the implicit causal row,
// - kLayout otherwise (window, block_sparse, or a dense causal range pair that only overlaps): a
//   RectLayout (core/spec/rect_layout.h) whose masks the kernel evaluates on global positions.
#ifndef ATTNSERVE_CORE_PARALLEL_RING_CUDA_PLAN_H_
#define ATTNSERVE_CORE_PARALLEL_RING_CUDA_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/parallel/ring_schedule.h"
#include "core/spec/attention_spec.h"
#include "core/spec/rect_layout.h"
#include "core/tensor/tensor.h"

namespace attnserve {

enum class RingPieceKind { kFull, kCausalDiagonal, kLayout };

// A pair of the schedule as the kernel runs it.
struct RingPiece : RingPair {
  RingPieceKind kind = RingPieceKind::kFull;
  RectLayout layout;           // kLayout only; tile = the plan's block size
  int64_t admitted_pairs = 0;  // per (batch, query head)
};

// The kernel's work of one tick (the tick itself: RingSchedule::rank_ticks).
struct RingStep {
  std::vector<RingPiece> pieces;  // the tick's pairs with something admitted, in pair order
  int64_t skipped_pieces = 0;     // pairs with nothing admitted
};

// A RingSchedule (what meets what, which slot moves when) plus the kernel's view of its pairs.
struct RingCudaPlan : RingSchedule {
  int64_t seq_len = 0;
  int32_t block_size = 128;
  std::vector<std::vector<RingStep>> steps;  // [rank][tick], parallel to rank_ticks
  std::vector<int64_t> admitted_pairs;       // per rank, per (batch, query head)
  // Query rows of the largest kFull / kCausalDiagonal piece of any rank when planned with
  // cudnn_pieces (0 otherwise): the scratch each rank holds for cuDNN's piece outputs.
  int64_t cudnn_scratch_rows = 0;
};

struct RingCudaPlanOptions {
  // Kernel block (64 or 128) for dense and window specs; block_sparse uses its own block size.
  int32_t block_size = 128;
  // Bounds the global block_sparse layout (see CompileOptions::max_kept_blocks).
  std::optional<int64_t> max_kept_blocks;
  // Forced lean schedule (0: chosen). PlanRingCuda without a shape uses these or (1, 1).
  int q_chunks = 0;
  int kv_pieces = 0;
  // Device bytes per rank (0 = unlimited) for the shape-aware PlanRingCuda: it picks (1, 1) when
  // that fits, else the fitting (qc, c) of powers of two with the smallest qc (communication
  // grows with qc), then the smallest c (c even for zigzag splits).
  int64_t device_memory_budget = 0;
  // kFull and kCausalDiagonal pieces run on cuDNN's fused kernel (RingCudaRank, when libcudnn
  // loads): each rank then holds a scratch O (input dtype) and LSE of the largest such piece's
  // query rows, which the plan sizes (RingCudaPlan::cudnn_scratch_rows) and the estimates count.
  bool cudnn_pieces = false;
};

// Plans a ring over `ranks` ranks for a sequence of n tokens. UNIMPLEMENTED for dilated specs
// (they need no ring when segments fit in shards, see RingAttentionCuda; moving dilated segments
// between GPUs is not implemented), INVALID_ARGUMENT for ranks < 1 or a bad block size.
absl::StatusOr<RingCudaPlan> PlanRingCuda(const AttentionSpec& spec, int64_t n, int ranks,
                                          const RingCudaPlanOptions& options = {});

// Shape-aware planning: as above with options.q_chunks/kv_pieces when either is set (the other
// 1; budget ignored), else the schedule chosen for options.device_memory_budget (see the option);
// RESOURCE_EXHAUSTED naming the budget and the smallest need when no candidate fits.
absl::StatusOr<RingCudaPlan> PlanRingCuda(const AttentionSpec& spec, const AttentionShape& shape,
                                          DType dtype, int ranks,
                                          const RingCudaPlanOptions& options = {});

// The device buffers one rank of `plan` allocates (RingCudaRank::Init), bytes as passed to the
// allocator, for inputs of `dtype` (bf16/f16). The executor allocates exactly this table and the
// estimates below sum it, so the estimate is the allocation.
struct RingRankBuffers {
  int64_t q = 0;  // [B, shard, Hq, D], dtype
  int64_t o = 0;
  int64_t lse = 0;                // [B, Hq, shard] f32
  int64_t o_acc = 0;              // f32 O of the rank's largest query chunk
  std::vector<int64_t> kv_slots;  // packed [K | V] per schedule slot (RingSchedule::slot_tokens)
  int64_t cudnn_o = 0;            // cuDNN piece scratch (0: none)
  int64_t cudnn_lse = 0;
  int64_t row_ptr = 0;  // the rank's layout pieces, concatenated: int64 row_ptr, int32 col_idx,
  int64_t col_idx = 0;  // uint8 mask; int32 reversed row order of the largest query piece
  int64_t mask = 0;
  int64_t reverse_rows = 0;
  // Every buffer rounded as CachingAllocator::RoundSize rounds it, summed.
  int64_t RoundedTotal() const;
};
RingRankBuffers RingRankBufferTable(const RingCudaPlan& plan, int rank,
                                    const AttentionShape& shape, DType dtype);

// Device bytes rank `rank` of `plan` holds at peak in RingCudaRank: RingRankBufferTable's
// RoundedTotal. NCCL's own buffers are not included.
int64_t EstimateRingRankBytes(const RingCudaPlan& plan, int rank, const AttentionShape& shape,
                              DType dtype);
// The same for a candidate (qc, c) over the splits of `plan` without building it (no layouts: a
// lower bound of the above, exact for dense non-causal and dense causal whose pieces need no
// layout), max over ranks.
int64_t EstimateRingRankBytes(const RingCudaPlan& plan, const AttentionShape& shape, DType dtype,
                              int q_chunks, int kv_pieces);

// Dilated specs on the CUDA ring: shards cut on multiples of lcm(segment_lengths), so every
// segment lies in one shard and each rank runs the single-GPU plan on its ranges with no
// communication. UNIMPLEMENTED when there are fewer such units than ranks.
absl::StatusOr<std::vector<std::vector<TokenRange>>> SplitDilatedForRingCuda(
    const AttentionSpec& spec, int64_t n, int ranks);
// Device bytes a rank of that split holds: the buffers of its largest range (q, k, v, o, lse),
// one range at a time; the single-GPU plan's own workspace is not included.
int64_t EstimateDilatedRankBytes(const std::vector<TokenRange>& ranges,
                                 const AttentionShape& shape, DType dtype);

// What a CUDA ring of `ranks` GPUs needs per GPU for (spec, shape, dtype), as RingCudaRun plans
// it (f32 inputs compute in bf16; options.device_memory_budget picks a lean schedule when (1, 1)
// does not fit; options.cudnn_pieces as the run would set it): the largest rank's
// EstimateRingRankBytes (EstimateDilatedRankBytes for dilated specs). Pure host code, for the
// placement planner. The errors of PlanRingCuda / SplitDilatedForRingCuda.
absl::StatusOr<int64_t> EstimateRingCudaBytesPerRank(const AttentionSpec& spec,
                                                     const AttentionShape& shape, DType dtype,
                                                     int ranks,
                                                     const RingCudaPlanOptions& options = {});

// Mirror of CachingAllocator::RoundSize (core/cuda/caching_allocator.h) for host-only planning.
int64_t RingAllocRound(int64_t bytes);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_RING_CUDA_PLAN_H_
