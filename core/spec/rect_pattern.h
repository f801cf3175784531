// A request that is not square (a query offset, Nq != Nkv, packed sequences: docs/DESIGN.md "The
// math") as RectLayouts: each of its attention problems (a span) is queries at positions
// [q_pos, q_pos + q_len) against keys at [0, k_len), which is exactly what a RectLayout describes
// (q_begin = q_pos, k_begin = 0). Backends execute the pieces as they execute ring steps
// (CpuAttentionPiece); nothing here is O(N^2) beyond the kept tiles themselves.
#ifndef ATTNSERVE_CORE_SPEC_RECT_PATTERN_H_
#define ATTNSERVE_CORE_SPEC_RECT_PATTERN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/spec/rect_layout.h"

namespace attnserve {

// One attention problem of a request: query rows [q_row, q_row + q_len) of Q, at positions
// [q_pos, q_pos + q_len), against key rows [k_row, k_row + k_len) of K and V, at positions
// [k_pos, k_pos + k_len) (k_pos is 0 unless the keys are a piece of a longer sequence:
// spec.k_offset). The same rows of every batch element.
struct QuerySpan {
  int64_t q_row = 0;
  int64_t q_len = 0;
  int64_t q_pos = 0;
  int64_t k_row = 0;
  int64_t k_len = 0;
  int64_t k_pos = 0;

  // The positions the pattern is defined over (block_sparse counts its blocks over them).
  int64_t extent() const { return std::max(q_pos + q_len, k_pos + k_len); }
};

// The spans of a validated request: one (q_pos = spec.q_offset, k_pos = spec.k_offset) when not
// packed; when packed, one per sequence that has queries (q_pos = k_len - q_len), in order.
// O(sequences).
std::vector<QuerySpan> RequestSpans(const AttentionSpec& spec, const AttentionShape& shape);

// The pieces of one span of a validated dense, window or block_sparse spec, together the span's
// whole computation: RectLayouts on the span's positions (k_begin = span.k_pos, which is 0 for
// block_sparse: key shards are dense or window). Dense and window give one
// layout at tile options.block_size. Block_sparse gives one or two at tile = its block size, over
// nb = NumBlocks(span.extent()) blocks: a query range starting inside a block is cut at the next
// block boundary, so that every query tile lies in one query block; options.max_kept_blocks bounds
// their kept tiles (RESOURCE_EXHAUSTED). Layouts with no kept tile are left out.
absl::StatusOr<std::vector<RectLayout>> SpanLayouts(const AttentionSpec& spec,
                                                    const QuerySpan& span,
                                                    const CompileOptions& options = {});

// One dilated branch (segment length w, rate r) for one head offset o over one span, gathered:
// the set's positions numbered in order along the whole position axis ("indices": segment t holds
// indices [t * c, (t + 1) * c) with c = ceil((w - o) / r) per full segment). Keys at positions
// [0, k_len) in the set get indices 0 .. k_rows.size() - 1, the span's queries in the set get
// q_index0 .. q_index0 + q_rows.size() - 1, and "same segment" and "key <= query" are comparisons
// of indices, so the branch is a plain segmented (causal) problem on the gathered rows.
struct DilatedSpanGroup {
  int64_t offset = 0;                   // heads h with h % rate == offset use it
  std::vector<int64_t> q_rows;          // span-relative query rows in the set, ascending
  std::vector<int64_t> k_rows;          // key rows (= positions) in the set, ascending; left
                                        // empty when no query is in the set
  int64_t q_index0 = 0;                 // index of q_rows[0]
  std::vector<int64_t> segment_starts;  // indices: the segments holding the queries, then the end
};

// O(q_len / r + k_len / r + segments the queries touch). Requires 0 <= o < r <= w.
DilatedSpanGroup BuildDilatedSpanGroup(const QuerySpan& span, int64_t w, int64_t r, int64_t o);

// The group's piece on the gathered axis: queries [q_index0, q_index0 + q_rows.size()) against
// keys [0, k_rows.size()), same segment (and causal when `causal`), at tile `tile`. The layout's
// rule points at group.segment_starts: the group must outlive it and stay where it is.
RectLayout DilatedGroupLayout(const DilatedSpanGroup& group, bool causal, int32_t tile);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_SPEC_RECT_PATTERN_H_
