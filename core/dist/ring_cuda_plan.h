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
// holds to p + 1 and receives from p - 1). Each (query range, key range) pair of that step is:
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

namespace attnserve {

enum class RingPieceKind { kFull, kCausalDiagonal, kLayout };

struct RingPiece {
  TokenRange q;       // global query positions
  TokenRange k;       // global key positions
  int64_t q_row = 0;  // local row of q.begin in the rank's query shard
  int64_t k_row = 0;  // local row of k.begin in the source rank's K/V shard
  RingPieceKind kind = RingPieceKind::kFull;
  RectLayout layout;           // kLayout only; tile = the plan's block size
  int64_t admitted_pairs = 0;  // per (batch, query head)
};

struct RingStep {
  int source = 0;  // rank whose K/V shard this step reads
  std::vector<RingPiece> pieces;
  int64_t skipped_pieces = 0;  // (q range, k range) pairs with nothing admitted
};

struct RingCudaPlan {
  int ranks = 1;
  int64_t seq_len = 0;
  int32_t block_size = 128;
  SplitKind split_kind = SplitKind::kContiguous;
  std::vector<std::vector<TokenRange>> split;  // per rank, ascending
  std::vector<int64_t> shard_tokens;           // per rank: tokens it holds
  int64_t max_shard_tokens = 0;
  std::vector<std::vector<RingStep>> steps;  // [rank][step], P steps each
  std::vector<int64_t> admitted_pairs;       // per rank, per (batch, query head)
};

struct RingCudaPlanOptions {
  // Kernel block (64 or 128) for dense and window specs; block_sparse uses its own block size.
  int32_t block_size = 128;
  // Bounds the global block_sparse layout (see CompileOptions::max_kept_blocks).
  std::optional<int64_t> max_kept_blocks;
};

// Plans a ring over `ranks` ranks for a sequence of n tokens. UNIMPLEMENTED for dilated specs
// (they need no ring when segments fit in shards, see RingAttentionCuda; moving dilated segments
// between GPUs is not implemented), INVALID_ARGUMENT for ranks < 1 or a bad block size.
absl::StatusOr<RingCudaPlan> PlanRingCuda(const AttentionSpec& spec, int64_t n, int ranks,
                                          const RingCudaPlanOptions& options = {});

// Local row of global position `pos` in the shard made of `ranges` (pos must lie in one).
int64_t LocalRow(const std::vector<TokenRange>& ranges, int64_t pos);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_DIST_RING_CUDA_PLAN_H_
