#include "core/spec/rect_pattern.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

// Token pairs (query position, key position) a set of pieces admits, from their tiles and masks.
std::vector<std::pair<int64_t, int64_t>> PiecePairs(const std::vector<RectLayout>& pieces) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const RectLayout& l : pieces) {
    for (int64_t qt = 0; qt < l.num_q_tiles(); ++qt) {
      for (int64_t e = l.row_ptr[qt]; e < l.row_ptr[qt + 1]; ++e) {
        for (int64_t x = qt * l.tile; x < std::min((qt + 1) * l.tile, l.q_len); ++x) {
          const int64_t k0 = static_cast<int64_t>(l.col_idx[e]) * l.tile;
          for (int64_t y = k0; y < std::min(k0 + l.tile, l.k_len); ++y) {
            const int64_t p = l.q_begin + x, j = l.k_begin + y;
            bool ok = true;
            if (l.mask[e] == BlockMask::kCausalDiagonal) ok = j <= p;
            if (l.mask[e] == BlockMask::kPartial) ok = l.rule.Admits(p, j);
            if (ok) out.emplace_back(p, j);
          }
        }
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The pairs the square layout over `extent` positions admits for queries [q0, q1), keys [0, nkv).
std::vector<std::pair<int64_t, int64_t>> SquarePairs(const BlockLayout& l, int64_t q0, int64_t q1,
                                                     int64_t nkv) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t p = q0; p < q1; ++p) {
    const int64_t row = p / l.block_size;
    for (int64_t e = l.row_ptr[row]; e < l.row_ptr[row + 1]; ++e) {
      const int64_t c = l.col_idx[e];
      for (int64_t j = c * l.block_size; j < std::min((c + 1) * l.block_size, nkv); ++j) {
        bool ok = true;
        if (l.mask[e] == BlockMask::kCausalDiagonal) ok = j <= p;
        if (l.mask[e] == BlockMask::kPartial) ok = l.rule.Admits(p, j);
        if (ok) out.emplace_back(p, j);
      }
    }
  }
  return out;
}

// A non-square span admits exactly the pairs of the square problem over its extent restricted to
// its queries and existing keys, for every kind the square compiler handles, at unaligned
// offsets; block_sparse query tiles never straddle a block.
TEST(SpanLayoutsTest, PairsAreTheSquareLayoutsRestricted) {
  const std::vector<AttentionPattern> patterns = {
      DenseSpec{},
      WindowSpec{9},
      WindowSpec{int64_t{1} << 62},
      BlockSparseSpec{64, LocalWindowGen{1}},
      BlockSparseSpec{64, DilatedSparseGen{{2, 3}}},
      BlockSparseSpec{64, GlobalLocalGen{1, 0}},
      BlockSparseSpec{64, StridedGen{2, 0}},
      BlockSparseSpec{64, RandomGen{0.5, 99}},
  };
  // (queries, offset, keys): decode, unaligned chunk, queries past the keys, one block exactly.
  const std::vector<std::vector<int64_t>> spans = {
      {1, 299, 300}, {90, 37, 200}, {150, 100, 100}, {64, 64, 128}, {20, 3, 10}};
  for (const AttentionPattern& pattern : patterns) {
    for (bool causal : {false, true}) {
      for (const auto& v : spans) {
        const QuerySpan span{0, v[0], v[1], 0, v[2]};
        SCOPED_TRACE(std::string(PatternName(pattern)) + (causal ? " causal " : " ") +
                     std::to_string(v[0]) + "@" + std::to_string(v[1]) + " x " +
                     std::to_string(v[2]));
        AttentionSpec spec;
        spec.pattern = pattern;
        spec.causal = causal;
        CompileOptions options;
        options.block_size = 32;
        auto pieces = SpanLayouts(spec, span, options);
        ASSERT_TRUE(pieces.ok()) << pieces.status();
        auto square = CompileBlockLayout(spec, span.extent(), options);
        ASSERT_TRUE(square.ok()) << square.status();
        EXPECT_EQ(PiecePairs(*pieces),
                  SquarePairs(*square, span.q_pos, span.q_pos + span.q_len, span.k_len));
        for (const RectLayout& l : *pieces) {
          EXPECT_EQ(l.k_begin, 0);
          if (std::holds_alternative<BlockSparseSpec>(pattern)) {
            const bool aligned = l.q_begin % l.tile == 0;
            EXPECT_TRUE(aligned || l.q_begin / l.tile == (l.q_begin + l.q_len - 1) / l.tile)
                << "piece at " << l.q_begin << " of " << l.q_len;
          }
        }
      }
    }
  }
}

TEST(SpanLayoutsTest, KeptBlockLimitAndDilatedAreRefused) {
  AttentionSpec spec;
  spec.pattern = BlockSparseSpec{64, LocalWindowGen{100}};
  CompileOptions options;
  options.max_kept_blocks = 10;
  const QuerySpan span{0, 500, 100, 0, 600};
  EXPECT_EQ(SpanLayouts(spec, span, options).status().code(),
            absl::StatusCode::kResourceExhausted);
  options.max_kept_blocks = 1000;
  EXPECT_TRUE(SpanLayouts(spec, span, options).ok());
  spec.pattern = DilatedSpec{{64}, {1}};
  EXPECT_EQ(SpanLayouts(spec, span).status().code(), absl::StatusCode::kInvalidArgument);
}

// The gathered group admits (query, key) exactly when both positions are in the set, in one
// segment, and (causal) key <= query, with keys below k_len only.
TEST(DilatedSpanGroupTest, GatheredPairsFollowThePositionRule) {
  for (const auto& [w, r] : {std::pair<int64_t, int64_t>{8, 1}, {8, 3}, {5, 5}, {1000, 4}}) {
    for (int64_t o = 0; o < r; ++o) {
      for (bool causal : {false, true}) {
        for (const auto& v : std::vector<std::vector<int64_t>>{
                 {1, 39, 40}, {25, 13, 50}, {30, 10, 12}, {40, 0, 40}}) {
          const QuerySpan span{5, v[0], v[1], 7, v[2]};
          SCOPED_TRACE(std::to_string(w) + "/" + std::to_string(r) + "/" + std::to_string(o) +
                       (causal ? " causal " : " ") + std::to_string(v[0]) + "@" +
                       std::to_string(v[1]) + " x " + std::to_string(v[2]));
          const DilatedSpanGroup g = BuildDilatedSpanGroup(span, w, r, o);
          const auto in_set = [&](int64_t x) { return x % w - o >= 0 && (x % w - o) % r == 0; };
          std::vector<std::pair<int64_t, int64_t>> expected;
          for (int64_t p = span.q_pos; p < span.q_pos + span.q_len; ++p) {
            for (int64_t j = 0; j < span.k_len; ++j) {
              if (in_set(p) && in_set(j) && p / w == j / w && (!causal || j <= p)) {
                expected.emplace_back(p, j);
              }
            }
          }
          std::vector<std::pair<int64_t, int64_t>> got;
          if (!g.q_rows.empty()) {
            const RectLayout layout = DilatedGroupLayout(g, causal, 4);
            for (const auto& [qi, kj] : PiecePairs({layout})) {
              got.emplace_back(span.q_pos + g.q_rows[qi - g.q_index0], g.k_rows[kj]);
            }
            std::sort(got.begin(), got.end());
          }
          EXPECT_EQ(got, expected);
          for (int64_t x : g.q_rows) EXPECT_TRUE(in_set(span.q_pos + x));
        }
      }
    }
  }
}

// Found by fuzz_spec: with a rate near 2^63 and an offset >= 1, the set position after the
// segment's first lies past int64, and skipping to it overflowed (negative rows came out).
TEST(DilatedSpanGroupTest, HugeRateWithAnOffsetGathersNoPositionPastInt64) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto& [w, r] : {std::pair<int64_t, int64_t>{kMax, kMax}, {kMax, kMax - 1}}) {
    for (int64_t o : {int64_t{1}, int64_t{3}}) {
      // Queries at positions 2..9: in the set only at o (the next one, o + r, is past int64).
      const QuerySpan span{0, 8, 2, 0, 12};
      const DilatedSpanGroup g = BuildDilatedSpanGroup(span, w, r, o);
      const std::vector<int64_t> want_q =
          o >= span.q_pos ? std::vector<int64_t>{o - span.q_pos} : std::vector<int64_t>{};
      EXPECT_EQ(g.q_rows, want_q) << "r = " << r << ", o = " << o;
      if (!want_q.empty()) EXPECT_EQ(g.k_rows, std::vector<int64_t>{o});
    }
  }
}

