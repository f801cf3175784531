// The shared ring schedule (ring_schedule.h) executed for every rank on the CPU: a slot model over
// every slot policy (the CPU ring's consume-home, the GPU ring's keep-home and restore-home) that
// fails when a live K/V piece is overwritten or a transfer carries the wrong piece, and the CUDA
// plan's ticks run through those slots with real K/V (CpuAttentionPiece per piece, LSE merge as
// the kernel's accumulate epilogue) against the float64 reference. No GPU needed.
#include "core/parallel/ring_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/parallel/ring_cuda_plan.h"
#include "core/reference/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

// ---- The shared schedule executed for every rank on the CPU ------------------------------------

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

// What a K/V slot holds: piece `piece` of rank `src` (data only in the data simulation).
struct Slot {
  int src = -1, piece = -1;  // -1: nothing
  std::vector<float> k, v;   // [B, tokens, Hkv, D]
};

// Chunks and pieces tile each shard exactly, on unit boundaries; K/V pieces are consecutive
// local rows (SetKv copies them as row blocks), query chunks may be mirrored (two runs).
void CheckCuts(const RingSchedule& s, int64_t n, int64_t unit) {
  for (int p = 0; p < s.ranks; ++p) {
    for (const auto* cut : {&s.q_chunk[p], &s.kv_piece[p]}) {
      const bool kv = cut == &s.kv_piece[p];
      std::vector<int> cover(n, 0);
      int64_t row = 0, total = 0;
      for (const RingChunk& ch : *cut) {
        if (kv) {
          EXPECT_EQ(ch.row, row);
        }
        int64_t tokens = 0;
        for (const TokenRange& r : ch.ranges) {
          if (kv && r.size() > 0) {
            EXPECT_EQ(LocalRow(s.split[p], r.begin), row + tokens);
          }
          EXPECT_TRUE(r.begin % unit == 0 || r.size() == 0);
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
      EXPECT_EQ(total, s.shard_tokens[p]);
      for (const TokenRange& r : s.split[p]) {
        for (int64_t i = r.begin; i < r.end; ++i) EXPECT_EQ(cover[i], 1) << i;
      }
    }
  }
}

// The slot model every executor relies on, run on every rank in lockstep: a run starts with the
// rank's own piece j in slot j; at each tick the compute slot holds the tick's (source, piece) and
// fits it; a transfer sends a slot to p+1 and receives into a slot that is neither the one
// computed nor the one sent (both are read while it lands), what arrives is what the schedule
// expects, and every receive lands after every send of the tick read its slot. A live piece that
// a receive overwrote would fail the compute check of the tick that needs it. At the end, the
// home pieces lie where next_run_slot says (policies that keep a home). `data` (optional, per
// rank and slot) carries K/V through the same moves; `compute(p, k, slot)` runs tick k of rank p.
void RunSlotModel(const RingSchedule& s, std::vector<std::vector<Slot>>& slots,
                  const std::function<void(int, int64_t, const Slot&)>& compute) {
  const int P = s.ranks;
  const std::vector<std::vector<Slot>> home = slots;
  for (int64_t k = 0; k < s.ticks(); ++k) {
    for (int p = 0; p < P; ++p) {
      const RingTick& tick = s.rank_ticks[p][k];
      ASSERT_GE(tick.slot, 0);
      ASSERT_LT(tick.slot, static_cast<int>(slots[p].size()));
      const Slot& sl = slots[p][tick.slot];
      ASSERT_EQ(sl.src, tick.source) << "rank " << p << " tick " << k;
      ASSERT_EQ(sl.piece, tick.kv_piece) << "rank " << p << " tick " << k;
      ASSERT_LE(s.kv_piece[tick.source][tick.kv_piece].tokens, s.slot_tokens[p][tick.slot]);
      compute(p, k, sl);
      if (::testing::Test::HasFatalFailure()) return;
    }
    std::vector<Slot> sent(P);
    for (int p = 0; p < P; ++p) {
      const RingTick& tick = s.rank_ticks[p][k];
      ASSERT_EQ(tick.send.valid(), tick.recv.valid());
      ASSERT_EQ(tick.send.valid(),
                s.rank_ticks[(p + 1) % P][k].recv.valid());  // both neighbours take part
      if (!tick.send.valid()) continue;
      ASSERT_NE(tick.recv.slot, tick.slot);
      ASSERT_NE(tick.recv.slot, tick.send.slot);
      ASSERT_EQ(tick.send.peer, (p + 1) % P);
      ASSERT_EQ(tick.recv.peer, (p - 1 + P) % P);
      sent[p] = slots[p][tick.send.slot];
      ASSERT_EQ(std::make_pair(sent[p].src, sent[p].piece),
                std::make_pair(tick.send.source, tick.send.piece));
      ASSERT_EQ(tick.send.tokens, s.kv_piece[tick.send.source][tick.send.piece].tokens);
    }
    for (int p = 0; p < P; ++p) {
      const RingTick& tick = s.rank_ticks[p][k];
      if (!tick.recv.valid()) continue;
      const Slot& from = sent[(p - 1 + P) % P];
      ASSERT_EQ(std::make_pair(from.src, from.piece),
                std::make_pair(tick.recv.source, tick.recv.piece));
      ASSERT_EQ(tick.recv.tokens, s.kv_piece[from.src][from.piece].tokens);
      ASSERT_LE(tick.recv.tokens, s.slot_tokens[p][tick.recv.slot]);
      slots[p][tick.recv.slot] = from;
    }
  }
  if (s.next_run_slot.empty()) return;  // consume-home: the home is not kept
  for (int p = 0; p < P; ++p) {
    for (int j = 0; j < s.kv_pieces; ++j) {
      const Slot& sl = slots[p][s.next_run_slot[j]];
      EXPECT_EQ(sl.src, p);
      EXPECT_EQ(sl.piece, j);
      EXPECT_EQ(sl.k, home[p][j].k);
      EXPECT_EQ(sl.v, home[p][j].v);
    }
  }
}

// Slots with the home pieces' labels only.
std::vector<std::vector<Slot>> HomeLabels(const RingSchedule& s) {
  std::vector<std::vector<Slot>> slots(s.ranks);
  for (int p = 0; p < s.ranks; ++p) {
    slots[p].resize(s.slot_tokens[p].size());
    for (int j = 0; j < s.kv_pieces; ++j) slots[p][j] = Slot{p, j, {}, {}};
  }
  return slots;
}

// Every policy (the CPU ring's consume-home, the GPU's keep-home and restore-home) over many
// counts: slots, transfers and stream order, without data.
TEST(RingScheduleTest, SlotModelHoldsForEveryPolicy) {
  for (int ranks : {1, 2, 3, 4, 5}) {
    for (SplitKind kind : {SplitKind::kContiguous, SplitKind::kZigzag}) {
      for (auto [qc, c] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {1, 4}, {3, 2}}) {
        for (RingSlotPolicy policy : {RingSlotPolicy::kKeepHome, RingSlotPolicy::kRestoreHome,
                                      RingSlotPolicy::kConsumeHome}) {
          for (bool circulate : {true, false}) {
            if (policy == RingSlotPolicy::kKeepHome && qc * c != 1) continue;
            SCOPED_TRACE(::testing::Message()
                         << "P=" << ranks << " qc=" << qc << " c=" << c
                         << " policy=" << static_cast<int>(policy) << " circulate=" << circulate);
            RingScheduleOptions o;
            o.q_chunks = qc;
            o.kv_pieces = c;
            o.unit = 8;
            o.slots = policy;
            o.circulate = circulate;
            absl::StatusOr<RingSchedule> s =
                MakeRingSchedule(SplitSequence(700, ranks, kind, 8), kind, o);
            ASSERT_TRUE(s.ok()) << s.status();
            CheckCuts(*s, 700, 8);
            std::vector<std::vector<Slot>> slots = HomeLabels(*s);
            int64_t transfers = 0;
            std::vector<std::vector<int>> seen(ranks, std::vector<int>(ranks * c, 0));
            RunSlotModel(*s, slots, [&](int p, int64_t k, const Slot&) {
              const RingTick& tick = s->rank_ticks[p][k];
              ++seen[p][tick.source * c + tick.kv_piece];
              transfers += tick.send.valid();
            });
            if (HasFatalFailure()) return;
            // Every query chunk meets every K/V piece once (its own only, without circulation).
            for (int p = 0; p < ranks; ++p) {
              for (int src = 0; src < ranks; ++src) {
                for (int j = 0; j < c; ++j) {
                  const bool meets = circulate || src == p;
                  EXPECT_EQ(seen[p][src * c + j], meets ? qc : 0);
                }
              }
            }
            // The CPU ring's (1, 1) consume-home and the GPU's keep-home: P-1 transfers a rank.
            if (qc * c == 1 && policy != RingSlotPolicy::kRestoreHome) {
              EXPECT_EQ(transfers, circulate ? ranks * (ranks - 1) : 0);
            }
          }
        }
      }
    }
  }
}

// Runs a CUDA plan's ticks for all ranks through the slot model with real K/V: per-chunk f32
// accumulators merged piece by piece with the LSE rule (the kernel's accumulate epilogue), the
// chunk converted into O after its last tick, the result compared with the float64 reference.
// One rank of the data simulation: its query shard, outputs (poisoned) and chunk accumulators.
struct SimRank {
  std::vector<float> q, o, lse;       // [B, nl, Hq, D], [B, nl, Hq, D], [B, Hq, nl]
  std::vector<float> acc_o, acc_lse;  // the current query chunk's rows
};

// LSE-merges a piece's fresh (po, pl) rows [row0, row0 + rows) into (acc_o, acc_l) of tq rows.
void MergeRows(const AttentionShape& shape, int64_t tq, int64_t row0, int64_t rows,
               const std::vector<float>& po, const std::vector<float>& pl,
               std::vector<float>& acc_o, std::vector<float>& acc_l) {
  const int64_t b = shape.batch, hq = shape.q_heads, d = shape.head_dim;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = row0; i < row0 + rows; ++i) {
        float& la = acc_l[(bi * hq + h) * tq + i];
        const float lb = pl[(bi * hq + h) * tq + i];
        if (lb == -INFINITY) continue;
        const float mx = std::max(la, lb);
        const float wa = la == -INFINITY ? 0.f : std::exp(la - mx);
        const float wb = std::exp(lb - mx);
        float* oa = &acc_o[((bi * tq + i) * hq + h) * d];
        const float* ob = &po[((bi * tq + i) * hq + h) * d];
        for (int64_t x = 0; x < d; ++x) oa[x] = (oa[x] * wa + ob[x] * wb) / (wa + wb);
        la = mx + std::log(wa + wb);
      }
    }
  }
}

