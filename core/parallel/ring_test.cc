#include "core/parallel/ring.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cpu/cpu_backend.h"
#include "core/reference/reference.h"
#include "core/spec/pattern_compiler.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::ExpectOutputsClose;
using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::MatchesReference;
using ::attnserve::testing::ShapeString;

struct NamedSpec {
  std::string name;
  AttentionSpec spec;
  int64_t tokens;  // block_sparse needs a few 64-token blocks per zigzag chunk
  // Tokens for the P = 8 runs (16 zigzag chunks); 0: `tokens`. Never a multiple of 8.
  int64_t tokens_p8 = 0;
};

// Test names and failure messages show the spec's name, not its bytes.
void PrintTo(const NamedSpec& s, std::ostream* os) { *os << s.name; }

AttentionSpec WithPattern(AttentionPattern p) {
  AttentionSpec s;
  s.pattern = std::move(p);
  return s;
}

std::vector<NamedSpec> AllSpecs() {
  std::vector<NamedSpec> out;
  out.push_back({"dense", WithPattern(DenseSpec{}), 103});
  out.push_back({"window", WithPattern(WindowSpec{9}), 103});
  // A caller's "unlimited" window (the wire takes any size >= 0): every pair, as dense.
  out.push_back(
      {"window_unlimited", WithPattern(WindowSpec{std::numeric_limits<int64_t>::max()}), 103});
  // Branches of 7 segments (communication-free for every P here), of 3 segments (a ring for
  // P = 4), and one segment longer than N (a ring over gathered positions for every P > 1).
  out.push_back({"dilated", WithPattern(DilatedSpec{{16, 40, 128}, {1, 2, 4}}), 103});
  // Rates as large as the wire takes: each offset's heads are stepped without passing int64.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  out.push_back({"dilated_huge_rate", WithPattern(DilatedSpec{{16, kMax}, {2, kMax}}), 103});
  const int32_t b = 64;
  const int64_t bs_tokens = 64 * 9 + 21;  // 10 blocks, the last one short
  // 20 blocks, the last one short: at P = 8 the 16 zigzag chunks hold one or two blocks each.
  const int64_t bs_tokens_p8 = 64 * 19 + 21;
  out.push_back({"bs_local_window", WithPattern(BlockSparseSpec{b, LocalWindowGen{1}}), bs_tokens,
                 bs_tokens_p8});
  out.push_back({"bs_dilated_sparse", WithPattern(BlockSparseSpec{b, DilatedSparseGen{{2, 5}}}),
                 bs_tokens, bs_tokens_p8});
  out.push_back({"bs_global_local", WithPattern(BlockSparseSpec{b, GlobalLocalGen{1, 1}}),
                 bs_tokens, bs_tokens_p8});
  out.push_back(
      {"bs_strided", WithPattern(BlockSparseSpec{b, StridedGen{3, 0}}), bs_tokens, bs_tokens_p8});
  out.push_back(
      {"bs_random", WithPattern(BlockSparseSpec{b, RandomGen{0.3, 17}}), bs_tokens, bs_tokens_p8});
  // A caller's layout over 10 blocks: a band, block 0 global, and two far pairs.
  CsrGen csr;
  csr.row_ptr.push_back(0);
  for (int64_t i = 0; i < 10; ++i) {
    std::vector<int64_t> cols = {0};
    for (int64_t j = std::max<int64_t>(1, i - 1); j <= std::min<int64_t>(9, i + 1); ++j) {
      cols.push_back(j);
    }
    if (i == 8) cols.insert(cols.begin() + 1, 3);
    if (i == 2) cols.push_back(7);
    csr.col_idx.insert(csr.col_idx.end(), cols.begin(), cols.end());
    csr.row_ptr.push_back(static_cast<int64_t>(csr.col_idx.size()));
  }
  out.push_back({"bs_csr", WithPattern(BlockSparseSpec{b, csr}), bs_tokens});
  return out;
}

// Max |a - b| over O (as float) and over LSE (matching -inf).
class RingSpecTest : public ::testing::TestWithParam<NamedSpec> {};

