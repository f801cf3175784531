// The CUDA ring's plan over the shared ring schedule, checked on the host: every admitted
// (query, key) pair of the global computation is covered exactly once across ranks and ticks,
// pieces are classified as the kernel expects, sources rotate as the transfers do, and the memory
// budget picks the schedule. ring_schedule_test.cc executes the schedule itself on the CPU.
#include "core/parallel/ring_cuda_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/spec/pattern_compiler.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

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
      const RingTick& tick = plan->rank_ticks[p][t];
      EXPECT_EQ(tick.source, ((p - t) % ranks + ranks) % ranks);
      if (t > 0) {
        EXPECT_EQ(tick.source, plan->rank_ticks[(p - 1 + ranks) % ranks][t - 1].source);
      }
      ++seen[tick.source];
      for (const RingPiece& piece : step.pieces) {
        EXPECT_EQ(owner[piece.q.begin], p);
        EXPECT_EQ(owner[piece.k.begin], tick.source);
        EXPECT_EQ(LocalRow(plan->split[p], piece.q.begin), piece.q_row);
        EXPECT_EQ(LocalRow(plan->split[tick.source], piece.k.begin), piece.k_row);
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
          // The kernels add the window to position differences: never more than the sequence.
          EXPECT_LE(piece.layout.rule.window.value_or(0), n);
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
        CheckPlan(testing::DenseCase(causal), n, ranks, 64);
        CheckPlan(testing::DenseCase(causal), n, ranks, 128);
        CheckPlan(testing::WindowCase(70, causal), n, ranks, 64);
        CheckPlan(testing::WindowCase(3, causal), n, ranks, 128);
        // A caller's "unlimited" window: the pairs of dense.
        CheckPlan(testing::WindowCase(std::numeric_limits<int64_t>::max(), causal), n, ranks, 64);
        CheckPlan(testing::SparseCase(64, LocalWindowGen{1}, causal), n, ranks, 64);
      }
    }
  }
}

