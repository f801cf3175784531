#include "core/spec/rect_pattern.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/spec/row_generator.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

int64_t CeilDiv(int64_t n, int64_t d) { return n == 0 ? 0 : 1 + (n - 1) / d; }

// The block_sparse piece of query positions [q_begin, q_end) against keys [0, k_len), at tile =
// block size. Query tile qt is block q_begin / b + qt, which holds only when q_begin is a block
// boundary or the whole range lies in one block (the caller cuts it so).
absl::StatusOr<RectLayout> BlockSparsePiece(const BlockSparseSpec& spec, bool causal, int64_t nb,
                                            const RowGenerator& generator, int64_t q_begin,
                                            int64_t q_end, int64_t k_len,
                                            std::optional<int64_t> max_kept, int64_t& kept) {
  const int64_t b = spec.block_size;
  RectLayout out;
  out.q_begin = q_begin;
  out.q_len = q_end - q_begin;
  out.k_begin = 0;
  out.k_len = k_len;
  out.tile = spec.block_size;
  out.rule.causal = causal;  // what the kCausalDiagonal tiles evaluate
  const int64_t key_blocks = NumBlocks(k_len, b);
  out.row_ptr.reserve(out.num_q_tiles() + 1);
  out.row_ptr.push_back(0);
  std::vector<int64_t> cols;
  for (int64_t qt = 0; qt < out.num_q_tiles(); ++qt) {
    const int64_t row = q_begin / b + qt;
    // The generator supports only these two bounds; blocks past the keys are dropped after.
    generator.Row(row, causal ? row : nb - 1, cols);
    for (int64_t c : cols) {
      if (c >= key_blocks) break;  // columns ascend
      out.col_idx.push_back(static_cast<int32_t>(c));
      // Blocks left of the diagonal hold only keys before every query of the row.
      out.mask.push_back(causal && c == row ? BlockMask::kCausalDiagonal : BlockMask::kFull);
    }
    out.row_ptr.push_back(static_cast<int64_t>(out.col_idx.size()));
    if (max_kept && kept + out.kept_tiles() > *max_kept) {
      return absl::ResourceExhaustedError(
          absl::StrCat("layout: more than ", *max_kept, " kept blocks (queries at positions [",
                       q_begin, ", ", q_end, ") against ", k_len, " keys at block size ", b, ")"));
    }
  }
  kept += out.kept_tiles();
  return out;
}

}  // namespace

std::vector<QuerySpan> RequestSpans(const AttentionSpec& spec, const AttentionShape& shape) {
  if (!IsPacked(spec)) {
    return {QuerySpan{0, shape.tokens, spec.q_offset, 0, shape.kv_len(), spec.k_offset}};
  }
  std::vector<QuerySpan> spans;
  const std::vector<int64_t>& cq = spec.cu_seqlens_q;
  const std::vector<int64_t>& ck = spec.cu_seqlens_k;
  for (size_t s = 0; s + 1 < cq.size(); ++s) {
    const int64_t q_len = cq[s + 1] - cq[s];
    const int64_t k_len = ck[s + 1] - ck[s];
    if (q_len > 0) spans.push_back(QuerySpan{cq[s], q_len, k_len - q_len, ck[s], k_len, 0});
  }
  return spans;
}

absl::StatusOr<std::vector<RectLayout>> SpanLayouts(const AttentionSpec& spec,
                                                    const QuerySpan& span,
                                                    const CompileOptions& options) {
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    return absl::InvalidArgumentError(
        "spec.dilated: a dilated spec runs per branch and head offset (BuildDilatedSpanGroup)");
  }
  const int64_t q_end = span.q_pos + span.q_len;
  std::vector<RectLayout> out;
  const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern);
  if (bs == nullptr) {
    if (options.block_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.block_size: must be >= 1, got ", options.block_size));
    }
    IntervalRule rule;
    rule.causal = spec.causal;
    rule.window = WindowWithin(spec, span.extent());
    RectLayout layout = RectLayoutFromRule(rule, span.q_pos, q_end, span.k_pos,
                                           span.k_pos + span.k_len, options.block_size);
    if (layout.kept_tiles() > 0) out.push_back(std::move(layout));
    return out;
  }
  if (span.k_pos != 0) {
    return absl::UnimplementedError(
        "spec.block_sparse: keys at a position offset (a sharded context) are not supported");
  }
  const int64_t b = bs->block_size;
  const int64_t nb = NumBlocks(span.extent(), b);
  // A csr layout is validated for the request's longest sequence; this span reads its top-left
  // nb x nb corner, which the row pointers must cover.
  if (const auto* csr = std::get_if<CsrGen>(&bs->generator);
      csr != nullptr && static_cast<int64_t>(csr->row_ptr.size()) < nb + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.block_sparse.csr.row_ptr: has ", csr->row_ptr.size(),
                     " entries, a span of ", span.extent(), " positions needs ", nb + 1));
  }
  const RowGenerator generator(bs->generator, nb);
  const int64_t cut = std::min(q_end, CeilDiv(span.q_pos, b) * b);
  int64_t kept = 0;
  for (const auto& [begin, end] : {std::pair{span.q_pos, cut}, std::pair{cut, q_end}}) {
    if (begin >= end) continue;
    ATTN_ASSIGN_OR_RETURN(RectLayout layout,
                          BlockSparsePiece(*bs, spec.causal, nb, generator, begin, end,
                                           span.k_len, options.max_kept_blocks, kept));
    if (layout.kept_tiles() > 0) out.push_back(std::move(layout));
  }
  return out;
}

DilatedSpanGroup BuildDilatedSpanGroup(const QuerySpan& span, int64_t w, int64_t r, int64_t o) {
  DilatedSpanGroup g;
  g.offset = o;
  const int64_t per_segment = CeilDiv(w - o, r);
  // Set positions in [lo, hi), ascending, each segment's from its first at or after lo. Steps stop
  // at the segment's end rather than adding r past it (w and r may be as large as int64 allows).
  const auto positions = [&](int64_t lo, int64_t hi, std::vector<int64_t>& out) {
    if (lo >= hi) return;
    for (int64_t t = lo / w; t <= (hi - 1) / w; ++t) {
      const int64_t first = t * w + o;
      const int64_t end = std::min(hi, (hi - t * w > w) ? t * w + w : hi);
      int64_t x = first;
      if (first < lo) {
        // Skip to the first set position at or after lo, unless it lies at or past `end`, where
        // first + steps * r may not fit in int64 (o >= 1 and r near 2^63).
        const int64_t steps = CeilDiv(lo - first, r);
        if (steps > (end - 1 - first) / r) continue;
        x = first + steps * r;
      }
      for (; x < end; x = end - x > r ? x + r : end) out.push_back(x);
    }
  };
  positions(span.q_pos, span.q_pos + span.q_len, g.q_rows);
  if (g.q_rows.empty()) return g;  // nothing to compute: no key rows either
  positions(0, span.k_len, g.k_rows);
  const auto index = [&](int64_t x) { return (x / w) * per_segment + (x % w - o) / r; };
  g.q_index0 = index(g.q_rows.front());
  const int64_t t_first = g.q_rows.front() / w;
  const int64_t t_last = g.q_rows.back() / w;
  for (int64_t t = t_first; t <= t_last; ++t) g.segment_starts.push_back(t * per_segment);
  // The last segment's end: no gathered row has an index at or past the extent, so capping there
  // keeps (t + 1) * per_segment from overflowing without changing any comparison.
  g.segment_starts.push_back(t_last * per_segment + std::min(per_segment, span.extent()));
  for (int64_t& x : g.q_rows) x -= span.q_pos;
  return g;
}

RectLayout DilatedGroupLayout(const DilatedSpanGroup& group, bool causal, int32_t tile) {
  IntervalRule rule;
  rule.causal = causal;
  rule.segment_starts = &group.segment_starts;
  const int64_t nq = static_cast<int64_t>(group.q_rows.size());
  const int64_t nk = static_cast<int64_t>(group.k_rows.size());
  return RectLayoutFromRule(rule, group.q_index0, group.q_index0 + nq, 0, nk, tile);
}

}  // namespace attnserve
