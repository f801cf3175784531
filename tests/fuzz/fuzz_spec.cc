// Fuzz target: the spec validator and the pattern compiler (core/spec). The fuzz bytes become an
// AttentionShape (capped at kMaxTokens positions) and an AttentionSpec of any kind; ValidateSpec
// must refuse it with INVALID_ARGUMENT / UNIMPLEMENTED naming a field, or everything downstream
// must accept it: CompilePattern (square requests), RequestSpans + SpanLayouts (rectangles,
// packed sequences, key shards), BuildDilatedSpanGroup + DilatedGroupLayout, SliceBlockLayout.
// Every layout is checked for its CSR structure and, below kMaxCheckedPairs, pair by pair against
// the token-level rule of docs/DESIGN.md "The math" (block_sparse through ReferenceBlockKept).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "core/spec/block_layout.h"
#include "core/spec/pattern_compiler.h"
#include "core/spec/rect_layout.h"
#include "core/spec/rect_pattern.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_spec_gen.h"

namespace attnserve {
namespace {

constexpr int64_t kMaxTokens = 1024;
constexpr int64_t kMaxCheckedPairs = int64_t{1} << 16;  // pair-by-pair checks below this
constexpr int64_t kMaxKeptBlocks = int64_t{1} << 14;    // CompileOptions::max_kept_blocks
constexpr int64_t kMaxTiles = int64_t{1} << 16;         // rule layouts larger are not built

int64_t CeilDiv(int64_t n, int64_t d) { return n == 0 ? 0 : 1 + (n - 1) / d; }

bool InDilatedSet(int64_t x, int64_t w, int64_t r, int64_t o) {
  const int64_t rel = x % w - o;
  return rel >= 0 && rel % r == 0;
}

// The pairs a piece of the computation admits, as a q_len x k_len bitmap over query positions
// [q0, q0 + q_len) and key positions [k0, k0 + k_len).
struct PairMap {
  int64_t q0, q_len, k0, k_len;
  std::vector<uint8_t> bits;
  PairMap(int64_t q0_, int64_t q_len_, int64_t k0_, int64_t k_len_)
      : q0(q0_), q_len(q_len_), k0(k0_), k_len(k_len_), bits(q_len_ * k_len_, 0) {}
  void Mark(int64_t q, int64_t k) {
    FUZZ_CHECK(q >= q0 && q < q0 + q_len && k >= k0 && k < k0 + k_len, "pair (", q, ", ", k,
               ") outside the piece [", q0, ", +", q_len, ") x [", k0, ", +", k_len, ")");
    uint8_t& b = bits[(q - q0) * k_len + (k - k0)];
    FUZZ_CHECK(b == 0, "pair (", q, ", ", k, ") admitted twice");
    b = 1;
  }
  bool Get(int64_t q, int64_t k) const { return bits[(q - q0) * k_len + (k - k0)] != 0; }
  int64_t Count() const { return std::count(bits.begin(), bits.end(), 1); }
};

bool Small(int64_t a, int64_t b) { return a <= kMaxCheckedPairs / std::max<int64_t>(b, 1); }

// CSR structure shared by BlockLayout and RectLayout.
template <typename Index>
void CheckCsr(const std::vector<int64_t>& row_ptr, const std::vector<Index>& col_idx,
              size_t mask_size, int64_t rows, int64_t cols) {
  FUZZ_CHECK(static_cast<int64_t>(row_ptr.size()) == rows + 1, "row_ptr has ", row_ptr.size(),
             " entries for ", rows, " rows");
  FUZZ_CHECK(row_ptr[0] == 0);
  FUZZ_CHECK(row_ptr.back() == static_cast<int64_t>(col_idx.size()));
  FUZZ_CHECK(mask_size == col_idx.size());
  for (int64_t i = 0; i < rows; ++i) {
    FUZZ_CHECK(row_ptr[i] <= row_ptr[i + 1], "row_ptr decreases at ", i);
    for (int64_t e = row_ptr[i]; e < row_ptr[i + 1]; ++e) {
      FUZZ_CHECK(col_idx[e] >= 0 && col_idx[e] < cols, "column ", col_idx[e], " of row ", i,
                 " outside [0, ", cols, ")");
      if (e > row_ptr[i]) FUZZ_CHECK(col_idx[e - 1] < col_idx[e], "row ", i, " not ascending");
    }
  }
}

void MarkRect(const RectLayout& l, PairMap& map) {
  for (int64_t qt = 0; qt < l.num_q_tiles(); ++qt) {
    const int64_t qa = l.q_begin + qt * l.tile;
    const int64_t qz = std::min(qa + l.tile, l.q_begin + l.q_len);
    for (int64_t e = l.row_ptr[qt]; e < l.row_ptr[qt + 1]; ++e) {
      const int64_t ka = l.k_begin + int64_t{l.col_idx[e]} * l.tile;
      const int64_t kz = std::min(ka + l.tile, l.k_begin + l.k_len);
      for (int64_t q = qa; q < qz; ++q) {
        for (int64_t k = ka; k < kz; ++k) {
          const bool in = l.mask[e] == BlockMask::kFull             ? true
                          : l.mask[e] == BlockMask::kCausalDiagonal ? k <= q
                                                                    : l.rule.Admits(q, k);
          if (in) map.Mark(q, k);
        }
      }
    }
  }
}

void CheckRect(const RectLayout& l) {
  FUZZ_CHECK(l.tile >= 1 && l.q_len >= 0 && l.k_len >= 0);
  CheckCsr(l.row_ptr, l.col_idx, l.mask.size(), l.num_q_tiles(), l.num_k_tiles());
}

// Admits(p, j): the token-level rule of a non-dilated spec over one span's positions.
bool Admits(const AttentionSpec& spec, int64_t nb, int64_t p, int64_t j) {
  if (spec.causal && j > p) return false;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) {
    return p - j <= w->size && j - p <= w->size;
  }
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    return ReferenceBlockKept(*bs, nb, p / bs->block_size, j / bs->block_size);
  }
  return true;
}

