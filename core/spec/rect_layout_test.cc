#include "core/spec/rect_layout.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

// Admitted pairs of a square layout inside [q0, q1) x [k0, k1), token by token.
int64_t BruteForcePairs(const BlockLayout& l, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < l.num_blocks; ++i) {
    for (int64_t e = l.row_ptr[i]; e < l.row_ptr[i + 1]; ++e) {
      const int64_t j = l.col_idx[e];
      for (int64_t q = i * l.block_size; q < std::min((i + 1) * l.block_size, l.seq_len); ++q) {
        for (int64_t k = j * l.block_size; k < std::min((j + 1) * l.block_size, l.seq_len); ++k) {
          if (q < q0 || q >= q1 || k < k0 || k >= k1) continue;
          bool ok = true;
          if (l.mask[e] == BlockMask::kCausalDiagonal) ok = k <= q;
          if (l.mask[e] == BlockMask::kPartial) ok = l.rule.Admits(q, k);
          pairs += ok;
        }
      }
    }
  }
  return pairs;
}

TEST(SliceBlockLayoutTest, PiecesMatchTheGlobalLayout) {
  for (bool causal : {false, true}) {
    AttentionSpec spec;
    spec.pattern = BlockSparseSpec{64, StridedGen{3, 1}};
    spec.causal = causal;
    const int64_t n = 64 * 9 + 20;  // ragged last block
    const BlockLayout global = CompileBlockLayout(spec, n).value();
    const std::vector<int64_t> cuts = {0, 128, 320, 448, n};
    int64_t total = 0;
    for (size_t a = 0; a + 1 < cuts.size(); ++a) {
      for (size_t b = 0; b + 1 < cuts.size(); ++b) {
        auto piece = SliceBlockLayout(global, cuts[a], cuts[a + 1], cuts[b], cuts[b + 1]);
        ASSERT_TRUE(piece.ok()) << piece.status();
        const int64_t expected =
            BruteForcePairs(global, cuts[a], cuts[a + 1], cuts[b], cuts[b + 1]);
        EXPECT_EQ(piece->AdmittedPairs(), expected) << a << "," << b;
        total += piece->AdmittedPairs();
      }
    }
    EXPECT_EQ(total, global.AdmittedPairs());
  }
}

TEST(SliceBlockLayoutTest, RejectsUnalignedRanges) {
  AttentionSpec spec;
  spec.pattern = BlockSparseSpec{64, LocalWindowGen{1}};
  const BlockLayout global = CompileBlockLayout(spec, 300).value();
  EXPECT_EQ(SliceBlockLayout(global, 10, 64, 0, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceBlockLayout(global, 0, 100, 0, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceBlockLayout(global, 0, 64, 256, 301).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SliceBlockLayout(global, 256, 300, 0, 300).ok());
}

TEST(RectLayoutFromRuleTest, AdmittedPairsMatchTheRule) {
  const std::vector<int64_t> segments = {0, 7, 19, 20, 45, 61};
  std::vector<IntervalRule> rules(5);
  rules[1].causal = true;
  rules[2].window = 5;
  rules[3].causal = true;
  rules[3].window = 9;
  rules[4].causal = true;
  rules[4].segment_starts = &segments;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 13}, {13, 30}, {30, 61}, {5, 6}};
  for (size_t r = 0; r < rules.size(); ++r) {
    for (auto [q0, q1] : ranges) {
      for (auto [k0, k1] : ranges) {
        for (int32_t tile : {1, 4, 16}) {
          const RectLayout l = RectLayoutFromRule(rules[r], q0, q1, k0, k1, tile);
          int64_t expected = 0;
          for (int64_t q = q0; q < q1; ++q) {
            for (int64_t k = k0; k < k1; ++k) expected += rules[r].Admits(q, k);
          }
          EXPECT_EQ(l.AdmittedPairs(), expected) << r << " " << q0 << " " << k0 << " " << tile;
          if (expected == 0) {
            EXPECT_EQ(l.kept_tiles(), 0);
          }
          // A kFull tile admits every pair.
          for (int64_t qt = 0; qt < l.num_q_tiles(); ++qt) {
            for (int64_t e = l.row_ptr[qt]; e < l.row_ptr[qt + 1]; ++e) {
              if (l.mask[e] != BlockMask::kFull) continue;
              for (int64_t q = q0 + qt * tile; q < std::min(q0 + (qt + 1) * tile, q1); ++q) {
                for (int64_t k = k0 + l.col_idx[e] * tile;
                     k < std::min(k0 + (l.col_idx[e] + 1) * tile, k1); ++k) {
                  ASSERT_TRUE(rules[r].Admits(q, k));
                }
              }
            }
          }
        }
      }
    }
  }
}

// Positions next to INT64_MAX (and windows up to it): "no bound" is the type's extreme, so the
// layout keeps exactly the pairs the rule admits there too (a stand-in of INT64_MAX / 4 for "no
// bound" dropped every key past it). The count below is written from the definition, not Admits.
TEST(RectLayoutFromRuleTest, PositionsNearInt64MaxKeepTheirKeys) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const int64_t base : {(int64_t{1} << 61) + 3, kMax - 100}) {
    for (const bool causal : {false, true}) {
      for (const std::optional<int64_t> window : {std::optional<int64_t>{}, std::optional{int64_t{5}},
                                                  std::optional{kMax}}) {
        IntervalRule rule;
        rule.causal = causal;
        rule.window = window;
        const int64_t q0 = base, q1 = base + 13, k0 = base - 10, k1 = base + 20;
        const RectLayout l = RectLayoutFromRule(rule, q0, q1, k0, k1, 4);
        int64_t expected = 0;
        for (int64_t q = q0; q < q1; ++q) {
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t d = q > k ? q - k : k - q;  // operands within 30 of each other
            expected += (!causal || k <= q) && (!window || d <= *window);
          }
        }
        EXPECT_EQ(l.AdmittedPairs(), expected)
            << base << (causal ? " causal" : "") << " window " << window.value_or(-1);
      }
    }
  }
}

}  // namespace
}  // namespace attnserve
