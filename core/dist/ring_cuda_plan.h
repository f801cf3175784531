// The step schedule of the CUDA ring (core/dist/ring_cuda.h), as plain data: which (query range,
// key range) pieces each rank computes at each step and how (implicit dense, causal diagonal or a
// rectangular block layout). Pure host code, so it is unit-tested without GPUs.
//
// Splits follow ring.h: contiguous shards when not causal, zigzag (2P chunks, rank p holds chunks p
// and 2P-1-p) when causal. Boundaries are multiples of the kernel's block size (the block_sparse
// layout's block), so every key block of a piece is a whole block of the global layout and only
// the last block of the sequence is ragged.
//
// At step t rank p computes against the K/V shard of rank (p - t) mod P (rank p sends what it
// holds to p + 1 and receives from p - 1).
//
// Lean ("circulating pieces") schedule, for when device memory is tight: each rank's K/V shard is
// cut into c = kv_pieces pieces and its query shard into qc = q_chunks chunks, on split-unit
// boundaries (c = 1 or qc = 1 keeps the whole shard). Zigzag K/V pieces: c even, half from each
// of the rank's two ranges, so a piece is one contiguous range of positions. Zigzag query chunks
// are mirrored: each range is cut into qc parts and chunk j = {L_j, H_{qc-1-j}}, so every chunk
// of every rank has about the same causal work. The ranks advance tick by tick (a tick's transfer
// needs both neighbours), so a tick costs the slowest rank's piece: with contiguous chunks the
// rank holding the sequence's two ends would idle through its early chunks and dominate its late
// ones (about 1.25x the balanced time at P = 2). The rank's piece
// stream X_0, X_1, ... has X_0..X_{c-1} = its own pieces and X_{m+c} = rank (p-1)'s X_m, i.e.
// X_m = piece (m mod c) of rank (p - floor((m mod Pc) / c)) mod P: period P*c, every K/V piece of
// the ring once per period. Tick k (qc*P*c ticks) computes query chunk floor(k / (P*c)) against
// X_k while X_k is sent to p+1 and X_{k+c} received from p-1 into the slot X_{k-1} left, so K/V
// needs c + 1 piece slots (ring_cuda.h); a chunk's f32 accumulator is final after its P*c ticks.
// (q_chunks, kv_pieces) = (1, 1) is the step schedule above, tick = step. Each (query range, key
// range) pair of a step/tick is:
// - skipped when nothing is admitted (e.g. a causal key chunk after the query chunk),
// - kFull when the pattern is dense and every pair is admitted (a key chunk before the query
//   chunk, or any chunk when not causal): the kernel's implicit dense row, no mask,
// - kCausalDiagonal when dense causal and the ranges are the same chunk: the implicit causal row,
// - kLayout otherwise (window, block_sparse, or a dense causal range pair that only overlaps): a
//   RectLayout (core/spec/rect_layout.h) whose masks the kernel evaluates on global positions.
#ifndef ATTNSERVE_CORE_DIST_RING_CUDA_PLAN_H_
#define ATTNSERVE_CORE_DIST_RING_CUDA_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dist/ring.h"
#include "core/spec/attention_spec.h"
#include "core/spec/rect_layout.h"
#include "core/tensor/tensor.h"

namespace attnserve {

enum class RingPieceKind { kFull, kCausalDiagonal, kLayout };

struct RingPiece {
  TokenRange q;       // global query positions
  TokenRange k;       // global key positions
  int64_t q_row = 0;  // local row of q.begin in the rank's query shard
  int64_t k_row = 0;  // local row of k.begin in the source rank's K/V piece (c = 1: its shard)
  int64_t acc_row = 0;  // row of q.begin in its query chunk's rows (its ranges concatenated)
  RingPieceKind kind = RingPieceKind::kFull;
  RectLayout layout;           // kLayout only; tile = the plan's block size
  int64_t admitted_pairs = 0;  // per (batch, query head)
};

struct RingStep {
  int source = 0;    // rank whose K/V shard this step reads
  int q_chunk = 0;   // query chunk of the rank (lean schedule; 0 otherwise)
  int kv_piece = 0;  // piece of the source's K/V shard (lean schedule; 0 otherwise)
  std::vector<RingPiece> pieces;
  int64_t skipped_pieces = 0;  // (q range, k range) pairs with nothing admitted
};

// A query chunk or K/V piece of a rank's shard: its ranges, ascending. K/V pieces (and query
// chunks of contiguous splits) occupy consecutive local rows; a zigzag query chunk (qc > 1) is
// mirrored, {L_j, H_{qc-1-j}} of the shard's two ranges, so its rows are two runs.
struct RingChunk {
  std::vector<TokenRange> ranges;
  int64_t row = 0;     // local row of its first token in the shard
  int64_t tokens = 0;  // total tokens
};

struct RingCudaPlan {
  int ranks = 1;
  int q_chunks = 1;   // qc
  int kv_pieces = 1;  // c
  std::vector<std::vector<RingChunk>> q_chunk;   // [rank][qc]
  std::vector<std::vector<RingChunk>> kv_piece;  // [rank][c]
  int64_t max_q_chunk_tokens = 0;
  int64_t max_kv_piece_tokens = 0;
  int64_t seq_len = 0;
  int32_t block_size = 128;
  SplitKind split_kind = SplitKind::kContiguous;
  std::vector<std::vector<TokenRange>> split;  // per rank, ascending
  std::vector<int64_t> shard_tokens;           // per rank: tokens it holds
  int64_t max_shard_tokens = 0;
  std::vector<std::vector<RingStep>> steps;  // [rank][tick], qc * P * c ticks each
  int64_t ticks() const { return static_cast<int64_t>(q_chunks) * ranks * kv_pieces; }
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

// Device bytes rank `rank` of `plan` holds at peak in RingCudaRank (every buffer it allocates,
// each rounded as CachingAllocator::RoundSize rounds it), for inputs of `dtype` (bf16/f16).
// NCCL's own buffers are not included.
int64_t EstimateRingRankBytes(const RingCudaPlan& plan, int rank, const AttentionShape& shape,
                              DType dtype);
// The same for a candidate (qc, c) over the splits of `plan` without its layouts (a lower bound
// of the above, exact for dense non-causal and dense causal whose pieces need no layout), max
// over ranks.
int64_t EstimateRingRankBytes(const RingCudaPlan& plan, const AttentionShape& shape, DType dtype,
                              int q_chunks, int kv_pieces);

// Mirror of CachingAllocator::RoundSize (core/cuda/caching_allocator.h) for host-only planning.
int64_t RingAllocRound(int64_t bytes);

// Local row of global position `pos` in the shard made of `ranges` (pos must lie in one).
int64_t LocalRow(const std::vector<TokenRange>& ranges, int64_t pos);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_DIST_RING_CUDA_PLAN_H_