void CheckAgainstRule(const PairMap& map, const AttentionSpec& spec, int64_t nb) {
  for (int64_t p = map.q0; p < map.q0 + map.q_len; ++p) {
    for (int64_t j = map.k0; j < map.k0 + map.k_len; ++j) {
      const bool want = Admits(spec, nb, p, j);
      FUZZ_CHECK(map.Get(p, j) == want, "query ", p, ", key ", j, ": layout ",
                 map.Get(p, j) ? "admits" : "skips", " it, the rule ", want ? "admits" : "skips",
                 " it (", std::string(PatternName(spec.pattern)), spec.causal ? ", causal" : "", ")");
    }
  }
}

// A square BlockLayout: structure, pair count, the rule, and slices of it.
void CheckBlockLayout(const BlockLayout& l, const AttentionSpec& spec, FuzzedDataProvider& p) {
  FUZZ_CHECK(l.block_size >= 1 && l.num_blocks == NumBlocks(l.seq_len, l.block_size));
  CheckCsr(l.row_ptr, l.col_idx, l.mask.size(), l.num_blocks, l.num_blocks);
  FUZZ_CHECK(l.sparsity() >= 0.0 && l.sparsity() <= 1.0);
  if (!Small(l.seq_len, l.seq_len)) return;
  RectLayout whole = *SliceBlockLayout(l, 0, l.seq_len, 0, l.seq_len);
  PairMap map(0, l.seq_len, 0, l.seq_len);
  MarkRect(whole, map);
  FUZZ_CHECK(map.Count() == l.AdmittedPairs(), "AdmittedPairs ", l.AdmittedPairs(), ", counted ",
             map.Count());
  if (!std::holds_alternative<DilatedSpec>(spec.pattern)) {
    CheckAgainstRule(map, spec, l.num_blocks);
  }
  // A block-aligned slice holds exactly the layout's pairs in its rectangle.
  // A range starts on a block boundary (at most the last block's) and ends on one or at seq_len.
  const auto begin = [&] {
    return p.ConsumeIntegralInRange<int64_t>(0, l.num_blocks - 1) * l.block_size;
  };
  const auto end = [&](int64_t b) {
    const int64_t blk = p.ConsumeIntegralInRange<int64_t>(b / l.block_size, l.num_blocks);
    return std::min(blk * l.block_size, l.seq_len);
  };
  const int64_t qb = begin(), qe = end(qb), kb = begin(), ke = end(kb);
  absl::StatusOr<RectLayout> slice = SliceBlockLayout(l, qb, qe, kb, ke);
  FUZZ_CHECK(slice.ok(), slice.status().ToString());
  CheckRect(*slice);
  PairMap part(qb, qe - qb, kb, ke - kb);
  MarkRect(*slice, part);
  FUZZ_CHECK(part.Count() == slice->AdmittedPairs());
  for (int64_t q = qb; q < qe; ++q) {
    for (int64_t k = kb; k < ke; ++k) FUZZ_CHECK(part.Get(q, k) == map.Get(q, k));
  }
  // Misaligned ranges are refused, not sliced.
  if (l.block_size > 1 && l.seq_len > l.block_size) {
    FUZZ_CHECK(!SliceBlockLayout(l, 1, l.seq_len, 0, l.seq_len).ok());
  }
}

