#include "core/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/reference/reference.h"
#include "core/spec/pattern_compiler.h"
#include "core/spec/rect_layout.h"
#include "core/util/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::MatchesReference;
using ::attnserve::testing::PoisonedLse;
using ::attnserve::testing::PoisonedOutput;
using ::attnserve::testing::ShapeString;

ThreadPool& Pool() {
  // Three workers plus the caller on two cores: more threads than cores, so items interleave.
  static ThreadPool* pool = new ThreadPool(3);
  return *pool;
}

uint64_t SeedAndPrint() {
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu (replay with ATTN_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

// Runs the CPU backend into poisoned outputs, so any element it does not write shows as NaN.
struct RunResult {
  absl::Status status;
  HostTensor o;
  HostTensor lse;
};
RunResult RunPoisoned(const AttentionSpec& spec, const AttentionShape& shape, DType dtype,
                const testing::QkvInputs& in, int32_t block = 128, ThreadPool* pool = &Pool()) {
  RunResult run{absl::OkStatus(), PoisonedOutput(shape, dtype), PoisonedLse(shape)};
  CpuRunOptions options;
  options.pool = pool;
  options.compile.block_size = block;
  auto compiled = CompilePattern(spec, shape.tokens, shape.q_heads, options.compile);
  if (!compiled.ok()) {
    run.status = compiled.status();
    return run;
  }
  run.status = CpuAttentionInto(spec, *compiled, in.q, in.k, in.v, options, run.o, run.lse);
  return run;
}

// ---------------------------------------------------------------------------------------------
// Every spec kind against the float64 reference.

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype = DType::kF32;
  int32_t block = 128;  // compile block size for dense / window / dilated
};

// A caller's csr layout over nb blocks: block i keeps itself and (7i + 3) mod nb; row 1 keeps
// nothing (its rows must come out O = 0, LSE = -inf).
CsrGen TestCsr(int64_t nb) {
  CsrGen g;
  g.row_ptr.push_back(0);
  for (int64_t i = 0; i < nb; ++i) {
    if (i != 1) {
      std::vector<int64_t> row = {i, (7 * i + 3) % nb};
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
      g.col_idx.insert(g.col_idx.end(), row.begin(), row.end());
    }
    g.row_ptr.push_back(static_cast<int64_t>(g.col_idx.size()));
  }
  return g;
}

std::vector<Case> AllCases() {
  struct Variant {
    AttentionShape shape;
    DType dtype;
    int32_t block;
  };
  // N never a multiple of the block or segment sizes; GQA and not; every D and dtype.
  const std::vector<Variant> variants = {
      {{1, 300, 4, 4, 64}, DType::kF32, 128},
      {{2, 257, 4, 2, 32}, DType::kBF16, 64},
      {{1, 449, 6, 2, 128}, DType::kF16, 128},
      {{1, 700, 2, 1, 32}, DType::kF32, 64},
  };
  struct Kind {
    std::string name;
    // Pattern for N tokens (csr depends on N).
    std::function<AttentionPattern(int64_t n)> make;
  };
  const std::vector<Kind> kinds = {
      {"dense", [](int64_t) { return DenseSpec{}; }},
      {"window17", [](int64_t) { return WindowSpec{17}; }},
      {"window150", [](int64_t) { return WindowSpec{150}; }},
      {"dilated2", [](int64_t) { return DilatedSpec{{64, 128}, {1, 2}}; }},
      // Rate 8 exceeds every head count here; segment 100 divides no N.
      {"dilated3", [](int64_t) { return DilatedSpec{{100, 256, 512}, {1, 3, 8}}; }},
      // One branch with rate 4 and segment 96: rows no head offset covers stay O = 0, -inf.
      {"dilated_uncovered", [](int64_t) { return DilatedSpec{{96}, {4}}; }},
      {"dilated_odd", [](int64_t) { return DilatedSpec{{37, 200}, {2, 5}}; }},
      {"local_window", [](int64_t) { return BlockSparseSpec{64, LocalWindowGen{1}}; }},
      {"local_window128", [](int64_t) { return BlockSparseSpec{128, LocalWindowGen{0}}; }},
      {"dilated_sparse", [](int64_t) { return BlockSparseSpec{64, DilatedSparseGen{{2, 3}}}; }},
      {"global_local", [](int64_t) { return BlockSparseSpec{64, GlobalLocalGen{1, 1}}; }},
      {"strided", [](int64_t) { return BlockSparseSpec{64, StridedGen{3, 0}}; }},
      {"random", [](int64_t) { return BlockSparseSpec{64, RandomGen{0.3, 12345}}; }},
      {"random128", [](int64_t) { return BlockSparseSpec{128, RandomGen{0.5, 9}}; }},
      {"csr", [](int64_t n) { return BlockSparseSpec{64, TestCsr(NumBlocks(n, 64))}; }},
  };
  std::vector<Case> cases;
  for (const Kind& kind : kinds) {
    for (bool causal : {false, true}) {
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        const Variant& v = variants[vi];
        Case c;
        c.spec.pattern = kind.make(v.shape.tokens);
        c.spec.causal = causal;
        c.shape = v.shape;
        c.dtype = v.dtype;
        c.block = v.block;
        c.name = absl::StrCat(kind.name, causal ? "_causal" : "", "_v", vi);
        cases.push_back(std::move(c));
      }
    }
  }
  // Every (dtype, head dim) pair on dense causal and a window, with a non-default scale.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t d : {20, 32, 64, 128}) {  // 20: not a multiple of the vector width
      for (bool window : {false, true}) {
        Case c;
        c.spec.causal = true;
        c.spec.scale = 0.2f;
        if (window) c.spec.pattern = WindowSpec{40};
        c.shape = {1, 190, 2, 1, d};
        c.dtype = dtype;
        c.block = 64;
        c.name = absl::StrCat(window ? "window40" : "dense", "_", std::string(DTypeName(dtype)), "_d", d);
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

class CpuVsReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuVsReferenceTest, MatchesReference) {
  const Case& c = GetParam();
  const uint64_t seed = SeedAndPrint();
  SCOPED_TRACE(absl::StrCat(c.name, " ", ShapeString(c.shape, c.dtype), " seed ", seed));
  const auto in = MakeRandomInputs(c.shape, c.dtype, seed);
  const auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const RunResult run = RunPoisoned(c.spec, c.shape, c.dtype, in, c.block);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(MatchesReference(*ref, run.o, &run.lse, c.dtype));
}

INSTANTIATE_TEST_SUITE_P(AllSpecs, CpuVsReferenceTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------------------------
// Properties.

double MaxAbsDiff(const HostTensor& a, const HostTensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.GetFloat(i), y = b.GetFloat(i);
    if (std::isinf(x) && x == y) continue;
    m = std::max(m, std::isnan(x) || std::isnan(y) ? INFINITY : std::abs(x - y));
  }
  return m;
}

TEST(CpuBackendTest, BlockSparseWithEveryBlockEqualsDense) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{1, 333, 4, 2, 64};
  const auto in = MakeRandomInputs(shape, DType::kF32, seed);
  for (bool causal : {false, true}) {
    const int64_t nb = NumBlocks(shape.tokens, 64);
    CsrGen all;
    for (int64_t i = 0; i <= nb; ++i) all.row_ptr.push_back(i * nb);
    for (int64_t i = 0; i < nb; ++i) {
      for (int64_t j = 0; j < nb; ++j) all.col_idx.push_back(j);
    }
    AttentionSpec dense, bs;
    dense.causal = bs.causal = causal;
    bs.pattern = BlockSparseSpec{64, all};
    const RunResult a = RunPoisoned(dense, shape, DType::kF32, in, 64);
    const RunResult b = RunPoisoned(bs, shape, DType::kF32, in);
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << b.status;
    EXPECT_LE(MaxAbsDiff(a.o, b.o), 1e-6);
    EXPECT_LE(MaxAbsDiff(a.lse, b.lse), 1e-5);
    EXPECT_TRUE(MatchesReference(*ReferenceAttention(dense, in.q, in.k, in.v), b.o, &b.lse,
                                 DType::kF32));
  }
}