// The ring on P in {1, 2, 3, 4} in-process ranks equals the single-device CPU backend and the
// float64 reference, causal and not, with N not divisible by P.
TEST_P(RingSpecTest, MatchesSingleDeviceAndReference) {
  const NamedSpec& param = GetParam();
  const uint64_t seed = FreshSeed();
  const AttentionShape shape{2, param.tokens, 4, 2, 16};
  for (bool causal : {false, true}) {
    AttentionSpec spec = param.spec;
    spec.causal = causal;
    const DType dtype = causal ? DType::kBF16 : DType::kF32;
    SCOPED_TRACE(absl::StrCat(param.name, " causal=", causal, " ", ShapeString(shape, dtype),
                              " seed=", seed));
    testing::QkvInputs in = MakeRandomInputs(shape, dtype, seed);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    CpuRunOptions cpu_options;
    cpu_options.compile.block_size = 64;
    auto single = CpuAttention(spec, in.q, in.k, in.v, cpu_options);
    ASSERT_TRUE(single.ok()) << single.status();
    for (int P : {1, 2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat("P=", P));
      RingOptions options;
      options.tile = 16;  // several tiles per shard at these sizes
      std::vector<RingRankStats> stats;
      auto ring = RingAttentionInProcess(spec, in.q, in.k, in.v, P, options,
                                         /*threads_per_rank=*/P == 2 ? 2 : 0, &stats);
      ASSERT_TRUE(ring.ok()) << ring.status();
      EXPECT_TRUE(MatchesReference(*ref, ring->o, &ring->lse, dtype));
      ExpectOutputsClose(*ring, *single, dtype == DType::kF32 ? 1e-5 : 1e-2);
      ASSERT_EQ(stats.size(), static_cast<size_t>(P));
    }
  }
}

// P = 8 in-process ranks (the CPU side of the 8-GPU ring): every spec kind, causal and not, N not
// divisible by 8, GQA, against the float64 reference; for the layout-defined kinds the ranks'
// admitted pairs also add up to exactly the global layout's (no piece lost or counted twice).
TEST_P(RingSpecTest, EightRanksMatchReference) {
  const NamedSpec& param = GetParam();
  const uint64_t seed = FreshSeed();
  const int P = 8;
  const int64_t tokens = param.tokens_p8 > 0 ? param.tokens_p8 : param.tokens;
  ASSERT_NE(tokens % P, 0);
  const AttentionShape shape{1, tokens, 4, 2, 16};
  for (bool causal : {false, true}) {
    AttentionSpec spec = param.spec;
    spec.causal = causal;
    const DType dtype = causal ? DType::kF32 : DType::kBF16;
    SCOPED_TRACE(absl::StrCat(param.name, " causal=", causal, " ", ShapeString(shape, dtype),
                              " seed=", seed));
    testing::QkvInputs in = MakeRandomInputs(shape, dtype, seed);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    RingOptions options;
    options.tile = 8;  // a few tiles per shard, and tiles that straddle no shard boundary
    std::vector<RingRankStats> stats;
    auto ring = RingAttentionInProcess(spec, in.q, in.k, in.v, P, options,
                                       /*threads_per_rank=*/0, &stats);
    ASSERT_TRUE(ring.ok()) << ring.status();
    EXPECT_TRUE(MatchesReference(*ref, ring->o, &ring->lse, dtype));
    ASSERT_EQ(stats.size(), static_cast<size_t>(P));
    if (std::holds_alternative<DilatedSpec>(spec.pattern)) continue;
    int64_t total = 0;
    for (const RingRankStats& st : stats) {
      EXPECT_EQ(st.steps, P);
      total += st.admitted_pairs;
    }
    CompileOptions compile;
    compile.block_size = 64;
    auto layout = CompileBlockLayout(spec, tokens, compile);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(total, layout->AdmittedPairs() * shape.batch * shape.q_heads);
  }
}

INSTANTIATE_TEST_SUITE_P(AllSpecs, RingSpecTest, ::testing::ValuesIn(AllSpecs()),
                         [](const auto& info) { return info.param.name; });

TEST(SplitSequenceTest, ContiguousGivesRemainderToFirstShards) {
  auto s = SplitSequence(10, 3, SplitKind::kContiguous);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0][0].begin, 0);
  EXPECT_EQ(s[0][0].end, 4);
  EXPECT_EQ(s[1][0].end, 7);
  EXPECT_EQ(s[2][0].end, 10);
}