void CheckDilatedPlan(const DilatedPlan& plan, const DilatedSpec& d, int64_t n, int64_t heads) {
  FUZZ_CHECK(plan.branches.size() == d.segment_lengths.size());
  for (size_t b = 0; b < plan.branches.size(); ++b) {
    const DilatedBranch& br = plan.branches[b];
    const int64_t w = br.segment_length, r = br.rate;
    FUZZ_CHECK(static_cast<int64_t>(br.groups.size()) == std::min(r, heads));
    for (const DilatedGroup& g : br.groups) {
      FUZZ_CHECK(static_cast<int64_t>(g.seg_start.size()) == CeilDiv(n, w) + 1);
      size_t next = 0;
      for (int64_t x = 0; x < n; ++x) {
        if (x % w == 0) {
          FUZZ_CHECK(g.seg_start[x / w] == static_cast<int64_t>(next), "segment ", x / w);
        }
        if (!InDilatedSet(x, w, r, g.offset)) continue;
        FUZZ_CHECK(next < g.positions.size() && g.positions[next] == x, "position ", x,
                   " missing from branch ", b, " offset ", g.offset);
        ++next;
      }
      FUZZ_CHECK(next == g.positions.size() && g.seg_start.back() == static_cast<int64_t>(next));
    }
  }
}

void CheckDilatedSpan(const QuerySpan& span, const DilatedSpec& d, const AttentionSpec& spec,
                      int64_t heads, int32_t tile) {
  FUZZ_CHECK(span.k_pos == 0, "a dilated span with keys at an offset");
  for (size_t b = 0; b < d.segment_lengths.size(); ++b) {
    const int64_t w = d.segment_lengths[b], r = d.dilation_rates[b];
    for (int64_t o = 0; o < std::min(r, heads); ++o) {
      // The heads of offset o: every h < heads with h % r == o, ascending (no step past int64).
      const std::vector<int64_t> group_heads = DilatedGroupHeads(heads, r, o);
      FUZZ_CHECK(!group_heads.empty() && group_heads.front() == o, "heads of offset ", o);
      for (size_t i = 0; i < group_heads.size(); ++i) {
        FUZZ_CHECK(group_heads[i] < heads && group_heads[i] % r == o &&
                   (i == 0 || group_heads[i] > group_heads[i - 1]));
      }
      FUZZ_CHECK(heads - group_heads.back() <= r, "a head of offset ", o, " missing at the end");
      const DilatedSpanGroup g = BuildDilatedSpanGroup(span, w, r, o);
      std::vector<int64_t> want_q, want_k;
      for (int64_t x = 0; x < span.q_len; ++x) {
        if (InDilatedSet(span.q_pos + x, w, r, o)) want_q.push_back(x);
      }
      FUZZ_CHECK(g.q_rows == want_q, "query rows of branch ", b, " offset ", o);
      if (want_q.empty()) {
        FUZZ_CHECK(g.k_rows.empty());
        continue;
      }
      for (int64_t j = 0; j < span.k_len; ++j) {
        if (InDilatedSet(j, w, r, o)) want_k.push_back(j);
      }
      FUZZ_CHECK(g.k_rows == want_k, "key rows of branch ", b, " offset ", o);
      const int64_t nq = static_cast<int64_t>(g.q_rows.size());
      const int64_t nk = static_cast<int64_t>(g.k_rows.size());
      if (CeilDiv(nq, tile) > kMaxTiles / std::max<int64_t>(1, CeilDiv(nk, tile))) continue;
      const RectLayout l = DilatedGroupLayout(g, spec.causal, tile);
      CheckRect(l);
      if (!Small(nq, nk)) continue;
      PairMap map(g.q_index0, nq, 0, nk);
      MarkRect(l, map);
      FUZZ_CHECK(map.Count() == l.AdmittedPairs());
      for (int64_t a = 0; a < nq; ++a) {
        const int64_t qp = span.q_pos + g.q_rows[a];
        for (int64_t k = 0; k < nk; ++k) {
          const int64_t kp = g.k_rows[k];
          const bool want = qp / w == kp / w && (!spec.causal || kp <= qp);
          FUZZ_CHECK(map.Get(g.q_index0 + a, k) == want, "dilated branch ", b, " offset ", o,
                     ": query position ", qp, ", key position ", kp);
        }
      }
    }
  }
}