TEST(CpuBackendTest, DilatedSingleFullSegmentEqualsDense) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{1, 321, 3, 3, 32};
  const auto in = MakeRandomInputs(shape, DType::kF32, seed);
  for (bool causal : {false, true}) {
    AttentionSpec dense, dil;
    dense.causal = dil.causal = causal;
    dil.pattern = DilatedSpec{{shape.tokens}, {1}};
    const RunResult a = RunPoisoned(dense, shape, DType::kF32, in, 64);
    const RunResult b = RunPoisoned(dil, shape, DType::kF32, in, 64);
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << b.status;
    EXPECT_LE(MaxAbsDiff(a.o, b.o), 1e-6);
    EXPECT_LE(MaxAbsDiff(a.lse, b.lse), 1e-5);
  }
}

// A block_sparse local_window layout equals the window spec at block granularity: with block b
// and width W, query block i sees keys of blocks [i - W, i + W], so the reference with the
// block predicate (what ReferenceAttention does for block_sparse) is the oracle; the plain window
// spec is the oracle only where both agree, which the token-level window w = b * (W + 1) - 1
// never does exactly, so this property is checked against the reference instead.
TEST(CpuBackendTest, LocalWindowEqualsBlockPredicateReference) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{1, 640, 2, 2, 64};
  const auto in = MakeRandomInputs(shape, DType::kF32, seed);
  for (int64_t w : {0, 1, 3}) {
    AttentionSpec spec;
    spec.pattern = BlockSparseSpec{128, LocalWindowGen{w}};
    const RunResult run = RunPoisoned(spec, shape, DType::kF32, in);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_TRUE(MatchesReference(*ReferenceAttention(spec, in.q, in.k, in.v), run.o, &run.lse,
                                 DType::kF32))
        << "width " << w;
  }
}

