// The CUDA ring's step schedule, checked on the host: every admitted (query, key) pair of the
// global computation is covered exactly once across ranks and steps, pieces are classified as the
// kernel expects, and sources rotate as the transfers do.
#include "core/dist/ring_cuda_plan.h"

#include <cstdint>
#include <vector>

#include <cmath>
#include <limits>
#include <optional>

#include "core/cpu/cpu_backend.h"
#include "core/reference/reference.h"
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
      if (t > 0) {
        EXPECT_EQ(step.source, plan->steps[(p - 1 + ranks) % ranks][t - 1].source);
      }
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

// ---- Lean schedule: the tick schedule executed for every rank on the CPU -----------------------

// [B, N, H, D] f32 rows of `ranges` concatenated -> [B, rows, H, D].
std::vector<float> GatherRows(const HostTensor& t, const std::vector<TokenRange>& ranges) {
  const int64_t b = t.dims()[0], n = t.dims()[1], row = t.dims()[2] * t.dims()[3];
  int64_t rows = 0;
  for (const TokenRange& r : ranges) rows += r.size();
  std::vector<float> full(t.numel());
  t.ToFloat32(full.data());
  std::vector<float> out(b * rows * row);
  for (int64_t bi = 0; bi < b; ++bi) {
    int64_t local = 0;
    for (const TokenRange& r : ranges) {
      for (int64_t i = r.begin; i < r.end; ++i, ++local) {
        std::copy_n(&full[(bi * n + i) * row], row, &out[(bi * rows + local) * row]);
      }
    }
  }
  return out;
}

// What a slot of the c + 1 slot K/V buffer holds: stream entry m = piece `piece` of rank `src`.
struct Slot {
  int64_t m = -1;  // -1: nothing
  int src = -1, piece = -1;
  std::vector<float> k, v;  // [B, tokens, Hkv, D]
};

