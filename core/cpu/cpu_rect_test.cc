// The CPU backend on requests that are not square (a query offset, Nq != Nkv, packed sequences)
// against the float64 reference: every spec kind, causal and not, f32 and bf16, on fresh seeded
// random inputs with outputs poisoned first.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/reference/reference.h"
#include "core/spec/pattern_compiler.h"
#include "core/util/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MatchesReference;
using ::attnserve::testing::PoisonedLse;
using ::attnserve::testing::PoisonedOutput;

constexpr int32_t kBlock = 64;

ThreadPool& Pool() {
  // More threads than the machine's cores, so items interleave.
  static ThreadPool* pool = new ThreadPool(3);
  return *pool;
}

uint64_t SeedAndPrint() {
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu (replay with ATTN_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

struct Inputs {
  HostTensor q, k, v;
};

// q [B, Nq, Hq, D], k and v [B, Nkv, Hkv, D], uniform and never zero, rounded to `dtype`.
Inputs RandomInputs(const AttentionShape& s, DType dtype, uint64_t seed) {
  Inputs in{*HostTensor::Create(dtype, {s.batch, s.tokens, s.q_heads, s.head_dim}),
            *HostTensor::Create(dtype, {s.batch, s.kv_len(), s.kv_heads, s.head_dim}),
            *HostTensor::Create(dtype, {s.batch, s.kv_len(), s.kv_heads, s.head_dim})};
  FillUniform(in.q, seed * 3 + 1, -2.f, 2.f);
  FillUniform(in.k, seed * 3 + 2, -2.f, 2.f);
  FillUniform(in.v, seed * 3 + 3, -1.f, 1.f);
  return in;
}

// A csr layout over nb blocks: row i keeps blocks 0, i - 2 and i + 1 but not i itself (row 0
// aside), so most causal rows end at a block boundary instead of on the diagonal.
CsrGen CsrFor(int64_t nb) {
  CsrGen g;
  g.row_ptr.push_back(0);
  for (int64_t i = 0; i < nb; ++i) {
    std::set<int64_t> cols = {0};
    if (i >= 2) cols.insert(i - 2);
    if (i + 1 < nb) cols.insert(i + 1);
    g.col_idx.insert(g.col_idx.end(), cols.begin(), cols.end());
    g.row_ptr.push_back(static_cast<int64_t>(g.col_idx.size()));
  }
  return g;
}

// Every spec kind, each block_sparse generator, for a request whose pattern extent is `extent`.
std::vector<std::pair<std::string, AttentionPattern>> AllKinds(int64_t extent) {
  return {
      {"dense", DenseSpec{}},
      {"window", WindowSpec{13}},
      {"dilated", DilatedSpec{{40, 96, 1024}, {1, 3, 8}}},
      {"local_window", BlockSparseSpec{kBlock, LocalWindowGen{1}}},
      {"dilated_sparse", BlockSparseSpec{kBlock, DilatedSparseGen{{2}}}},
      {"global_local", BlockSparseSpec{kBlock, GlobalLocalGen{1, 0}}},
      {"strided", BlockSparseSpec{kBlock, StridedGen{3, 0}}},
      {"random", BlockSparseSpec{kBlock, RandomGen{0.4, 4242}}},
      {"csr", BlockSparseSpec{kBlock, CsrFor(NumBlocks(extent, kBlock))}},
  };
}

struct RectCase {
  std::string name;
  AttentionShape shape;
  int64_t q_offset = 0;
  std::vector<std::pair<int64_t, int64_t>> packed;  // (q_len, kv_len) per sequence; empty: not
  DType dtype = DType::kF32;
};

// gtest names a failing case by this rather than by its bytes.
void PrintTo(const RectCase& c, std::ostream* os) { *os << c.name; }

std::vector<RectCase> AllRectCases() {
  // Sequences of a packed batch: decode, empty, square, chunk, keys only, unaligned chunk. Six
  // exceed the pool's threads (one span per item); two do not (the pool inside each span).
  const std::vector<std::pair<int64_t, int64_t>> many = {{1, 150}, {0, 0},   {70, 70},
                                                         {30, 200}, {0, 20}, {65, 131}};
  const std::vector<std::pair<int64_t, int64_t>> two = {{100, 260}, {37, 37}};
  std::vector<RectCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string d(DTypeName(dtype));
    cases.push_back({"decode_" + d, {1, 1, 4, 2, 16, 300}, 299, {}, dtype});
    cases.push_back({"chunk_bottom_right_" + d, {2, 100, 4, 2, 16, 260}, 160, {}, dtype});
    cases.push_back({"chunk_mid_unaligned_" + d, {1, 90, 4, 4, 16, 200}, 37, {}, dtype});
    cases.push_back({"more_queries_" + d, {1, 300, 4, 2, 16, 130}, 0, {}, dtype});
    cases.push_back({"queries_after_keys_" + d, {1, 150, 2, 1, 16, 100}, 100, {}, dtype});
    for (const auto& [name, seqs] : {std::pair{std::string("packed6_"), many},
                                     std::pair{std::string("packed2_"), two}}) {
      RectCase c{name + d, {1, 0, 4, 2, 16, 0}, 0, seqs, dtype};
      for (const auto& [nq, nkv] : seqs) {
        c.shape.tokens += nq;
        c.shape.kv_tokens += nkv;
      }
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

AttentionSpec SpecFor(const RectCase& c, AttentionPattern pattern, bool causal) {
  AttentionSpec spec;
  spec.pattern = std::move(pattern);
  spec.causal = causal;
  spec.q_offset = c.q_offset;
  if (!c.packed.empty()) {
    spec.cu_seqlens_q = {0};
    spec.cu_seqlens_k = {0};
    for (const auto& [nq, nkv] : c.packed) {
      spec.cu_seqlens_q.push_back(spec.cu_seqlens_q.back() + nq);
      spec.cu_seqlens_k.push_back(spec.cu_seqlens_k.back() + nkv);
    }
  }
  return spec;
}

class CpuRectVsReferenceTest : public ::testing::TestWithParam<RectCase> {};

TEST_P(CpuRectVsReferenceTest, EveryKindMatchesReference) {
  const RectCase& c = GetParam();
  const uint64_t seed = SeedAndPrint();
  const Inputs in = RandomInputs(c.shape, c.dtype, seed);
  // The extent the csr layout must cover (PatternExtent), before the pattern is known.
  const int64_t extent = PatternExtent(SpecFor(c, DenseSpec{}, false), c.shape);
  for (bool causal : {false, true}) {
    for (const auto& [name, pattern] : AllKinds(extent)) {
      SCOPED_TRACE(absl::StrCat(name, causal ? " causal" : ""));
      const AttentionSpec spec = SpecFor(c, pattern, causal);
      auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
      ASSERT_TRUE(ref.ok()) << ref.status();
      HostTensor o = PoisonedOutput(c.shape, c.dtype);
      HostTensor lse = PoisonedLse(c.shape);
      CpuRunOptions options;
      options.pool = &Pool();
      options.compile.block_size = kBlock;
      CpuRectFigures figures;
      const absl::Status st =
          CpuAttentionRectInto(spec, in.q, in.k, in.v, options, o, lse, &figures);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_TRUE(MatchesReference(*ref, o, &lse, c.dtype));
      EXPECT_GT(figures.possible_pairs, 0);
      EXPECT_LE(figures.admitted_pairs, figures.possible_pairs);
      if (std::holds_alternative<DenseSpec>(pattern) && !causal) {
        EXPECT_EQ(figures.admitted_pairs, figures.possible_pairs);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, CpuRectVsReferenceTest, ::testing::ValuesIn(AllRectCases()),
                         [](const ::testing::TestParamInfo<RectCase>& info) {
                           return info.param.name;
                         });

// A dilated branch whose segment and rate are int64's largest, with heads at offsets >= 1 and
// queries past the first positions (found by fuzz_spec: gathering the set's rows overflowed int64
// into negative rows, which this run would read and write out of bounds).
TEST(CpuRectTest, DilatedRateNearInt64MaxMatchesReference) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const AttentionShape shape{1, 4, 4, 2, 16, 12};
  const Inputs in = RandomInputs(shape, DType::kF32, SeedAndPrint());
  // q_offset 6: no head offset >= 1 gathers a query; 0 and 1: offsets 1..3 do, and their heads
  // were stepped by h += rate past int64 (a negative head: heap corruption).
  for (const int64_t q_offset : {6, 0, 1}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "q_offset " << q_offset << (causal ? " causal" : ""));
      AttentionSpec spec;
      spec.pattern = DilatedSpec{{kMax, 64}, {kMax, 2}};
      spec.causal = causal;
      spec.q_offset = q_offset;
      auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
      ASSERT_TRUE(ref.ok()) << ref.status();
      HostTensor o = PoisonedOutput(shape, DType::kF32);
      HostTensor lse = PoisonedLse(shape);
      CpuRunOptions options;
      options.pool = &Pool();
      options.compile.block_size = kBlock;
      ASSERT_TRUE(CpuAttentionRectInto(spec, in.q, in.k, in.v, options, o, lse, nullptr).ok());
      EXPECT_TRUE(MatchesReference(*ref, o, &lse, DType::kF32));
    }
  }
}

// The allocating entry points dispatch: CpuAttention runs a non-square request as CpuAttentionRect,
// with no pool and an odd tile for the interval kinds.
TEST(CpuRectTest, CpuAttentionDispatchesWithoutAPool) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{1, 77, 2, 1, 8, 203};
  const Inputs in = RandomInputs(shape, DType::kF32, seed);
  for (const auto& [name, pattern] : AllKinds(203)) {
    SCOPED_TRACE(name);
    AttentionSpec spec;
    spec.pattern = pattern;
    spec.causal = true;
    spec.q_offset = 126;
    CpuRunOptions options;
    options.compile.block_size = 48;
    auto out = CpuAttention(spec, in.q, in.k, in.v, options);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(MatchesReference(*ReferenceAttention(spec, in.q, in.k, in.v), out->o, &out->lse,
                                 DType::kF32));
  }
}

// A square request through the rectangular path equals the square path.
TEST(CpuRectTest, SquareRequestMatchesSquarePath) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{2, 190, 4, 2, 16};
  const Inputs in = RandomInputs(shape, DType::kF32, seed);
  for (const auto& [name, pattern] : AllKinds(190)) {
    SCOPED_TRACE(name);
    AttentionSpec spec;
    spec.pattern = pattern;
    spec.causal = true;
    CpuRunOptions options;
    options.pool = &Pool();
    auto rect = CpuAttentionRect(spec, in.q, in.k, in.v, options);
    auto square = CpuAttention(spec, in.q, in.k, in.v, options);
    ASSERT_TRUE(rect.ok()) << rect.status();
    ASSERT_TRUE(square.ok()) << square.status();
    ::attnserve::testing::ExpectOutputsClose(*rect, *square, 1e-5);
  }
}

TEST(CpuRectTest, ErrorsNameTheField) {
  const AttentionShape shape{1, 10, 2, 1, 8, 30};
  const Inputs in = RandomInputs(shape, DType::kF32, 1);
  AttentionSpec spec;
  spec.q_offset = 31;
  auto out = CpuAttention(spec, in.q, in.k, in.v);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("spec.q_offset"), std::string::npos) << out.status();
  spec.q_offset = 0;
  spec.cu_seqlens_q = {0, 4, 10};
  spec.cu_seqlens_k = {0, 12, 29};  // ends at 29, not Nkv = 30
  out = CpuAttention(spec, in.q, in.k, in.v);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("spec.cu_seqlens_k[2]"), std::string::npos)
      << out.status();
  // A pattern compiled for one length refuses a request of two.
  spec = AttentionSpec{};
  spec.q_offset = 20;
  auto compiled = *CompilePattern(spec, 10, 2);
  out = CpuAttentionCompiled(spec, compiled, in.q, in.k, in.v);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  // Outputs of the wrong shape.
  HostTensor o = PoisonedOutput(AttentionShape{1, 30, 2, 1, 8}, DType::kF32);
  HostTensor lse = PoisonedLse(shape);
  EXPECT_EQ(CpuAttentionRectInto(spec, in.q, in.k, in.v, {}, o, lse).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuRectTest, CancelledRunReturnsCancelled) {
  const AttentionShape shape{1, 64, 2, 1, 8, 300};
  const Inputs in = RandomInputs(shape, DType::kBF16, 2);
  std::atomic<bool> cancel{true};
  CpuRunOptions options;
  options.pool = &Pool();
  options.cancel = &cancel;
  AttentionSpec spec;
  spec.q_offset = 236;
  auto out = CpuAttention(spec, in.q, in.k, in.v, options);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled) << out.status();
}

}  // namespace
}  // namespace attnserve