TEST(CpuBackendTest, CausalRowZeroSeesExactlyOneKey) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{2, 130, 4, 2, 64};
  const auto in = MakeRandomInputs(shape, DType::kF32, seed);
  AttentionSpec spec;
  spec.causal = true;
  const RunResult run = RunPoisoned(spec, shape, DType::kF32, in);
  ASSERT_TRUE(run.status.ok()) << run.status;
  const int64_t N = shape.tokens, Hq = 4, Hkv = 2, D = 64;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        dot += double{in.q.GetFloat(((b * N) * Hq + h) * D + d)} *
               in.k.GetFloat(((b * N) * Hkv + h / 2) * D + d);
      }
      EXPECT_NEAR(run.lse.GetFloat((b * Hq + h) * N), dot / 8.0, 1e-5);
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_NEAR(run.o.GetFloat(((b * N) * Hq + h) * D + d),
                    in.v.GetFloat(((b * N) * Hkv + h / 2) * D + d), 1e-6);
      }
    }
  }
}

// Work items never share state, so the result does not depend on the schedule.
TEST(CpuBackendTest, InlineAndPooledRunsAreBitwiseEqual) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{1, 400, 4, 2, 32};
  const auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  AttentionSpec spec;
  spec.pattern = DilatedSpec{{128, 256}, {1, 2}};
  spec.causal = true;
  const RunResult a = RunPoisoned(spec, shape, DType::kBF16, in, 64, nullptr);
  const RunResult b = RunPoisoned(spec, shape, DType::kBF16, in, 64, &Pool());
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(std::memcmp(a.o.data(), b.o.data(), a.o.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.nbytes()), 0);
}

TEST(CpuBackendTest, CancelledRunReturnsCancelled) {
  const AttentionShape shape{1, 512, 2, 2, 32};
  const auto in = MakeRandomInputs(shape, DType::kF32, SeedAndPrint());
  std::atomic<bool> cancel{true};
  MemoryTracker tracker;
  CpuRunOptions options;
  options.pool = &Pool();
  options.cancel = &cancel;
  options.tracker = &tracker;
  for (const AttentionPattern& p :
       {AttentionPattern{DenseSpec{}}, AttentionPattern{DilatedSpec{{128}, {2}}}}) {
    AttentionSpec spec;
    spec.pattern = p;
    auto out = CpuAttention(spec, in.q, in.k, in.v, options);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled) << out.status();
    EXPECT_EQ(out.status().message(), "request cancelled");
  }
  EXPECT_EQ(tracker.in_use_bytes(), 0);  // nothing leaks on the cancel path
}