TEST(RequestSpansTest, OneSpanOrOnePerSequenceWithQueries) {
  AttentionSpec spec;
  spec.q_offset = 5;
  const AttentionShape shape{3, 10, 2, 1, 8, 20};
  const std::vector<QuerySpan> one = RequestSpans(spec, shape);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].q_pos, 5);
  EXPECT_EQ(one[0].q_len, 10);
  EXPECT_EQ(one[0].k_len, 20);
  EXPECT_EQ(one[0].extent(), 20);
  spec.q_offset = 0;
  spec.cu_seqlens_q = {0, 0, 4, 4, 10};
  spec.cu_seqlens_k = {0, 3, 9, 9, 20};
  const std::vector<QuerySpan> spans = RequestSpans(spec, AttentionShape{1, 10, 2, 1, 8, 20});
  ASSERT_EQ(spans.size(), 2u);  // the sequences without queries have nothing to compute
  EXPECT_EQ(spans[0].q_row, 0);
  EXPECT_EQ(spans[0].q_pos, 2);  // 6 keys, 4 queries: bottom-right
  EXPECT_EQ(spans[0].k_row, 3);
  EXPECT_EQ(spans[1].q_row, 4);
  EXPECT_EQ(spans[1].q_pos, 5);
  EXPECT_EQ(spans[1].k_row, 9);
  EXPECT_EQ(spans[1].k_len, 11);
}

TEST(AttentionShapeOfTest, KeysMayHoldAnotherNumberOfTokens) {
  auto q = *HostTensor::Create(DType::kBF16, {2, 7, 4, 16});
  auto k = *HostTensor::Create(DType::kBF16, {2, 30, 2, 16});
  auto shape = AttentionShapeOf(q, k, k);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->tokens, 7);
  EXPECT_EQ(shape->kv_tokens, 30);
  EXPECT_EQ(shape->kv_len(), 30);
  auto same = AttentionShapeOf(q, q, q);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->kv_tokens, 0);  // square shapes read exactly as before
  EXPECT_EQ(same->kv_len(), 7);
  auto other_batch = *HostTensor::Create(DType::kBF16, {1, 7, 2, 16});
  EXPECT_EQ(AttentionShapeOf(q, other_batch, other_batch).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto no_keys = *HostTensor::Create(DType::kBF16, {2, 0, 2, 16});
  EXPECT_EQ(AttentionShapeOf(q, no_keys, no_keys).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve
