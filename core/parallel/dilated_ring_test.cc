// DilatedRingAttention bound to the CPU primitives (ring = RingAttentionInProcess over P
// in-process ranks, local = the CPU backend) against the float64 reference: segments longer than
// a shard (LongNet-like, the largest segment = N or beyond it), causal and not, GQA, bf16 and
// f32, N not a multiple of the segment; the local/ring split and its byte counts; UNIMPLEMENTED.
#include "core/parallel/dilated_ring.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/parallel/ring.h"
#include "core/reference/reference.h"
#include "core/spec/pattern_compiler.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::MatchesReference;
using ::attnserve::testing::ShapeString;

constexpr int32_t kBlock = 64;

AttentionSpec Dilated(std::vector<int64_t> w, std::vector<int64_t> r, bool causal) {
  AttentionSpec s;
  s.pattern = DilatedSpec{std::move(w), std::move(r)};
  s.causal = causal;
  return s;
}

// The CPU primitives, counting calls and the ring's measured bytes.
struct CpuBindings {
  int ranks = 1;
  std::mutex mu;
  int64_t ring_calls = 0;
  int64_t local_calls = 0;
  int64_t ring_bytes_sent = 0;
  std::vector<std::string> ring_patterns;

  DilatedRingFn Ring() {
    return [this](const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
                  const HostTensor& v) -> absl::StatusOr<AttentionOutputs> {
      std::vector<RingRankStats> stats;
      RingOptions options;
      options.tile = 64;
      auto out = RingAttentionInProcess(spec, q, k, v, ranks, options, 0, &stats);
      std::lock_guard<std::mutex> lock(mu);
      ++ring_calls;
      ring_patterns.emplace_back(PatternName(spec.pattern));
      for (const RingRankStats& s : stats) ring_bytes_sent += s.bytes_sent;
      return out;
    };
  }
  DilatedLocalFn Local() {
    return [this](int rank, const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
                  const HostTensor& v) -> absl::StatusOr<AttentionOutputs> {
      if (rank < 0 || rank >= ranks) return absl::InternalError("local: bad rank");
      {
        std::lock_guard<std::mutex> lock(mu);
        ++local_calls;
      }
      // Into poisoned outputs: an element the backend does not write shows as NaN.
      AttentionShape s{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
      AttentionOutputs out{testing::PoisonedOutput(s, q.dtype()), testing::PoisonedLse(s)};
      CpuRunOptions options;
      options.compile.block_size = 64;
      auto compiled = CompilePattern(spec, s.tokens, s.q_heads, options.compile);
      if (!compiled.ok()) return compiled.status();
      absl::Status st = CpuAttentionInto(spec, *compiled, q, k, v, options, out.o, out.lse);
      if (!st.ok()) return st;
      return out;
    };
  }
};

struct Case {
  std::string name;
  std::vector<int64_t> w, r;
  AttentionShape shape;
  bool csr_ring_at_p4 = false;  // some job runs as a block-diagonal (block_sparse CSR) ring at P=4
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DilatedRingTest : public ::testing::TestWithParam<Case> {};

// Every P in {2, 3, 4}, causal and not, f32 and bf16: equals the reference.
TEST_P(DilatedRingTest, MatchesReference) {
  const Case& c = GetParam();
  const uint64_t seed = FreshSeed();
  for (int combo = 0; combo < 4; ++combo) {
    const bool causal = combo % 2 == 1;
    const DType dtype = combo < 2 ? DType::kF32 : DType::kBF16;
    const AttentionSpec spec = Dilated(c.w, c.r, causal);
    SCOPED_TRACE(
        absl::StrCat(c.name, " causal=", causal, " ", ShapeString(c.shape, dtype), " seed=", seed));
    testing::QkvInputs in = MakeRandomInputs(c.shape, dtype, seed);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int P : {2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat("P=", P));
      CpuBindings cpu;
      cpu.ranks = P;
      DilatedRingStats stats;
      auto out =
          DilatedRingAttention(spec, in.q, in.k, in.v, P, kBlock, cpu.Ring(), cpu.Local(), &stats);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->o.dtype(), dtype);
      EXPECT_TRUE(MatchesReference(*ref, out->o, &out->lse, dtype));
      EXPECT_EQ(stats.ring_jobs, cpu.ring_calls);
      EXPECT_EQ(stats.ring_bytes_moved, cpu.ring_bytes_sent);
      EXPECT_GT(stats.ring_jobs + stats.local_jobs, 0);
      if (P == 4) {
        const bool csr = std::find(cpu.ring_patterns.begin(), cpu.ring_patterns.end(),
                                   "block_sparse") != cpu.ring_patterns.end();
        EXPECT_EQ(csr, c.csr_ring_at_p4);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DilatedRingTest,
    ::testing::Values(
        // Branch 0 local for every P (6 segments), branch 1 a dense ring per offset (w > N).
        Case{"w256_2048_r1_4_gqa", {256, 2048}, {1, 4}, {1, 1536, 8, 2, 32}},
        // LongNet-like, the largest segment = N: branch 0 local at P = 2, 3 and a block-diagonal
        // ring at P = 4; branch 1 a dense ring over N/2 gathered positions.
        Case{"longnet_w512_1536_r1_2_gqa", {512, 1536}, {1, 2}, {1, 1536, 8, 2, 32}, true},
        // N not a multiple of the segment: short last segments, in gathered coordinates too.
        Case{"ragged_w512_1536_r1_2", {512, 1536}, {1, 2}, {2, 1500, 4, 4, 32}, true},
        // Rate 3 with GQA 8/2: groups read their KV heads unevenly (split into head runs);
        // 2 gathered segments of 256 (block-diagonal ring at P = 3, 4, local at P = 2).
        Case{"gqa_uneven_w192_768_r1_3", {192, 768}, {1, 3}, {1, 1536, 8, 2, 32}, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Which jobs run where, and what the rings carry: 1/r of a dense ring's K/V bytes for MHA.
TEST(DilatedRingPlanTest, MixedLocalAndRingStats) {
  const uint64_t seed = FreshSeed();
  const AttentionShape shape{1, 1536, 8, 8, 32};
  const AttentionSpec spec = Dilated({256, 2048}, {1, 4}, /*causal=*/true);
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, seed);
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const int P = 2;
  CpuBindings cpu;
  cpu.ranks = P;
  DilatedRingStats stats;
  auto out =
      DilatedRingAttention(spec, in.q, in.k, in.v, P, kBlock, cpu.Ring(), cpu.Local(), &stats);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(MatchesReference(*ref, out->o, &out->lse, DType::kF32));
  // Branch 0 (6 segments of 256): one local job, a part per rank. Branch 1 (one segment): one
  // ring per offset, dense causal over 384 gathered positions.
  EXPECT_EQ(stats.local_jobs, 1);
  EXPECT_EQ(stats.ring_jobs, 4);
  EXPECT_EQ(cpu.local_calls, P);
  EXPECT_EQ(cpu.ring_calls, 4);
  for (const std::string& p : cpu.ring_patterns) EXPECT_EQ(p, "dense");
  // Each group carries its 384 positions and its 2 KV heads: a quarter of a dense ring.
  const int64_t dense_ring = (P - 1) * 2 * shape.tokens * shape.kv_heads * shape.head_dim * 4;
  EXPECT_EQ(stats.ring_bytes_moved, dense_ring / 4);
  EXPECT_EQ(stats.ring_bytes_moved, cpu.ring_bytes_sent);

  // Reproducible bit for bit.
  CpuBindings again;
  again.ranks = P;
  auto out2 = DilatedRingAttention(spec, in.q, in.k, in.v, P, kBlock, again.Ring(), again.Local());
  ASSERT_TRUE(out2.ok()) << out2.status();
  EXPECT_EQ(std::memcmp(out->o.data(), out2->o.data(), out->o.nbytes()), 0);
  EXPECT_EQ(std::memcmp(out->lse.data(), out2->lse.data(), out->lse.nbytes()), 0);
}

TEST(DilatedRingPlanTest, BlockDiagonalRingAndHeadRuns) {
  const AttentionShape shape{1, 1536, 8, 2, 32};
  auto jobs = PlanDilatedRing(Dilated({512, 768}, {1, 3}, false), shape, 4, kBlock);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  // Branch 0: 3 segments < 4 ranks: one ring job, block-diagonal CSR of 8 blocks per segment.
  ASSERT_GE(jobs->size(), 1u);
  const DilatedRingJob& j0 = (*jobs)[0];
  EXPECT_FALSE(j0.local);
  EXPECT_EQ(j0.segments, 3);
  EXPECT_EQ(j0.seg_len, 512);
  auto spec0 = DilatedJobSpec(Dilated({512, 768}, {1, 3}, false), j0, j0.seq_len, true, kBlock);
  ASSERT_TRUE(spec0.ok()) << spec0.status();
  const auto* bs = std::get_if<BlockSparseSpec>(&spec0->pattern);
  ASSERT_NE(bs, nullptr);
  const auto& csr = std::get<CsrGen>(bs->generator);
  EXPECT_EQ(csr.row_ptr.size(), 25u);
  EXPECT_EQ(csr.col_idx.size(), 3u * 8 * 8);
  // Branch 1, rate 3 over heads 0..7 (KV head h / 4): offset 0 holds heads {0, 3, 6} -> runs
  // {0, 3} on KV 0 and {6} on KV 1, so two jobs; every job is a plain GQA mapping.
  int64_t branch1_jobs = 0;
  for (const DilatedRingJob& j : *jobs) {
    ASSERT_FALSE(j.kv_heads.empty());
    ASSERT_EQ(j.q_heads.size() % j.kv_heads.size(), 0u);
    const size_t gg = j.q_heads.size() / j.kv_heads.size();
    for (size_t i = 0; i < j.q_heads.size(); ++i) {
      EXPECT_EQ(j.q_heads[i] / 4, j.kv_heads[i / gg]) << "branch " << j.branch;
    }
    if (j.branch == 1) ++branch1_jobs;
  }
  // Offsets 0 ({0, 3} + {6}) and 1 ({1} + {4, 7}) split in two; offset 2 ({2}, {5}) is even.
  EXPECT_EQ(branch1_jobs, 5);
}

TEST(DilatedRingPlanTest, UnalignedRingSegmentsAreUnimplemented) {
  const AttentionShape shape{1, 1536, 4, 4, 32};
  const AttentionSpec spec = Dilated({256, 600}, {1, 1}, true);
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, 1);
  CpuBindings cpu;
  cpu.ranks = 4;
  auto out = DilatedRingAttention(spec, in.q, in.k, in.v, 4, kBlock, cpu.Ring(), cpu.Local());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented) << out.status();
  EXPECT_NE(out.status().message().find("spec.dilated.segment_lengths[1] = 600"), std::string::npos)
      << out.status();
  EXPECT_NE(out.status().message().find("block_size 64"), std::string::npos) << out.status();
  EXPECT_EQ(cpu.ring_calls + cpu.local_calls, 0);  // planned before anything ran
  // At P = 2 the same spec runs locally (3 segments of 600 >= 2 ranks).
  cpu.ranks = 2;
  auto ok = DilatedRingAttention(spec, in.q, in.k, in.v, 2, kBlock, cpu.Ring(), cpu.Local());
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// A group gathering fewer blocks than there are ranks runs whole on one rank (a ring would leave
// ranks empty), even with segment boundaries off the block grid.
TEST(DilatedRingPlanTest, ShortJobsRunWholeOnOneRank) {
  const uint64_t seed = FreshSeed();
  const AttentionShape shape{1, 300, 4, 2, 32};
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kBF16, seed);
  // Branch 0: 5 segments of 60 (local). Branch 1: rate 4, 2 segments of 37 or 38 gathered
  // positions per offset (74 or 76 of 300; 38 is off the block grid): 2 blocks of 64 < 3 ranks, so
  // each offset runs whole on one rank.
  const AttentionSpec spec = Dilated({60, 150}, {1, 4}, /*causal=*/true);
  const int P = 3;
  auto jobs = PlanDilatedRing(spec, shape, P, kBlock);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::vector<int> owners;
  for (const DilatedRingJob& j : *jobs) {
    EXPECT_TRUE(j.local);
    if (j.branch != 1) continue;
    int nonempty = 0;
    for (int p = 0; p < P; ++p) {
      if (j.parts[p].size() > 0) {
        ++nonempty;
        owners.push_back(p);
        EXPECT_EQ(j.parts[p].size(), j.seq_len);
      }
    }
    EXPECT_EQ(nonempty, 1);
  }
  EXPECT_EQ(owners, (std::vector<int>{0, 1, 2, 0}));  // offsets 0..3 take the ranks in turn
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  CpuBindings cpu;
  cpu.ranks = P;
  DilatedRingStats stats;
  auto out =
      DilatedRingAttention(spec, in.q, in.k, in.v, P, kBlock, cpu.Ring(), cpu.Local(), &stats);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(MatchesReference(*ref, out->o, &out->lse, DType::kBF16));
  EXPECT_EQ(stats.ring_jobs, 0);
  EXPECT_EQ(stats.ring_bytes_moved, 0);
}

TEST(DilatedRingPlanTest, RejectsBadArguments) {
  const AttentionShape shape{1, 256, 2, 2, 32};
  EXPECT_EQ(PlanDilatedRing(Dilated({64}, {1}, false), shape, 0, kBlock).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDilatedRing(Dilated({64}, {1}, false), shape, 2, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  AttentionSpec dense;
  EXPECT_EQ(PlanDilatedRing(dense, shape, 2, kBlock).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Jobs gather one position list for queries and keys alike: other requests are refused.
TEST(DilatedRingPlanTest, NonSquareRequestsAreUnimplemented) {
  AttentionShape shape{1, 256, 2, 2, 32};
  shape.kv_tokens = 300;
  auto plan = PlanDilatedRing(Dilated({64}, {1}, true), shape, 2, kBlock);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented) << plan.status();
  shape.kv_tokens = 0;
  AttentionSpec offset = Dilated({64}, {1}, true);
  offset.q_offset = 64;
  EXPECT_EQ(PlanDilatedRing(offset, shape, 2, kBlock).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace attnserve