TEST(SplitSequenceTest, ZigzagPairsChunks) {
  auto s = SplitSequence(16, 4, SplitKind::kZigzag);
  for (int p = 0; p < 4; ++p) {
    ASSERT_EQ(s[p].size(), 2u);
    EXPECT_EQ(s[p][0].begin, 2 * p);
    EXPECT_EQ(s[p][1].begin, 2 * (7 - p));
  }
}

TEST(SplitSequenceTest, BlockUnitsKeepBoundariesAligned) {
  auto s = SplitSequence(64 * 9 + 21, 4, SplitKind::kZigzag, 64);
  int64_t covered = 0;
  for (const auto& ranges : s) {
    for (const TokenRange& r : ranges) {
      EXPECT_EQ(r.begin % 64, 0);
      EXPECT_TRUE(r.end % 64 == 0 || r.end == 64 * 9 + 21);
      covered += r.size();
    }
  }
  EXPECT_EQ(covered, 64 * 9 + 21);
}

// Zigzag gives every rank the same admitted pairs for causal dense attention.
TEST(RingBalanceTest, ZigzagEqualisesCausalWork) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  for (int P : {2, 3, 4, 8}) {
    const AttentionShape shape{1, 2 * P * 12, 2, 2, 8};
    testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, seed);
    AttentionSpec spec;
    spec.causal = true;
    RingOptions options;
    options.tile = 4;
    std::vector<RingRankStats> stats;
    auto ring = RingAttentionInProcess(spec, in.q, in.k, in.v, P, options, 0, &stats);
    ASSERT_TRUE(ring.ok()) << ring.status();
    int64_t total = 0;
    for (int p = 0; p < P; ++p) {
      EXPECT_EQ(stats[p].admitted_pairs, stats[0].admitted_pairs) << "P=" << P << " rank " << p;
      EXPECT_EQ(stats[p].steps, P);
      total += stats[p].admitted_pairs;
    }
    const int64_t n = shape.tokens;
    EXPECT_EQ(total, shape.batch * shape.q_heads * n * (n + 1) / 2);
  }
}

// At P = 8 the zigzag split itself gives every rank the same causal pairs, counted straight from
// its ranges (query i admits i + 1 keys), and the run's per-rank figures agree, with a tile size
// that divides neither the chunks nor N, GQA and batch 2.
TEST(RingBalanceTest, ZigzagEqualisesCausalWorkAtEightRanks) {
  const int P = 8;
  const int64_t n = 2 * P * 11;  // 11 tokens per chunk
  const auto split = SplitSequence(n, P, SplitKind::kZigzag);
  ASSERT_EQ(split.size(), static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    ASSERT_EQ(split[p].size(), 2u);
    int64_t pairs = 0;
    for (const TokenRange& r : split[p]) {
      EXPECT_EQ(r.size(), 11);
      for (int64_t i = r.begin; i < r.end; ++i) pairs += i + 1;
    }
    // Chunks c and 2P-1-c together hold queries whose key counts pair up to n + 1 each.
    EXPECT_EQ(pairs, 11 * (n + 1)) << "rank " << p;
  }

  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  const AttentionShape shape{2, n, 4, 2, 8};
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, seed);
  AttentionSpec spec;
  spec.causal = true;
  RingOptions options;
  options.tile = 5;
  std::vector<RingRankStats> stats;
  auto ring = RingAttentionInProcess(spec, in.q, in.k, in.v, P, options, 0, &stats);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_TRUE(MatchesReference(*ref, ring->o, &ring->lse, DType::kF32));
  for (int p = 0; p < P; ++p) {
    EXPECT_EQ(stats[p].admitted_pairs, shape.batch * shape.q_heads * 11 * (n + 1)) << p;
    EXPECT_EQ(stats[p].steps, P);
  }
}

// K/V move once per step; a dilated job with many segments moves nothing.
TEST(RingBytesTest, CountsWhatTravels) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  const AttentionShape shape{1, 64, 2, 1, 8};
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kBF16, seed);
  std::vector<RingRankStats> stats;
  auto dense = RingAttentionInProcess(AttentionSpec{}, in.q, in.k, in.v, 4, {}, 0, &stats);
  ASSERT_TRUE(dense.ok()) << dense.status();
  // 3 steps, each moving a 16-token K/V shard: 2 tensors x 16 x Hkv 1 x D 8 x 2 bytes.
  for (const auto& s : stats) {
    EXPECT_EQ(s.bytes_sent, 3 * 2 * 16 * 8 * 2);
    EXPECT_EQ(s.bytes_received, 3 * 2 * 16 * 8 * 2);
  }
  auto local = RingAttentionInProcess(WithPattern(DilatedSpec{{8}, {1}}), in.q, in.k, in.v, 4, {},
                                      0, &stats);
  ASSERT_TRUE(local.ok()) << local.status();
  for (const auto& s : stats) {
    EXPECT_EQ(s.bytes_sent, 0);
    EXPECT_EQ(s.steps, 1);
  }
}