TEST(CpuBackendTest, CancelFromAnotherThreadStopsALongRun) {
  const AttentionShape shape{1, 4096, 4, 4, 64};
  const auto in = MakeRandomInputs(shape, DType::kF32, SeedAndPrint());
  std::atomic<bool> cancel{false};
  CpuRunOptions options;
  options.pool = &Pool();
  options.cancel = &cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cancel = true;
  });
  auto out = CpuAttention(AttentionSpec{}, in.q, in.k, in.v, options);
  canceller.join();
  // On a very fast machine the run may finish first; either way it must not return garbage.
  if (!out.ok()) {
    EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled) << out.status();
  }
}

TEST(CpuBackendTest, WrongShapesAndDtypesAreInvalidArgument) {
  auto q = *HostTensor::Create(DType::kF32, {1, 256, 8, 64});
  auto k = *HostTensor::Create(DType::kF32, {2, 128, 4, 64});
  auto v = *HostTensor::Create(DType::kF32, {2, 128, 4, 64});
  auto out = CpuAttention(AttentionSpec{}, q, k, v);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "k: shape [2, 128, 4, 64] f32 does not match q's batch/head_dim [1, 256, 8, 64] f32");

  auto k2 = *HostTensor::Create(DType::kF32, {1, 256, 3, 64});
  out = CpuAttention(AttentionSpec{}, q, k2, k2);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_NE(out.status().message().find("q_heads"), std::string::npos) << out.status();

  auto k3 = *HostTensor::Create(DType::kF32, {1, 256, 4, 64});
  auto v3 = *HostTensor::Create(DType::kBF16, {1, 256, 4, 64});
  out = CpuAttention(AttentionSpec{}, q, k3, v3);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message().substr(0, 3), "v: ") << out.status();

  auto r3 = *HostTensor::Create(DType::kF32, {256, 4, 64});
  out = CpuAttention(AttentionSpec{}, q, r3, r3);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message().substr(0, 3), "k: ") << out.status();

  AttentionSpec bad;
  bad.pattern = BlockSparseSpec{96, LocalWindowGen{1}};
  out = CpuAttention(bad, q, k3, k3);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();

  // A layout compiled for another length.
  auto compiled = *CompilePattern(AttentionSpec{}, 128, 8);
  out = CpuAttentionCompiled(AttentionSpec{}, compiled, q, k3, k3);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();

  // A corrupted layout (a key block past the end) is rejected before anything reads it.
  auto corrupt = *CompilePattern(AttentionSpec{}, 256, 8);
  corrupt.layout.col_idx.back() = 7;
  out = CpuAttentionCompiled(AttentionSpec{}, corrupt, q, k3, k3);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();

  // A dilated plan built for fewer heads than the inputs have.
  AttentionSpec dil;
  dil.pattern = DilatedSpec{{64}, {4}};
  auto few_heads = *CompilePattern(dil, 256, 2);
  out = CpuAttentionCompiled(dil, few_heads, q, k3, k3);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
}

// ---------------------------------------------------------------------------------------------
// Pieces: rectangular (query range x key range) parts merged with the LSE rule.

// Runs `spec` on [B, N, H, D] f32 inputs as a grid of pieces — query ranges against key ranges
// cut at `cuts` — and returns the merged accumulators as (O, LSE). Queries are read in place
// (q_row0 = the range's start); each key range is copied into a buffer of its own behind
// `kPad` rows of NaN, so a wrong k_row0 or a key read outside the range shows in the result.
struct PieceRun {
  absl::Status status;
  HostTensor o;    // [B, N, Hq, D] f32
  HostTensor lse;  // [B, Hq, N]
};
PieceRun RunPieces(const AttentionSpec& spec, const testing::QkvInputs& in,
                   const std::vector<int64_t>& cuts, int32_t tile, ThreadPool* pool) {
  constexpr int64_t kPad = 3;
  const int64_t B = in.q.dim(0), N = in.q.dim(1), Hq = in.q.dim(2), Hkv = in.k.dim(2),
                D = in.q.dim(3);
  PieceRun run{absl::OkStatus(), HostTensor::Create(DType::kF32, {B, N, Hq, D}).value(),
               HostTensor::Create(DType::kF32, {B, Hq, N}).value()};
  std::fill_n(run.o.data_as<float>(), run.o.numel(), 0.f);
  std::fill_n(run.lse.data_as<float>(), run.lse.numel(), -INFINITY);
  std::vector<HeadPair> heads;
  for (int64_t h = 0; h < Hq; ++h) {
    heads.push_back({static_cast<int32_t>(h), static_cast<int32_t>(h / (Hq / Hkv))});
  }
  const auto* dilated = std::get_if<DilatedSpec>(&spec.pattern);
  std::vector<int64_t> segments;  // rate-1 dilated: segments of the identity positions
  if (dilated != nullptr) {
    for (int64_t x = 0; x < N; x += dilated->segment_lengths[0]) segments.push_back(x);
    segments.push_back(N);
  }
  IntervalRule rule;
  rule.causal = spec.causal;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) rule.window = w->size;
  if (dilated != nullptr) rule.segment_starts = &segments;
  std::optional<BlockLayout> global;
  if (std::holds_alternative<BlockSparseSpec>(spec.pattern)) {
    global = CompileBlockLayout(spec, N).value();
  }
  CpuRunOptions options;
  options.pool = pool;
  for (size_t a = 0; a + 1 < cuts.size(); ++a) {
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t k0 = cuts[c], k1 = cuts[c + 1];
      RectLayout layout;
      if (global) {
        auto sliced = SliceBlockLayout(*global, cuts[a], cuts[a + 1], k0, k1);
        if (!sliced.ok()) {
          run.status = sliced.status();
          return run;
        }
        layout = *std::move(sliced);
      } else {
        layout = RectLayoutFromRule(rule, cuts[a], cuts[a + 1], k0, k1, tile);
      }
      const int64_t rows = kPad + (k1 - k0);
      std::vector<float> kbuf(B * rows * Hkv * D, NAN), vbuf(B * rows * Hkv * D, NAN);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t x = k0; x < k1; ++x) {
          for (int64_t e = 0; e < Hkv * D; ++e) {
            const int64_t dst = (b * rows + kPad + x - k0) * Hkv * D + e;
            kbuf[dst] = in.k.GetFloat((b * N + x) * Hkv * D + e);
            vbuf[dst] = in.v.GetFloat((b * N + x) * Hkv * D + e);
          }
        }
      }
      CpuPieceArgs args;
      args.batch = B;
      args.head_dim = D;
      args.q = in.q.data_as<float>();
      args.q_rows = N;
      args.q_heads = Hq;
      args.q_row0 = cuts[a];
      args.k = kbuf.data();
      args.v = vbuf.data();
      args.kv_rows = rows;
      args.kv_heads = Hkv;
      args.k_row0 = kPad;
      args.heads = heads;
      args.acc_o = run.o.data_as<float>();
      args.acc_lse = run.lse.data_as<float>();
      run.status = CpuAttentionPiece(spec, layout, args, options);
      if (!run.status.ok()) return run;
    }
  }
  return run;
}

// Every rule kind the ring cuts into pieces (dense, window, rate-1 dilated segments, block_sparse
// slices), causal and not, uneven cuts, GQA, a non-default scale: the merged pieces equal the
// float64 reference, inline and on the pool.
TEST(CpuPieceTest, MergedPiecesMatchReference) {
  const uint64_t seed = SeedAndPrint();
  const AttentionShape shape{2, 211, 4, 2, 32};
  const auto in = MakeRandomInputs(shape, DType::kF32, seed);
  std::vector<std::pair<std::string, AttentionSpec>> specs;
  specs.push_back({"dense", AttentionSpec{}});
  AttentionSpec window;
  window.pattern = WindowSpec{13};
  window.scale = 0.3f;
  specs.push_back({"window", window});
  AttentionSpec segments;
  segments.pattern = DilatedSpec{{50}, {1}};
  specs.push_back({"segments", segments});
  AttentionSpec sparse;
  sparse.pattern = BlockSparseSpec{64, StridedGen{2, 0}};
  specs.push_back({"block_sparse", sparse});
  for (auto& [name, base] : specs) {
    for (bool causal : {false, true}) {
      AttentionSpec spec = base;
      spec.causal = causal;
      SCOPED_TRACE(absl::StrCat(name, " causal=", causal, " seed ", seed));
      const auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
      ASSERT_TRUE(ref.ok()) << ref.status();
      // Block-sparse pieces must be cut on block boundaries; rule pieces anywhere.
      const std::vector<int64_t> cuts = std::holds_alternative<BlockSparseSpec>(spec.pattern)
                                            ? std::vector<int64_t>{0, 64, 192, 211}
                                            : std::vector<int64_t>{0, 37, 38, 150, 211};
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &Pool()}) {
        const PieceRun run = RunPieces(spec, in, cuts, /*tile=*/16, pool);
        ASSERT_TRUE(run.status.ok()) << run.status;
        EXPECT_TRUE(MatchesReference(*ref, run.o, &run.lse, DType::kF32));
      }
    }
  }
}

TEST(CpuPieceTest, InvalidLayoutsAndBuffersAreRejected) {
  const AttentionShape shape{1, 64, 2, 1, 16};
  const auto in = MakeRandomInputs(shape, DType::kF32, 3);
  std::vector<float> acc_o(64 * 2 * 16, 0.f), acc_lse(2 * 64, -INFINITY);
  const std::vector<HeadPair> heads = {{0, 0}, {1, 0}};
  CpuPieceArgs args;
  args.batch = 1;
  args.head_dim = 16;
  args.q = in.q.data_as<float>();
  args.q_rows = 64;
  args.q_heads = 2;
  args.k = in.k.data_as<float>();
  args.v = in.v.data_as<float>();
  args.kv_rows = 64;
  args.kv_heads = 1;
  args.heads = heads;
  args.acc_o = acc_o.data();
  args.acc_lse = acc_lse.data();
  const RectLayout good = RectLayoutFromRule(IntervalRule{}, 0, 64, 0, 64, 16);
  EXPECT_TRUE(CpuAttentionPiece(AttentionSpec{}, good, args).ok());

  RectLayout bad_col = good;
  bad_col.col_idx.back() = 4;  // only 4 key tiles
  EXPECT_EQ(CpuAttentionPiece(AttentionSpec{}, bad_col, args).code(),
            absl::StatusCode::kInvalidArgument);
  RectLayout bad_rows = good;
  bad_rows.row_ptr.pop_back();
  EXPECT_EQ(CpuAttentionPiece(AttentionSpec{}, bad_rows, args).code(),
            absl::StatusCode::kInvalidArgument);
  CpuPieceArgs past_end = args;
  past_end.k_row0 = 1;  // keys [1, 65) of a 64-row buffer
  EXPECT_EQ(CpuAttentionPiece(AttentionSpec{}, good, past_end).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<HeadPair> bad_heads = {{0, 1}};
  CpuPieceArgs wrong_head = args;
  wrong_head.heads = bad_heads;
  EXPECT_EQ(CpuAttentionPiece(AttentionSpec{}, good, wrong_head).code(),
            absl::StatusCode::kInvalidArgument);
  std::atomic<bool> cancel{true};
  CpuRunOptions cancelled;
  cancelled.cancel = &cancel;
  EXPECT_EQ(CpuAttentionPiece(AttentionSpec{}, good, args, cancelled).code(),
            absl::StatusCode::kCancelled);
}

TEST(CpuBackendTest, MemoryTrackerReturnsToBaseline) {
  const AttentionShape shape{1, 300, 4, 2, 64};
  const auto in = MakeRandomInputs(shape, DType::kBF16, SeedAndPrint());
  MemoryTracker tracker;
  CpuRunOptions options;
  options.pool = &Pool();
  options.tracker = &tracker;
  for (const AttentionPattern& p :
       {AttentionPattern{DenseSpec{}}, AttentionPattern{DilatedSpec{{64, 256}, {1, 4}}}}) {
    AttentionSpec spec;
    spec.pattern = p;
    tracker.ResetPeak();
    {
      auto out = CpuAttention(spec, in.q, in.k, in.v, options);
      ASSERT_TRUE(out.ok()) << out.status();
      const int64_t outputs = out->o.nbytes() + out->lse.nbytes();
      EXPECT_EQ(tracker.in_use_bytes(), outputs);
      // The float32 workspaces were charged while the run lasted.
      const int64_t workspaces = 4 * (shape.q_heads + 2 * shape.kv_heads) * 300 * 64;
      EXPECT_GE(tracker.peak_bytes(), outputs + workspaces);
    }
    EXPECT_EQ(tracker.in_use_bytes(), 0);
  }
}

}  // namespace
}  // namespace attnserve