// Runs the plan's ticks for all ranks in lockstep, as RingCudaRank::RunTicks does on GPUs: slot of
// X_m = m mod (c + 1) (P = 1: m mod c, no transfers), a transfer on every tick (sends X_k to p+1,
// receives X_{k+c} from p-1), per-chunk f32 accumulators merged piece by piece with the LSE rule
// (the kernel's accumulate epilogue), and the chunk converted into O after its P*c ticks.
void SimulateLean(const AttentionSpec& spec, const AttentionShape& shape, int ranks, int qc, int c,
                  int32_t block, const testing::QkvInputs& in, const ReferenceResult& ref) {
  SCOPED_TRACE(::testing::Message() << "lean sim P=" << ranks << " qc=" << qc << " c=" << c
                                    << " n=" << shape.tokens << " causal=" << spec.causal
                                    << " pattern=" << spec.pattern.index());
  RingCudaPlanOptions o;
  o.block_size = block;
  o.q_chunks = qc;
  o.kv_pieces = c;
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(spec, shape, DType::kBF16, ranks, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->q_chunks, qc);
  ASSERT_EQ(plan->kv_pieces, c);
  const int P = ranks;
  const int64_t b = shape.batch, n = shape.tokens, hq = shape.q_heads, hkv = shape.kv_heads,
                d = shape.head_dim;
  const int64_t T = plan->ticks(), period = static_cast<int64_t>(P) * c;
  const int nslots = P == 1 ? c : c + 1;
  std::vector<HeadPair> heads;
  for (int64_t h = 0; h < hq; ++h) {
    heads.push_back({static_cast<int32_t>(h), static_cast<int32_t>(h / (hq / hkv))});
  }
  IntervalRule rule;
  rule.causal = spec.causal;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) rule.window = w->size;

  // Chunks and pieces tile each shard exactly, on unit boundaries; K/V pieces are consecutive
  // local rows (SetKv copies them as row blocks), query chunks may be mirrored (two runs).
  for (int p = 0; p < P; ++p) {
    for (const auto* cut : {&plan->q_chunk[p], &plan->kv_piece[p]}) {
      const bool kv = cut == &plan->kv_piece[p];
      std::vector<int> cover(n, 0);
      int64_t row = 0, total = 0;
      for (const RingChunk& ch : *cut) {
        if (kv) {
          EXPECT_EQ(ch.row, row);
        }
        int64_t tokens = 0;
        for (const TokenRange& r : ch.ranges) {
          if (kv && r.size() > 0) {
            EXPECT_EQ(LocalRow(plan->split[p], r.begin), row + tokens);
          }
          EXPECT_TRUE(r.begin % plan->block_size == 0 || r.size() == 0);
          for (int64_t i = r.begin; i < r.end; ++i) ++cover[i];
          tokens += r.size();
        }
        if (kv && cut->size() > 1) {
          EXPECT_EQ(ch.ranges.size(), 1u);
        }
        EXPECT_EQ(tokens, ch.tokens);
        row += tokens;
        total += tokens;
      }
      EXPECT_EQ(total, plan->shard_tokens[p]);
      for (const TokenRange& r : plan->split[p]) {
        for (int64_t i = r.begin; i < r.end; ++i) EXPECT_EQ(cover[i], 1) << i;
      }
    }
  }

  // Per rank: Q shard, slots (home pieces in slots 0..c-1), outputs poisoned.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> qshard(P), oshard(P), lshard(P);
  std::vector<std::vector<Slot>> slots(P, std::vector<Slot>(nslots));
  std::vector<std::vector<Slot>> home(P);
  for (int p = 0; p < P; ++p) {
    const int64_t nl = plan->shard_tokens[p];
    qshard[p] = GatherRows(in.q, plan->split[p]);
    oshard[p].assign(b * nl * hq * d, nan);
    lshard[p].assign(b * hq * nl, nan);
    for (int j = 0; j < c; ++j) {
      Slot sl;
      sl.m = j;
      sl.src = p;
      sl.piece = j;
      sl.k = GatherRows(in.k, plan->kv_piece[p][j].ranges);
      sl.v = GatherRows(in.v, plan->kv_piece[p][j].ranges);
      home[p].push_back(sl);
      slots[p][j % nslots] = std::move(sl);
    }
  }
  auto slot_of = [&](int64_t m) { return static_cast<int>(P == 1 ? m % c : m % nslots); };
  auto entry = [&](int p, int64_t m) {  // (source, piece) of X_m of rank p
    const int64_t mm = m % period;
    return std::pair<int, int>{static_cast<int>(((p - mm / c) % P + P) % P),
                               static_cast<int>(mm % c)};
  };
  std::vector<std::vector<float>> acc_o(P), acc_l(P);
  for (int64_t k = 0; k < T; ++k) {
    // Compute: every rank reads X_k from its slot.
    for (int p = 0; p < P; ++p) {
      const RingStep& step = plan->steps[p][k];
      const RingChunk& qch = plan->q_chunk[p][step.q_chunk];
      const int64_t nl = plan->shard_tokens[p], tq = qch.tokens;
      ASSERT_EQ(step.q_chunk, k / period);
      ASSERT_EQ(std::make_pair(step.source, step.kv_piece), entry(p, k));
      const Slot& sl = slots[p][slot_of(k)];
      ASSERT_EQ(sl.m, P == 1 ? k % c : k) << "rank " << p << " tick " << k;
      ASSERT_EQ(sl.src, step.source);
      ASSERT_EQ(sl.piece, step.kv_piece);
      if (k % period == 0) {
        acc_o[p].assign(b * tq * hq * d, 0.f);  // the f32 accumulator holds only this chunk
        acc_l[p].assign(b * hq * tq, -INFINITY);
      }
      // The chunk's query rows, its ranges concatenated (the accumulator's row order).
      std::vector<float> qc_rows(b * tq * hq * d);
      for (int64_t bi = 0; bi < b; ++bi) {
        int64_t acc_row = 0;
        for (const TokenRange& r : qch.ranges) {
          const int64_t row = LocalRow(plan->split[p], r.begin);
          std::copy_n(&qshard[p][(bi * nl + row) * hq * d], r.size() * hq * d,
                      &qc_rows[(bi * tq + acc_row) * hq * d]);
          acc_row += r.size();
        }
      }
      const int64_t ns = plan->kv_piece[step.source][step.kv_piece].tokens;
      for (const RingPiece& piece : step.pieces) {
        ASSERT_EQ(piece.acc_row, LocalRow(qch.ranges, piece.q.begin));
        ASSERT_EQ(piece.q_row, LocalRow(plan->split[p], piece.q.begin));
        ASSERT_LE(piece.acc_row + piece.q.size(), tq);
        ASSERT_LE(piece.k_row + piece.k.size(), ns);
        const RectLayout layout =
            piece.kind == RingPieceKind::kLayout
                ? piece.layout
                : RectLayoutFromRule(rule, piece.q.begin, piece.q.end, piece.k.begin,
                                     piece.k.end, plan->block_size);
        // The piece alone into fresh accumulators, then the LSE merge into the chunk's.
        std::vector<float> po(b * tq * hq * d, 0.f), pl(b * hq * tq, -INFINITY);
        CpuPieceArgs args;
        args.batch = b;
        args.head_dim = d;
        args.q = qc_rows.data();
        args.q_rows = tq;
        args.q_heads = hq;
        args.q_row0 = piece.acc_row;
        args.k = sl.k.data();
        args.v = sl.v.data();
        args.kv_rows = ns;
        args.kv_heads = hkv;
        args.k_row0 = piece.k_row;
        args.heads = heads;
        args.acc_o = po.data();
        args.acc_lse = pl.data();
        ASSERT_TRUE(CpuAttentionPiece(spec, layout, args).ok());
        for (int64_t bi = 0; bi < b; ++bi) {
          for (int64_t h = 0; h < hq; ++h) {
            for (int64_t i = args.q_row0; i < args.q_row0 + piece.q.size(); ++i) {
              float& la = acc_l[p][(bi * hq + h) * tq + i];
              const float lb = pl[(bi * hq + h) * tq + i];
              if (lb == -INFINITY) continue;
              const float mx = std::max(la, lb);
              const float wa = la == -INFINITY ? 0.f : std::exp(la - mx);
              const float wb = std::exp(lb - mx);
              float* oa = &acc_o[p][((bi * tq + i) * hq + h) * d];
              const float* ob = &po[((bi * tq + i) * hq + h) * d];
              for (int64_t x = 0; x < d; ++x) oa[x] = (oa[x] * wa + ob[x] * wb) / (wa + wb);
              la = mx + std::log(wa + wb);
            }
          }
        }
      }
      if ((k + 1) % period == 0) {  // chunk final: f32 accumulator -> O and LSE of the shard
        int64_t acc_row = 0;
        for (const TokenRange& r : qch.ranges) {
          const int64_t row = LocalRow(plan->split[p], r.begin);
          for (int64_t bi = 0; bi < b; ++bi) {
            std::copy_n(&acc_o[p][(bi * tq + acc_row) * hq * d], r.size() * hq * d,
                        &oshard[p][(bi * nl + row) * hq * d]);
            for (int64_t h = 0; h < hq; ++h) {
              std::copy_n(&acc_l[p][(bi * hq + h) * tq + acc_row], r.size(),
                          &lshard[p][(bi * hq + h) * nl + row]);
            }
          }
          acc_row += r.size();
        }
      }
    }
    if (P == 1) continue;
    // Transfer: sends read the sent slots first, then every receive lands.
    std::vector<Slot> sent(P);
    for (int p = 0; p < P; ++p) sent[p] = slots[p][slot_of(k)];
    for (int p = 0; p < P; ++p) {
      Slot& dst = slots[p][slot_of(k + c)];
      ASSERT_NE(slot_of(k + c), slot_of(k));
      // No slot is overwritten while still needed: X_m is read until tick m (compute and send).
      ASSERT_LT(dst.m, k) << "rank " << p << " tick " << k << " overwrites X_" << dst.m;
      const Slot& from = sent[(p - 1 + P) % P];
      ASSERT_EQ(std::make_pair(from.src, from.piece), entry(p, k + c));
      dst = from;
      dst.m = k + c;
    }
  }
  // The home pieces are back (the rotation RingCudaRank::RunTicks records in slot_base_).
  for (int p = 0; p < P; ++p) {
    for (int j = 0; j < c; ++j) {
      const Slot& sl = slots[p][P == 1 ? j : slot_of(T + j)];
      EXPECT_EQ(sl.src, p);
      EXPECT_EQ(sl.piece, j);
      EXPECT_EQ(sl.k, home[p][j].k);
      EXPECT_EQ(sl.v, home[p][j].v);
    }
  }
  // Scatter the shards into poisoned global outputs and compare with the float64 reference.
  HostTensor og_t = testing::PoisonedOutput(shape, DType::kF32);
  HostTensor lse = testing::PoisonedLse(shape);
  float* og = og_t.data_as<float>();
  float* lg = lse.data_as<float>();
  for (int p = 0; p < P; ++p) {
    const int64_t nl = plan->shard_tokens[p];
    int64_t local = 0;
    for (const TokenRange& r : plan->split[p]) {
      for (int64_t i = r.begin; i < r.end; ++i, ++local) {
        for (int64_t bi = 0; bi < b; ++bi) {
          std::copy_n(&oshard[p][(bi * nl + local) * hq * d], hq * d, &og[(bi * n + i) * hq * d]);
          for (int64_t h = 0; h < hq; ++h) {
            lg[(bi * hq + h) * n + i] = lshard[p][(bi * hq + h) * nl + local];
          }
        }
      }
    }
  }
  EXPECT_TRUE(testing::MatchesReference(ref, og_t, &lse, DType::kF32));
}