// The rectangles of a validated request: spans tile the query rows, and each span's pieces
// together admit exactly the rule's pairs.
void CheckSpans(const AttentionSpec& spec, const AttentionShape& shape,
                const CompileOptions& options) {
  const std::vector<QuerySpan> spans = RequestSpans(spec, shape);
  int64_t next_row = 0;
  for (const QuerySpan& s : spans) {
    FUZZ_CHECK(s.q_row >= next_row && s.q_len >= 1 && s.q_row + s.q_len <= shape.tokens);
    FUZZ_CHECK(s.k_row >= 0 && s.k_len >= 0 && s.k_row + s.k_len <= shape.kv_len());
    FUZZ_CHECK(s.q_pos >= 0 && s.q_pos <= s.k_pos + s.k_len + (IsKeyShard(spec) ? spec.kv_total : 0));
    next_row = s.q_row + s.q_len;
    if (const auto* d = std::get_if<DilatedSpec>(&spec.pattern)) {
      CheckDilatedSpan(s, *d, spec, shape.q_heads, options.block_size);
      continue;
    }
    const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern);
    const int64_t tile = bs ? bs->block_size : options.block_size;
    if (CeilDiv(s.q_len, tile) > kMaxTiles / std::max<int64_t>(1, CeilDiv(s.k_len, tile))) continue;
    absl::StatusOr<std::vector<RectLayout>> pieces = SpanLayouts(spec, s, options);
    if (!pieces.ok()) {
      FUZZ_CHECK(pieces.status().code() == absl::StatusCode::kResourceExhausted,
                 "SpanLayouts refused a validated spec: ", pieces.status().ToString());
      continue;
    }
    if (!Small(s.q_len, s.k_len)) {
      for (const RectLayout& l : *pieces) CheckRect(l);
      continue;
    }
    PairMap map(s.q_pos, s.q_len, s.k_pos, s.k_len);
    int64_t pairs = 0;
    for (const RectLayout& l : *pieces) {
      CheckRect(l);
      FUZZ_CHECK(l.kept_tiles() > 0, "an empty piece was returned");
      MarkRect(l, map);
      pairs += l.AdmittedPairs();
    }
    FUZZ_CHECK(pairs == map.Count(), "AdmittedPairs ", pairs, ", counted ", map.Count());
    const int64_t nb = bs ? NumBlocks(s.extent(), bs->block_size) : 0;
    CheckAgainstRule(map, spec, nb);
  }
}

AttentionShape FuzzShape(FuzzedDataProvider& p, bool huge) {
  AttentionShape s;
  if (huge) {  // validation only: overflow checks
    s.batch = fuzz::FuzzInt(p, 4);
    s.tokens = fuzz::FuzzInt(p, kMaxTokens);
    s.kv_tokens = fuzz::FuzzInt(p, kMaxTokens);
    s.q_heads = fuzz::FuzzInt(p, 8);
    s.kv_heads = fuzz::FuzzInt(p, 8);
    s.head_dim = fuzz::FuzzInt(p, 300);
    return s;
  }
  s.batch = p.ConsumeIntegralInRange<int64_t>(0, 2);
  s.tokens = p.ConsumeIntegralInRange<int64_t>(0, kMaxTokens);
  s.kv_tokens = p.ConsumeBool() ? 0 : p.ConsumeIntegralInRange<int64_t>(-1, kMaxTokens);
  s.kv_heads = p.ConsumeIntegralInRange<int64_t>(0, 3);
  s.q_heads = s.kv_heads * p.ConsumeIntegralInRange<int64_t>(1, 3) +
              (p.ConsumeIntegralInRange<int>(0, 15) == 0 ? 1 : 0);
  s.head_dim = p.ConsumeIntegralInRange<int64_t>(0, 300);
  return s;
}

