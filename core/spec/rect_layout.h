// RectLayout: a rectangular piece of an attention computation — query rows at sequence positions
// [q_begin, q_begin + q_len) against key rows at [k_begin, k_begin + k_len) — as a CSR of kept key
// tiles per query tile, with masks evaluated on GLOBAL positions.
//
// A BlockLayout is square (queries and keys share one axis from 0) and its TokenRule has no
// position offset, so it cannot describe "shard 2's queries against shard 0's keys", which is what
// a ring step computes. A RectLayout is built either by slicing a global BlockLayout
// (block_sparse, where the kept blocks are data) or straight from an interval rule (dense, window,
// causal and dilated segments, where every query admits one contiguous range of keys). It lives
// with the pattern compiler because it is the same kind of object (what to compute, no data); the
// CPU backend executes it (CpuAttentionPiece) and the ring driver builds one per piece.
#ifndef ATTNSERVE_CORE_SPEC_RECT_LAYOUT_H_
#define ATTNSERVE_CORE_SPEC_RECT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/spec/block_layout.h"

namespace attnserve {

// Which keys a query admits, on positions of one sequence axis. For every rule here the admitted
// keys of query i form one interval [Lo(i), Hi(i)] whose ends never decrease as i grows; tile
// classification relies on that.
struct IntervalRule {
  bool causal = false;            // k <= i
  std::optional<int64_t> window;  // |i - k| <= window
  // Segments (dilated branches after gathering): i and k must lie in the same segment. Segment
  // s is [segment_starts[s], segment_starts[s + 1]); the vector is ascending and ends with the
  // sequence length. Not owned: must outlive every use of the rule.
  const std::vector<int64_t>* segment_starts = nullptr;

  // The admitted keys of query position i are [Lo(i), Hi(i)]: INT64_MIN / INT64_MAX where no
  // bound applies (never do arithmetic on them unclamped); callers clamp to their key range.
  int64_t Lo(int64_t i) const;
  int64_t Hi(int64_t i) const;
  bool Admits(int64_t i, int64_t k) const { return k >= Lo(i) && k <= Hi(i); }
};

// The interval form of a BlockLayout's token rule (what its kPartial blocks evaluate).
IntervalRule ToIntervalRule(const TokenRule& rule);

struct RectLayout {
  int64_t q_begin = 0;  // sequence position of local query row 0
  int64_t q_len = 0;
  int64_t k_begin = 0;  // sequence position of local key row 0
  int64_t k_len = 0;
  int32_t tile = 0;   // tokens per tile on both axes; the last tile of each axis may be short
  IntervalRule rule;  // what kPartial tiles evaluate (on sequence positions)
  std::vector<int64_t> row_ptr;  // num_q_tiles() + 1 entries
  std::vector<int32_t> col_idx;  // local key tile per entry, ascending within a row
  std::vector<BlockMask> mask;   // kFull / kCausalDiagonal (k <= q) / kPartial (rule)

  int64_t num_q_tiles() const { return (q_len + tile - 1) / tile; }
  int64_t num_k_tiles() const { return (k_len + tile - 1) / tile; }
  int64_t kept_tiles() const { return static_cast<int64_t>(col_idx.size()); }
  // Admitted (query, key) pairs, exactly: what the step computes (FLOPs = 4 * D * pairs per head).
  int64_t AdmittedPairs() const;
};

// The (q range, k range) piece of a global square BlockLayout. Requires q_begin and k_begin to be
// multiples of layout.block_size and each range to end on a multiple of it or at seq_len, so
// every tile of the piece is one block of the original (shard boundaries are chosen that way);
// INVALID_ARGUMENT otherwise. Masks carry over; kPartial evaluates layout.rule. Time
// O(query blocks * log(row length) + kept blocks in the piece).
absl::StatusOr<RectLayout> SliceBlockLayout(const BlockLayout& layout, int64_t q_begin,
                                            int64_t q_end, int64_t k_begin, int64_t k_end);

// The (q range, k range) piece of the computation defined by `rule` alone, at tile size `tile`
// (any alignment). A tile pair is skipped when no pair is admitted, kFull when all are, else
// kPartial. Time O(query tiles + kept tiles).
RectLayout RectLayoutFromRule(const IntervalRule& rule, int64_t q_begin, int64_t q_end,
                              int64_t k_begin, int64_t k_end, int32_t tile);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_SPEC_RECT_LAYOUT_H_