// A dilated branch of rate r rings only its gathered positions: with MHA each KV head serves one
// group, so the branch moves 1/r of a dense ring's bytes.
TEST(RingBytesTest, DilatedRingMovesOneOverRate) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  const AttentionShape shape{1, 64, 4, 4, 8};
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, seed);
  std::vector<RingRankStats> dense, dilated;
  ASSERT_TRUE(RingAttentionInProcess(AttentionSpec{}, in.q, in.k, in.v, 2, {}, 0, &dense).ok());
  // One segment longer than N: a single segment per group, so the groups need the ring.
  ASSERT_TRUE(RingAttentionInProcess(WithPattern(DilatedSpec{{256}, {2}}), in.q, in.k, in.v, 2, {},
                                     0, &dilated)
                  .ok());
  for (int p = 0; p < 2; ++p) {
    EXPECT_GT(dilated[p].bytes_sent, 0);
    EXPECT_EQ(2 * dilated[p].bytes_sent, dense[p].bytes_sent) << p;
  }
}

TEST(RingErrorsTest, CancelledAndExpiredRunsStop) {
  const AttentionShape shape{1, 64, 2, 2, 8};
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, 1);
  std::atomic<bool> cancel{true};
  RingOptions options;
  options.cancel = &cancel;
  auto r = RingAttentionInProcess(AttentionSpec{}, in.q, in.k, in.v, 3, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();

  RingOptions late;
  late.deadline = absl::Now() - absl::Seconds(1);
  r = RingAttentionInProcess(AttentionSpec{}, in.q, in.k, in.v, 3, late);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();

  EXPECT_EQ(RingAttentionInProcess(AttentionSpec{}, in.q, in.k, in.v, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  AttentionSpec bad = WithPattern(WindowSpec{-1});
  EXPECT_EQ(RingAttentionInProcess(bad, in.q, in.k, in.v, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The ring shards one sequence axis shared by queries and keys: other requests are refused.
TEST(RingErrorsTest, NonSquareRequestsAreUnimplemented) {
  testing::QkvInputs in = MakeRandomInputs(AttentionShape{1, 64, 2, 2, 8}, DType::kF32, 1);
  testing::QkvInputs longer = MakeRandomInputs(AttentionShape{1, 96, 2, 2, 8}, DType::kF32, 2);
  auto r = RingAttentionInProcess(AttentionSpec{}, in.q, longer.k, longer.v, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("Nq != Nkv"), std::string::npos) << r.status();
  AttentionSpec offset;
  offset.q_offset = 3;
  r = RingAttentionInProcess(offset, in.q, in.k, in.v, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  AttentionSpec packed;
  packed.cu_seqlens_q = {0, 30, 64};
  packed.cu_seqlens_k = {0, 30, 64};
  EXPECT_EQ(RingRun::Create(packed, in.q, in.k, in.v, 2).status().code(),
            absl::StatusCode::kUnimplemented);
}

// A rank that never shows up makes its peers fail within the transfer timeout, not hang.
TEST(RingErrorsTest, MissingRankTimesOut) {
  const AttentionShape shape{1, 48, 2, 2, 8};
  testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, 2);
  RingOptions options;
  options.transfer_timeout = absl::Milliseconds(200);
  auto run = RingRun::Create(AttentionSpec{}, in.q, in.k, in.v, 3, options);
  ASSERT_TRUE(run.ok()) << run.status();
  auto group = InProcessCommGroup::Create(3).value();
  const absl::Time start = absl::Now();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 never runs
    threads.emplace_back([&, r] { status[r] = (*run)->RunRank(*group->comm(r), nullptr); });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const absl::Status& s : status) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  }
  EXPECT_FALSE((*run)->TakeOutputs().ok());
}

}  // namespace
}  // namespace attnserve