TEST(RingCudaPlanTest, LeanScheduleSimulationMatchesReference) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const std::vector<std::pair<int, int>> counts = {{1, 1}, {2, 2}, {4, 8}, {1, 2}, {2, 1},
                                                   {3, 2}};
  for (int64_t n : {300, 700}) {
    const AttentionShape shape{2, n, 4, 2, 16};
    const testing::QkvInputs in = testing::MakeRandomInputs(shape, DType::kF32, seed + n);
    for (bool causal : {false, true}) {
      for (const AttentionSpec& spec : {Dense(causal), Window(90, causal), Sparse(causal)}) {
        absl::StatusOr<ReferenceResult> ref = ReferenceAttention(spec, in.q, in.k, in.v);
        ASSERT_TRUE(ref.ok()) << ref.status();
        for (int ranks : {1, 2, 3, 4}) {
          for (auto [qc, c] : counts) {
            if (causal && c % 2 != 0 && c != 1) continue;
            SimulateLean(spec, shape, ranks, qc, c, 64, in, *ref);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(RingCudaPlanTest, LeanPlanCoversEveryPairOnce) {
  for (int ranks : {1, 2, 3}) {
    for (bool causal : {false, true}) {
      for (auto [qc, c] : std::vector<std::pair<int, int>>{{2, 2}, {4, 8}, {2, 4}}) {
        RingCudaPlanOptions o;
        o.block_size = 64;
        o.q_chunks = qc;
        o.kv_pieces = c;
        for (const AttentionSpec& spec : {Dense(causal), Window(70, causal), Sparse(causal)}) {
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
  EXPECT_EQ(PlanRingCuda(Dense(true), 4096, 2, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RingCudaPlanTest, BudgetPicksTheFastestFittingSchedule) {
  // The case: dense causal bf16, D = 128, 8 heads, 2 ranks. One unit = one bf16 tensor of
  // N/P tokens.
  const int64_t n = 1 << 20;
  const AttentionShape shape{1, n, 8, 8, 128};
  const int64_t unit = (n / 2) * 8 * 128 * 2;
  RingCudaPlanOptions o;
  absl::StatusOr<RingCudaPlan> free_plan = PlanRingCuda(Dense(true), shape, DType::kBF16, 2, o);
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
  absl::StatusOr<RingCudaPlan> p = PlanRingCuda(Dense(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->q_chunks * p->kv_pieces, 1);
  o.device_memory_budget = need11 - 1;
  p = PlanRingCuda(Dense(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->q_chunks * p->kv_pieces, 1);
  EXPECT_LE(EstimateRingRankBytes(*p, 0, shape, DType::kBF16), o.device_memory_budget);
  o.device_memory_budget = static_cast<int64_t>(4.4 * unit);
  p = PlanRingCuda(Dense(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->q_chunks, 1);
  EXPECT_EQ(p->kv_pieces % 2, 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(EstimateRingRankBytes(*p, r, shape, DType::kBF16), o.device_memory_budget);
  }
  o.device_memory_budget = 4 * unit;  // below Q + O + K/V: nothing fits
  p = PlanRingCuda(Dense(true), shape, DType::kBF16, 2, o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("device_memory_budget"), std::string::npos);
  // Forced counts ignore the budget.
  o.q_chunks = 2;
  o.kv_pieces = 2;
  p = PlanRingCuda(Dense(true), shape, DType::kBF16, 2, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->q_chunks, 2);
}

// Mirrored zigzag query chunks: at every tick of every chunk phase the ranks' causal work is about
// equal (what keeps the lockstep ticks from waiting on one rank).
TEST(RingCudaPlanTest, MirroredChunksBalancePhases) {
  RingCudaPlanOptions o;
  o.q_chunks = 8;
  o.kv_pieces = 8;
  const int P = 2;
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(Dense(true), 1 << 16, P, o);
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
