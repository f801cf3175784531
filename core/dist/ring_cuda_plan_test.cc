// The CUDA ring's step schedule, checked on the host: every admitted (query, key) pair of the
// global computation is covered exactly once across ranks and steps, pieces are classified as the
// kernel expects, and sources rotate as the transfers do.
#include "core/dist/ring_cuda_plan.h"

#include <cstdint>
#include <vector>

#include "core/spec/pattern_compiler.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

// Admitted pairs of the whole sequence, per (batch, head), counted straight from the rule.
int64_t GlobalPairs(const AttentionSpec& spec, int64_t n) {
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    CompileOptions c;
    c.block_size = bs->block_size;
    return CompileBlockLayout(spec, n, c).value().AdmittedPairs();
  }
  std::optional<int64_t> window;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) window = w->size;
  int64_t pairs = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (spec.causal && j > i) continue;
      if (window && (i - j > *window || j - i > *window)) continue;
      ++pairs;
    }
  }
  return pairs;
}

AttentionSpec Dense(bool causal) {
  AttentionSpec s;
  s.pattern = DenseSpec{};
  s.causal = causal;
  return s;
}
AttentionSpec Window(int64_t w, bool causal) {
  AttentionSpec s;
  s.pattern = WindowSpec{w};
  s.causal = causal;
  return s;
}
AttentionSpec Sparse(bool causal) {
  AttentionSpec s;
  BlockSparseSpec bs;
  bs.block_size = 64;
  bs.generator = LocalWindowGen{1};
  s.pattern = bs;
  s.causal = causal;
  return s;
}

void CheckPlan(const AttentionSpec& spec, int64_t n, int ranks, int32_t block) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " ranks=" << ranks << " causal=" << spec.causal
                                    << " pattern=" << spec.pattern.index());
  RingCudaPlanOptions o;
  o.block_size = block;
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(spec, n, ranks, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->steps.size(), static_cast<size_t>(ranks));
  // Every position is owned by exactly one rank.
  std::vector<int> owner(n, -1);
  for (int p = 0; p < ranks; ++p) {
    int64_t tokens = 0;
    for (const TokenRange& r : plan->split[p]) {
      EXPECT_TRUE(r.begin % plan->block_size == 0 || r.size() == 0);
      for (int64_t i = r.begin; i < r.end; ++i) {
        EXPECT_EQ(owner[i], -1);
        owner[i] = p;
      }
      tokens += r.size();
    }
    EXPECT_EQ(tokens, plan->shard_tokens[p]);
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_NE(owner[i], -1) << i;
  // Sources rotate: rank p at step t reads rank (p - t) mod P, which rank p-1 read at step t-1.
  int64_t total = 0;
  for (int p = 0; p < ranks; ++p) {
    std::vector<int> seen(ranks, 0);
    for (int t = 0; t < ranks; ++t) {
      const RingStep& step = plan->steps[p][t];
      EXPECT_EQ(step.source, ((p - t) % ranks + ranks) % ranks);
      if (t > 0) EXPECT_EQ(step.source, plan->steps[(p - 1 + ranks) % ranks][t - 1].source);
      ++seen[step.source];
      for (const RingPiece& piece : step.pieces) {
        EXPECT_EQ(owner[piece.q.begin], p);
        EXPECT_EQ(owner[piece.k.begin], step.source);
        EXPECT_EQ(LocalRow(plan->split[p], piece.q.begin), piece.q_row);
        EXPECT_EQ(LocalRow(plan->split[step.source], piece.k.begin), piece.k_row);
        EXPECT_GT(piece.admitted_pairs, 0);
        if (piece.kind == RingPieceKind::kFull) {
          EXPECT_EQ(piece.admitted_pairs, piece.q.size() * piece.k.size());
          if (spec.causal) {
            EXPECT_LE(piece.k.end, piece.q.begin + 1);
          }
        } else if (piece.kind == RingPieceKind::kCausalDiagonal) {
          EXPECT_TRUE(spec.causal);
          EXPECT_EQ(piece.q.begin, piece.k.begin);
          EXPECT_EQ(piece.q.end, piece.k.end);
        } else {
          EXPECT_EQ(piece.layout.tile, plan->block_size);
          EXPECT_EQ(piece.layout.q_begin, piece.q.begin);
          EXPECT_EQ(piece.layout.k_begin, piece.k.begin);
          EXPECT_EQ(piece.layout.num_q_tiles(), NumBlocks(piece.q.size(), plan->block_size));
        }
        total += piece.admitted_pairs;
      }
    }
    for (int s = 0; s < ranks; ++s) EXPECT_EQ(seen[s], 1);
  }
  EXPECT_EQ(total, GlobalPairs(spec, n));
}

TEST(RingCudaPlanTest, CoversEveryPairOnce) {
  for (int ranks : {1, 2, 3, 4}) {
    for (int64_t n : {1, 100, 128, 300, 1000, 1100}) {
      for (bool causal : {false, true}) {
        CheckPlan(Dense(causal), n, ranks, 64);
        CheckPlan(Dense(causal), n, ranks, 128);
        CheckPlan(Window(70, causal), n, ranks, 64);
        CheckPlan(Window(3, causal), n, ranks, 128);
        CheckPlan(Sparse(causal), n, ranks, 64);
      }
    }
  }
}

TEST(RingCudaPlanTest, CausalDenseIsBalancedAndUsesImplicitPieces) {
  // Zigzag over 2 ranks, n = 8 blocks: each rank admits the same pairs, and dense causal
  // pieces are full, diagonal or skipped: no layout needed.
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(Dense(true), 8 * 128, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->split_kind, SplitKind::kZigzag);
  EXPECT_EQ(plan->admitted_pairs[0], plan->admitted_pairs[1]);
  for (const auto& steps : plan->steps) {
    for (const RingStep& step : steps) {
      for (const RingPiece& piece : step.pieces) {
        EXPECT_NE(piece.kind, RingPieceKind::kLayout);
      }
    }
  }
}

TEST(RingCudaPlanTest, DilatedIsUnimplemented) {
  AttentionSpec s;
  s.pattern = DilatedSpec{{256}, {1}};
  EXPECT_EQ(PlanRingCuda(s, 1024, 2).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace attnserve