// Tick k of rank p against the K/V in `sl`, as RingCudaRank::RunTicks enqueues it.
void SimulateTick(const AttentionSpec& spec, const IntervalRule& rule, const RingCudaPlan& plan,
                  const AttentionShape& shape, int p, int64_t k, const Slot& sl, SimRank& r) {
  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const RingTick& tick = plan.rank_ticks[p][k];
  const RingChunk& qch = plan.q_chunk[p][tick.q_chunk];
  const int64_t nl = plan.shard_tokens[p], tq = qch.tokens;
  ASSERT_EQ(tick.q_chunk, k / plan.period());
  if (tick.chunk_begins) {
    r.acc_o.assign(b * tq * hq * d, 0.f);  // the f32 accumulator holds only this chunk
    r.acc_lse.assign(b * hq * tq, -INFINITY);
  }
  // The chunk's query rows, its ranges concatenated (the accumulator's row order).
  std::vector<float> qc_rows(b * tq * hq * d);
  for (int64_t bi = 0; bi < b; ++bi) {
    int64_t acc_row = 0;
    for (const TokenRange& rg : qch.ranges) {
      const int64_t row = LocalRow(plan.split[p], rg.begin);
      // data() + offset, not &v[offset]: a chunk may hold no rows (an empty qc_rows).
      std::copy_n(r.q.data() + (bi * nl + row) * hq * d, rg.size() * hq * d,
                  qc_rows.data() + (bi * tq + acc_row) * hq * d);
      acc_row += rg.size();
    }
  }
  std::vector<HeadPair> heads;
  for (int64_t h = 0; h < hq; ++h) {
    heads.push_back({static_cast<int32_t>(h), static_cast<int32_t>(h / (hq / hkv))});
  }
  const int64_t ns = plan.kv_piece[tick.source][tick.kv_piece].tokens;
  for (const RingPiece& piece : plan.steps[p][k].pieces) {
    ASSERT_EQ(piece.acc_row, LocalRow(qch.ranges, piece.q.begin));
    ASSERT_EQ(piece.q_row, LocalRow(plan.split[p], piece.q.begin));
    ASSERT_LE(piece.acc_row + piece.q.size(), tq);
    ASSERT_LE(piece.k_row + piece.k.size(), ns);
    const RectLayout layout = piece.kind == RingPieceKind::kLayout
                                  ? piece.layout
                                  : RectLayoutFromRule(rule, piece.q.begin, piece.q.end,
                                                       piece.k.begin, piece.k.end, plan.block_size);
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
    MergeRows(shape, tq, piece.acc_row, piece.q.size(), po, pl, r.acc_o, r.acc_lse);
  }
  if (!tick.chunk_ends) return;
  // The chunk is final: f32 accumulator -> O and LSE of the shard.
  int64_t acc_row = 0;
  for (const TokenRange& rg : qch.ranges) {
    const int64_t row = LocalRow(plan.split[p], rg.begin);
    for (int64_t bi = 0; bi < b; ++bi) {
      std::copy_n(&r.acc_o[(bi * tq + acc_row) * hq * d], rg.size() * hq * d,
                  &r.o[(bi * nl + row) * hq * d]);
      for (int64_t h = 0; h < hq; ++h) {
        std::copy_n(&r.acc_lse[(bi * hq + h) * tq + acc_row], rg.size(),
                    &r.lse[(bi * hq + h) * nl + row]);
      }
    }
    acc_row += rg.size();
  }
}