AttentionSpec FuzzSpec(FuzzedDataProvider& p, const AttentionShape& shape) {
  // Clamped so that the arithmetic below cannot overflow on a huge (validation-only) shape.
  const int64_t kv = std::clamp<int64_t>(shape.kv_len(), 0, 4 * kMaxTokens);
  const int64_t tokens = std::clamp<int64_t>(shape.tokens, 0, 4 * kMaxTokens);
  AttentionSpec spec;
  spec.pattern = fuzz::FuzzPattern(p, std::min<int64_t>(kv + tokens, 2 * kMaxTokens));
  spec.causal = p.ConsumeBool();
  spec.scale = fuzz::FuzzScale(p);
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      spec.q_offset = kv - tokens;  // bottom-right: decode, chunked prefill
      break;
    case 1:
      spec.q_offset = fuzz::FuzzInt(p, kv);
      break;
    default:
      break;
  }
  if (p.ConsumeIntegralInRange<int>(0, 3) == 0) {  // keys that are one shard of a longer sequence
    spec.kv_total = p.ConsumeBool() ? kv + p.ConsumeIntegralInRange<int64_t>(0, kMaxTokens)
                                    : fuzz::FuzzInt(p, 2 * kMaxTokens);
    spec.k_offset = p.ConsumeBool() ? p.ConsumeIntegralInRange<int64_t>(0, kMaxTokens)
                                    : fuzz::FuzzInt(p, kMaxTokens);
    if (p.ConsumeBool()) spec.q_offset = fuzz::FuzzInt(p, spec.kv_total);
  }
  if (p.ConsumeIntegralInRange<int>(0, 3) == 0) {  // packed sequences
    const int parts = p.ConsumeIntegralInRange<int>(1, 6);
    spec.cu_seqlens_q = fuzz::FuzzCuSeqlens(p, parts, tokens);
    spec.cu_seqlens_k = fuzz::FuzzCuSeqlens(p, parts, kv);
  }
  return spec;
}

void FuzzOne(FuzzedDataProvider& p) {
  const bool huge = p.ConsumeIntegralInRange<int>(0, 31) == 0;
  const AttentionShape shape = FuzzShape(p, huge);
  const AttentionSpec spec = FuzzSpec(p, shape);
  CompileOptions options;
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      options.block_size = p.ConsumeIntegralInRange<int32_t>(1, 256);
      break;
    case 1:
      options.block_size = 64;
      break;
    default:
      options.block_size = 128;
      break;
  }
  options.max_kept_blocks = kMaxKeptBlocks;

  const absl::Status valid = ValidateSpec(spec, shape);
  if (!valid.ok()) {
    FUZZ_CHECK(valid.code() == absl::StatusCode::kInvalidArgument ||
                   valid.code() == absl::StatusCode::kUnimplemented,
               valid.ToString());
    FUZZ_CHECK(!valid.message().empty());
    return;
  }
  FUZZ_CHECK(ValidateShape(shape).ok());
  if (shape.tokens > kMaxTokens || shape.kv_len() > kMaxTokens) return;
  const int64_t extent = PatternExtent(spec, shape);
  FUZZ_CHECK(extent >= 1);

  if (IsSquare(spec, shape)) {
    // The square path: what CompilePattern builds, which also re-validates.
    absl::StatusOr<CompiledPattern> compiled =
        CompilePattern(spec, shape.tokens, shape.q_heads, options);
    if (compiled.ok()) {
      const auto* d = std::get_if<DilatedSpec>(&spec.pattern);
      if (d == nullptr) {
        FUZZ_CHECK(compiled->layout.seq_len == shape.tokens);
        CheckBlockLayout(compiled->layout, spec, p);
      } else {
        FUZZ_CHECK(compiled->dilated.has_value());
        CheckDilatedPlan(*compiled->dilated, *d, shape.tokens, shape.q_heads);
      }
    } else {
      FUZZ_CHECK(compiled.status().code() == absl::StatusCode::kResourceExhausted,
                 "CompilePattern refused a validated spec: ", compiled.status().ToString());
    }
  }
  CheckSpans(spec, shape, options);
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider provider(data, size);
  attnserve::FuzzOne(provider);
  return 0;
}