TEST(RingCudaPlanTest, CausalDenseIsBalancedAndUsesImplicitPieces) {
  // Zigzag over 2 ranks, n = 8 blocks: each rank admits the same pairs, and dense causal
  // pieces are full, diagonal or skipped: no layout needed.
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(testing::DenseCase(true), 8 * 128, 2);
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

TEST(RingCudaPlanTest, LeanPlanCoversEveryPairOnce) {
  for (int ranks : {1, 2, 3}) {
    for (bool causal : {false, true}) {
      for (auto [qc, c] : std::vector<std::pair<int, int>>{{2, 2}, {4, 8}, {2, 4}}) {
        RingCudaPlanOptions o;
        o.block_size = 64;
        o.q_chunks = qc;
        o.kv_pieces = c;
        for (const AttentionSpec& spec :
             {testing::DenseCase(causal), testing::WindowCase(70, causal),
              testing::SparseCase(64, LocalWindowGen{1}, causal)}) {
          absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(spec, 1100, ranks, o);
          ASSERT_TRUE(plan.ok()) << plan.status();
          ASSERT_EQ(plan->steps[0].size(), static_cast<size_t>(qc * ranks * c));
          int64_t total = 0;
          for (int p = 0; p < ranks; ++p) total += plan->admitted_pairs[p];
          EXPECT_EQ(total, GlobalPairs(spec, 1100));
        }
      }
    }
  }
}

TEST(RingCudaPlanTest, ZigzagNeedsEvenPieces) {
  RingCudaPlanOptions o;
  o.q_chunks = 2;
  o.kv_pieces = 3;
  EXPECT_EQ(PlanRingCuda(testing::DenseCase(true), 4096, 2, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RingCudaPlanTest, BudgetPicksTheFastestFittingSchedule) {
  // The case: dense causal bf16, D = 128, 8 heads, 2 ranks. One unit = one bf16 tensor of
  // N/P tokens.
  const int64_t n = 1 << 20;
  const AttentionShape shape{1, n, 8, 8, 128};
  const int64_t unit = (n / 2) * 8 * 128 * 2;
  RingCudaPlanOptions o;
  absl::StatusOr<RingCudaPlan> free_plan =
      PlanRingCuda(testing::DenseCase(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(free_plan.ok()) << free_plan.status();
  EXPECT_EQ(free_plan->q_chunks, 1);
  EXPECT_EQ(free_plan->kv_pieces, 1);
  const int64_t need11 = EstimateRingRankBytes(*free_plan, 0, shape, DType::kBF16);
  // Q, O, K/V home + 1 rotating (P = 2), f32 O (2 units), LSE.
  EXPECT_GE(need11, 8 * unit);
  EXPECT_LE(need11, 8 * unit + unit / 8);
  // The candidate estimate leaves out the layouts' exact sizes: a lower bound within 1 MiB here.
  EXPECT_LE(EstimateRingRankBytes(*free_plan, shape, DType::kBF16, 1, 1), need11);
  EXPECT_GE(EstimateRingRankBytes(*free_plan, shape, DType::kBF16, 1, 1), need11 - (1 << 20));
  // (16, 16): Q 1 + O 1 + f32 chunk 2/16 + K/V 2*17/16 + LSE.
  const int64_t need16 = EstimateRingRankBytes(*free_plan, shape, DType::kBF16, 16, 16);
  EXPECT_LE(need16, static_cast<int64_t>(4.3 * unit));
  EXPECT_GE(need16, static_cast<int64_t>(4.25 * unit));

  o.device_memory_budget = need11;
  absl::StatusOr<RingCudaPlan> p =
      PlanRingCuda(testing::DenseCase(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->q_chunks * p->kv_pieces, 1);
  o.device_memory_budget = need11 - 1;
  p = PlanRingCuda(testing::DenseCase(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->q_chunks * p->kv_pieces, 1);
  EXPECT_LE(EstimateRingRankBytes(*p, 0, shape, DType::kBF16), o.device_memory_budget);
  o.device_memory_budget = static_cast<int64_t>(4.4 * unit);
  p = PlanRingCuda(testing::DenseCase(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->q_chunks, 1);
  EXPECT_EQ(p->kv_pieces % 2, 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(EstimateRingRankBytes(*p, r, shape, DType::kBF16), o.device_memory_budget);
  }
  o.device_memory_budget = 4 * unit;  // below Q + O + K/V: nothing fits
  p = PlanRingCuda(testing::DenseCase(true), shape, DType::kBF16, 2, o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("device_memory_budget"), std::string::npos);
  // Forced counts ignore the budget.
  o.q_chunks = 2;
  o.kv_pieces = 2;
  p = PlanRingCuda(testing::DenseCase(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->q_chunks, 2);
}

// The planner's figure is the run's own: the largest rank's buffer table of the plan the run
// would choose (f32 inputs compute in bf16), and the shard-local bytes for dilated specs.
TEST(RingCudaPlanTest, BytesPerRankIsThePlansEstimate) {
  const AttentionShape shape{2, 5000, 8, 2, 128};
  for (bool causal : {false, true}) {
    absl::StatusOr<RingCudaPlan> plan =
        PlanRingCuda(testing::DenseCase(causal), shape, DType::kBF16, 3);
    ASSERT_TRUE(plan.ok()) << plan.status();
    int64_t need = 0;
    for (int p = 0; p < 3; ++p) {
      const int64_t est = EstimateRingRankBytes(*plan, p, shape, DType::kBF16);
      EXPECT_EQ(est, RingRankBufferTable(*plan, p, shape, DType::kBF16).RoundedTotal());
      need = std::max(need, est);
    }
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      absl::StatusOr<int64_t> per_rank =
          EstimateRingCudaBytesPerRank(testing::DenseCase(causal), shape, dtype, 3);
      ASSERT_TRUE(per_rank.ok()) << per_rank.status();
      EXPECT_EQ(*per_rank, need);
    }
  }
  AttentionSpec dil;
  dil.pattern = DilatedSpec{{1000}, {2}};
  absl::StatusOr<int64_t> d = EstimateRingCudaBytesPerRank(dil, shape, DType::kBF16, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::vector<std::vector<TokenRange>>> split =
      SplitDilatedForRingCuda(dil, shape.tokens, 2);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(*d, std::max(EstimateDilatedRankBytes((*split)[0], shape, DType::kBF16),
                         EstimateDilatedRankBytes((*split)[1], shape, DType::kBF16)));
  EXPECT_EQ(EstimateRingCudaBytesPerRank(dil, shape, DType::kBF16, 8).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Mirrored zigzag query chunks: at every tick of every chunk phase the ranks' causal work is about
// equal (what keeps the lockstep ticks from waiting on one rank).
TEST(RingCudaPlanTest, MirroredChunksBalancePhases) {
  RingCudaPlanOptions o;
  o.q_chunks = 8;
  o.kv_pieces = 8;
  const int P = 2;
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(testing::DenseCase(true), 1 << 16, P, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t period = P * o.kv_pieces;
  int64_t lockstep = 0, rank0 = 0;
  for (int qi = 0; qi < o.q_chunks; ++qi) {
    std::vector<int64_t> work(P, 0);
    for (int p = 0; p < P; ++p) {
      for (int64_t t = qi * period; t < (qi + 1) * period; ++t) {
        for (const RingPiece& piece : plan->steps[p][t].pieces) work[p] += piece.admitted_pairs;
      }
    }
    EXPECT_NEAR(static_cast<double>(work[0]) / work[1], 1.0, 0.02) << "chunk " << qi;
    lockstep += std::max(work[0], work[1]);
    rank0 += work[0];
  }
  EXPECT_LE(lockstep, rank0 * 1.02);
}

}  // namespace
}  // namespace attnserve