void SimulateRing(const AttentionSpec& spec, const AttentionShape& shape, int ranks, int qc, int c,
                  int32_t block, const testing::QkvInputs& in, const ReferenceResult& ref) {
  SCOPED_TRACE(::testing::Message()
               << "ring sim P=" << ranks << " qc=" << qc << " c=" << c << " n=" << shape.tokens
               << " causal=" << spec.causal << " pattern=" << spec.pattern.index());
  RingCudaPlanOptions o;
  o.block_size = block;
  o.q_chunks = qc;
  o.kv_pieces = c;
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(spec, shape, DType::kBF16, ranks, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->q_chunks, qc);
  ASSERT_EQ(plan->kv_pieces, c);
  // (1, 1) is the double-buffered step ring (home kept), anything else the lean schedule.
  ASSERT_EQ(plan->slot_policy,
            qc * c == 1 ? RingSlotPolicy::kKeepHome : RingSlotPolicy::kRestoreHome);
  const int P = ranks;
  const int64_t b = shape.batch, n = shape.tokens, hq = shape.q_heads, d = shape.head_dim;
  CheckCuts(*plan, n, plan->block_size);
  IntervalRule rule;
  rule.causal = spec.causal;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) rule.window = w->size;

  // Per rank: Q shard, outputs poisoned, home pieces in slots 0..c-1.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<SimRank> rank(P);
  std::vector<std::vector<Slot>> slots = HomeLabels(*plan);
  for (int p = 0; p < P; ++p) {
    const int64_t nl = plan->shard_tokens[p];
    rank[p].q = GatherRows(in.q, plan->split[p]);
    rank[p].o.assign(b * nl * hq * d, nan);
    rank[p].lse.assign(b * hq * nl, nan);
    for (int j = 0; j < c; ++j) {
      slots[p][j].k = GatherRows(in.k, plan->kv_piece[p][j].ranges);
      slots[p][j].v = GatherRows(in.v, plan->kv_piece[p][j].ranges);
    }
  }
  RunSlotModel(*plan, slots, [&](int p, int64_t k, const Slot& sl) {
    SimulateTick(spec, rule, *plan, shape, p, k, sl, rank[p]);
  });
  if (::testing::Test::HasFatalFailure()) return;
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
          std::copy_n(&rank[p].o[(bi * nl + local) * hq * d], hq * d, &og[(bi * n + i) * hq * d]);
          for (int64_t h = 0; h < hq; ++h) {
            lg[(bi * hq + h) * n + i] = rank[p].lse[(bi * hq + h) * nl + local];
          }
        }
      }
    }
  }
  EXPECT_TRUE(testing::MatchesReference(ref, og_t, &lse, DType::kF32));
}

TEST(RingScheduleTest, SimulationMatchesReference) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const std::vector<std::pair<int, int>> counts = {{1, 1}, {2, 2}, {4, 8}, {1, 2}, {2, 1}, {3, 2}};
  for (int64_t n : {300, 700}) {
    const AttentionShape shape{2, n, 4, 2, 16};
    const testing::QkvInputs in = testing::MakeRandomInputs(shape, DType::kF32, seed + n);
    for (bool causal : {false, true}) {
      for (const AttentionSpec& spec : {testing::DenseCase(causal), testing::WindowCase(90, causal),
                                        testing::SparseCase(64, LocalWindowGen{1}, causal)}) {
        absl::StatusOr<ReferenceResult> ref = ReferenceAttention(spec, in.q, in.k, in.v);
        ASSERT_TRUE(ref.ok()) << ref.status();
        for (int ranks : {1, 2, 3, 4}) {
          for (auto [qc, c] : counts) {
            if (causal && c % 2 != 0 && c != 1) continue;
            SimulateRing(spec, shape, ranks, qc, c, 64, in, *ref);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnserve
