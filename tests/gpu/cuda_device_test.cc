// CudaDevice (the server's GPU path: host tensors in, host tensors out) against the float64
// reference, per attention engine: dense, causal and window specs run on cuDNN (core/cuda/
// cudnn_sdpa) where it is available and on our flash_fwd kernels otherwise; block_sparse and
// dilated specs always on flash_fwd. Each case runs on three fresh devices of GPU 0, one per engine
// mode (auto, own, cudnn), on fresh seeded inputs (the seed is printed; ATTN_TEST_SEED replays it),
// and checks the outputs, RunInfo (engine, flops) and that the allocator's in-use bytes return to
// zero. Skips where there is no GPU; the cuDNN expectations skip, with the reason printed, where
// this build or host has no usable cuDNN.
//
// Poisoning: a Device allocates its own outputs, so each checked run is preceded by a run of the
// same case on inputs of 0xFF bytes (NaN in every dtype) on the same, fresh device. Its device
// buffers (NaN inputs, outputs computed from them) go back to the device's otherwise empty caching
// allocator and are handed out again for the checked run, which asks for the same sizes in the same
// order, so an output element the checked run does not write holds poison-run data, not zeros.
#include "core/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/engine_table.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::PoisonedOutput;
using ::attnserve::testing::QkvInputs;
using ::attnserve::testing::ShapeString;

// Tolerances (max |o - ref| / max |ref|; LSE absolute): one output rounding plus accumulation in
// f16/bf16; f32 inputs are computed in bf16 by both engines (see cuda_attention.h).
double OTol(DType dtype) {
  return dtype == DType::kF16 ? 5e-3 : (dtype == DType::kF32 ? testing::kF32InputOTolerance : 1e-2);
}
double LseTol(DType dtype) { return dtype == DType::kF32 ? testing::kF32InputLseTolerance : 2e-3; }

// A fresh device on GPU 0 with `engine` forced: an empty allocator cache (see the poisoning note
// above) and no engine memory from earlier cases.
std::unique_ptr<Device> MakeDevice(AttentionEngine engine) {
  CudaOptions options;
  options.engine = engine;
  auto made = MakeCudaDevices({0}, options);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  return std::move((*made)[0]);
}

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype;
};

AttentionSpec Spec(AttentionPattern pattern, bool causal) {
  AttentionSpec s;
  s.pattern = std::move(pattern);
  s.causal = causal;
  return s;
}

bool CudnnPattern(const AttentionSpec& spec) {
  return std::holds_alternative<DenseSpec>(spec.pattern) ||
         std::holds_alternative<WindowSpec>(spec.pattern);
}

// N is never a multiple of 128 (nor of 64); GQA where Hkv < Hq.
std::vector<Case> AllCases() {
  return {
      {"dense_bf16", Spec(DenseSpec{}, false), {1, 700, 4, 4, 128}, DType::kBF16},
      {"dense_causal_f16_gqa", Spec(DenseSpec{}, true), {2, 333, 4, 2, 64}, DType::kF16},
      {"dense_f32_gqa", Spec(DenseSpec{}, false), {1, 300, 4, 1, 128}, DType::kF32},
      {"causal_f32", Spec(DenseSpec{}, true), {1, 421, 2, 2, 64}, DType::kF32},
      {"window_bf16_gqa", Spec(WindowSpec{37}, false), {1, 777, 4, 1, 128}, DType::kBF16},
      {"window_causal_f16", Spec(WindowSpec{100}, true), {1, 500, 2, 2, 64}, DType::kF16},
      {"window_causal_f32", Spec(WindowSpec{64}, true), {1, 390, 2, 1, 128}, DType::kF32},
      {"block_sparse_random_bf16",
       Spec(BlockSparseSpec{64, RandomGen{0.3, 99}}, true),
       {1, 700, 4, 2, 128},
       DType::kBF16},
      {"block_sparse_local_window_f16",
       Spec(BlockSparseSpec{128, LocalWindowGen{2}}, false),
       {1, 1000, 2, 2, 64},
       DType::kF16},
      {"block_sparse_local_window_f32",
       Spec(BlockSparseSpec{64, LocalWindowGen{3}}, true),
       {1, 650, 2, 1, 64},
       DType::kF32},
      {"dilated_bf16",
       Spec(DilatedSpec{{128, 256}, {1, 2}}, false),
       {1, 600, 4, 4, 64},
       DType::kBF16},
      {"dilated_causal_f32_gqa",
       Spec(DilatedSpec{{128, 512}, {1, 4}}, true),
       {1, 777, 4, 2, 128},
       DType::kF32},
  };
}

// q, k, v of 0xFF bytes: NaN in every dtype.
QkvInputs NanInputs(const AttentionShape& s, DType dtype) {
  const AttentionShape kv{s.batch, s.tokens, s.kv_heads, s.kv_heads, s.head_dim};
  return QkvInputs{PoisonedOutput(s, dtype), PoisonedOutput(kv, dtype), PoisonedOutput(kv, dtype)};
}

struct Outcome {
  absl::Status status;
  AttentionOutputs out;
  RunInfo info;
};

// On a fresh device: the poison run, then the checked run of `in`; in-use bytes must be back to
// zero after each.
Outcome RunChecked(AttentionEngine engine, const Case& c, const QkvInputs& in) {
  Outcome r;
  std::unique_ptr<Device> device = MakeDevice(engine);
  if (device == nullptr) {
    r.status = absl::InternalError("MakeCudaDevices failed");
    return r;
  }
  Device& dev = *device;
  const QkvInputs nan = NanInputs(c.shape, c.dtype);
  auto poison = dev.Run(c.spec, nan.q, nan.k, nan.v, RunControl{}, nullptr);
  EXPECT_EQ(dev.Stats().memory_used_bytes, 0) << "after the poison run";
  if (!poison.ok()) {
    r.status = poison.status();
    return r;
  }
  auto out = dev.Run(c.spec, in.q, in.k, in.v, RunControl{}, &r.info);
  const DeviceStats s = dev.Stats();
  EXPECT_EQ(s.memory_used_bytes, 0) << "after the checked run";
  EXPECT_GT(s.memory_reserved_bytes, 0);
  EXPECT_GT(s.memory_peak_bytes, 0);
  if (!out.ok()) {
    r.status = out.status();
    return r;
  }
  r.out = *std::move(out);
  return r;
}

void ExpectMatches(const ReferenceResult& ref, const Outcome& r, DType dtype,
                   const std::string& what) {
  const ErrorStats e = CompareToReference(ref, r.out.o, &r.out.lse);
  EXPECT_EQ(e.nonfinite, 0) << what;
  EXPECT_LE(e.o_rel, OTol(dtype)) << what << ": o max abs err " << e.o_max_abs << " / max|ref| "
                                  << e.o_ref_max_abs;
  EXPECT_LE(e.lse_max_abs, LseTol(dtype)) << what;
  std::printf("  %-6s engine=%-9s o_rel=%.3e lse_max_abs=%.3e\n", what.c_str(),
              r.info.engine.c_str(), e.o_rel, e.lse_max_abs);
}

class CudaDeviceEngineTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDeviceEngineTest, EveryEngineModeMatchesReference) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(c.name, " ", ShapeString(c.shape, c.dtype), " seed=", seed));
  std::printf("%s %s seed=%llu\n", c.name.c_str(), ShapeString(c.shape, c.dtype).c_str(),
              static_cast<unsigned long long>(seed));
  const QkvInputs in = MakeRandomInputs(c.shape, c.dtype, seed);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const bool cudnn_pattern = CudnnPattern(c.spec);

  // own: flash_fwd for every spec.
  const Outcome own = RunChecked(AttentionEngine::kOwn, c, in);
  ASSERT_TRUE(own.status.ok()) << own.status;
  ExpectMatches(*ref, own, c.dtype, "own");
  EXPECT_EQ(own.info.engine, kEngineFlashFwd);
  EXPECT_FALSE(own.info.kernel.empty()) << "RunInfo::kernel names the flash kernel that ran";
  EXPECT_GT(own.info.flops, 0);
  EXPECT_GT(own.info.compute_seconds, 0);

  // cudnn: cuDNN for dense/window (no fallback), flash_fwd for the rest.
  const Outcome forced = RunChecked(AttentionEngine::kCudnn, c, in);
  bool cudnn_ran = false;
  if (!forced.status.ok() && cudnn_pattern &&
      (forced.status.code() == absl::StatusCode::kUnavailable ||
       forced.status.code() == absl::StatusCode::kUnimplemented)) {
    std::printf("  cudnn  skipped: %s\n", forced.status.ToString().c_str());
  } else {
    ASSERT_TRUE(forced.status.ok()) << forced.status;
    ExpectMatches(*ref, forced, c.dtype, "cudnn");
    EXPECT_EQ(forced.info.engine, cudnn_pattern ? kEngineCudnn : kEngineFlashFwd);
    cudnn_ran = cudnn_pattern;
    // Both engines report the same exact pair count.
    EXPECT_NEAR(forced.info.flops, own.info.flops, 1e-9 * own.info.flops);
    EXPECT_GE(forced.info.sparsity, 0);
    EXPECT_LT(forced.info.sparsity, 1);
    // The two engines agree with each other as closely as each does with the reference.
    ASSERT_EQ(own.out.o.numel(), forced.out.o.numel());
    double max_ref = 0, max_diff = 0;
    for (double x : ref->o) max_ref = std::max(max_ref, std::abs(x));
    for (int64_t i = 0; i < own.out.o.numel(); ++i) {
      max_diff =
          std::max(max_diff,
                   static_cast<double>(std::abs(own.out.o.GetFloat(i) - forced.out.o.GetFloat(i))));
    }
    EXPECT_LE(max_diff / std::max(max_ref, 1e-30), 2 * OTol(c.dtype))
        << "own vs cudnn: max abs diff " << max_diff;
  }

  // auto: what the server runs. cuDNN exactly where the forced run showed it can, unless the
  // built-in engine table measured our kernel faster for this case on this GPU model.
  const Outcome autorun = RunChecked(AttentionEngine::kAuto, c, in);
  ASSERT_TRUE(autorun.status.ok()) << autorun.status;
  ExpectMatches(*ref, autorun, c.dtype, "auto");
  bool table_own = false;
  if (std::unique_ptr<Device> probe = MakeDevice(AttentionEngine::kAuto); probe != nullptr) {
    const auto measured = BuiltinEngineTable()->Lookup(probe->model(), PatternName(c.spec.pattern),
                                                       c.spec.causal, c.dtype, c.shape.head_dim,
                                                       c.shape.tokens);
    table_own = measured.has_value() && measured->engine == EngineTableChoice::kOwn;
  }
  EXPECT_EQ(autorun.info.engine, cudnn_ran && !table_own ? kEngineCudnn : kEngineFlashFwd);
  EXPECT_NEAR(autorun.info.flops, own.info.flops, 1e-9 * own.info.flops);
}

INSTANTIATE_TEST_SUITE_P(Specs, CudaDeviceEngineTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// A head dim our kernels lack (96): auto keeps cuDNN off it (so the answer does not depend on the
// host's libcudnn) and fails like the own path; forced cudnn runs it where cuDNN is usable.
TEST(CudaDeviceEngineModes, HeadDimOutsideOwnKernels) {
  SKIP_WITHOUT_GPU();
  const Case c{"dense_d96", Spec(DenseSpec{}, true), {1, 300, 2, 2, 96}, DType::kBF16};
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QkvInputs in = MakeRandomInputs(c.shape, c.dtype, seed);
  std::unique_ptr<Device> autodev = MakeDevice(AttentionEngine::kAuto);
  std::unique_ptr<Device> cudnn = MakeDevice(AttentionEngine::kCudnn);
  ASSERT_TRUE(autodev != nullptr && cudnn != nullptr);
  EXPECT_FALSE(autodev->Run(c.spec, in.q, in.k, in.v, RunControl{}, nullptr).ok());
  EXPECT_EQ(autodev->Stats().memory_used_bytes, 0);
  RunInfo info;
  auto out = cudnn->Run(c.spec, in.q, in.k, in.v, RunControl{}, &info);
  if (!out.ok()) GTEST_SKIP() << "cuDNN cannot run it here: " << out.status();
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LE(e.o_rel, OTol(c.dtype));
  EXPECT_LE(e.lse_max_abs, LseTol(c.dtype));
  EXPECT_EQ(info.engine, kEngineCudnn);
  EXPECT_EQ(cudnn->Stats().memory_used_bytes, 0);
}

// Auto mode reads the engine table: a row of this GPU's model that has our kernel faster keeps
// the case on it (cuDNN is never asked); a row that has cuDNN faster, or none, leaves it on
// cuDNN. Both answers are checked against the reference.
TEST(CudaDeviceEngineModes, EngineTableMovesACaseToOurKernel) {
  SKIP_WITHOUT_GPU();
#ifndef ATTNSERVE_HAVE_CUDNN_FRONTEND
  GTEST_SKIP() << "no cuDNN path in this build";
#endif
  const Case c{"dense_causal", Spec(DenseSpec{}, true), {1, 1024, 4, 4, 128}, DType::kBF16};
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QkvInputs in = MakeRandomInputs(c.shape, c.dtype, seed);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::unique_ptr<Device> probe = MakeDevice(AttentionEngine::kAuto);
  ASSERT_TRUE(probe != nullptr);
  const std::string model = probe->model();
  probe.reset();
  for (bool own_faster : {true, false}) {
    SCOPED_TRACE(own_faster ? "own faster" : "cuDNN faster");
    const std::string csv =
        absl::StrCat(std::string(kEngineTableHeader), "\n", model, ",bf16,128,true,dense,2048,",
                     own_faster ? "1.0,2.0" : "2.0,1.0", ",test\n");
    absl::StatusOr<EngineTable> table = EngineTable::Parse(csv, "test");
    ASSERT_TRUE(table.ok()) << table.status();
    CudaOptions options;
    options.engine = AttentionEngine::kAuto;
    options.engine_table = std::make_shared<const EngineTable>(*std::move(table));
    auto made = MakeCudaDevices({0}, options);
    ASSERT_TRUE(made.ok()) << made.status();
    Device& dev = *(*made)[0];
    RunInfo info;
    auto out = dev.Run(c.spec, in.q, in.k, in.v, RunControl{}, &info);
    ASSERT_TRUE(out.ok()) << out.status();
    if (!own_faster && info.engine != kEngineCudnn) GTEST_SKIP() << "cuDNN does not load here";
    EXPECT_EQ(info.engine, own_faster ? kEngineFlashFwd : kEngineCudnn);
    const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.o_rel, OTol(c.dtype));
    EXPECT_LE(e.lse_max_abs, LseTol(c.dtype));
  }
}

TEST(CudaDeviceEngineModes, CancelledBeforeTheEngineRuns) {
  SKIP_WITHOUT_GPU();
  const AttentionShape shape{1, 256, 2, 2, 64};
  const QkvInputs in = MakeRandomInputs(shape, DType::kBF16, FreshSeed());
  std::atomic<bool> cancel{true};
  RunControl control;
  control.cancel = &cancel;
  for (AttentionEngine e : {AttentionEngine::kAuto, AttentionEngine::kOwn}) {
    std::unique_ptr<Device> device = MakeDevice(e);
    ASSERT_TRUE(device != nullptr);
    Device& dev = *device;
    auto out = dev.Run(Spec(DenseSpec{}, true), in.q, in.k, in.v, control, nullptr);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(dev.Stats().memory_used_bytes, 0);
  }
}

TEST(CudaDeviceEngineModes, EstimateAddsTheCudnnMarginOnlyWhereCudnnMayRun) {
  SKIP_WITHOUT_GPU();
  const AttentionShape shape{1, 4096, 8, 8, 128};
  const AttentionSpec dense = Spec(DenseSpec{}, true);
  const AttentionSpec dilated = Spec(DilatedSpec{{1024, 2048}, {1, 2}}, false);
  std::unique_ptr<Device> own_device = MakeDevice(AttentionEngine::kOwn);
  std::unique_ptr<Device> auto_device = MakeDevice(AttentionEngine::kAuto);
  ASSERT_TRUE(own_device != nullptr && auto_device != nullptr);
  Device& own = *own_device;
  Device& autodev = *auto_device;
  const int64_t io = shape.tokens * (2 * shape.q_heads + 2 * shape.kv_heads) * shape.head_dim * 2;
  EXPECT_GE(own.EstimateBytes(dense, shape, DType::kBF16), io);
  EXPECT_EQ(own.EstimateBytes(dilated, shape, DType::kBF16),
            autodev.EstimateBytes(dilated, shape, DType::kBF16));
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  EXPECT_GT(autodev.EstimateBytes(dense, shape, DType::kBF16),
            own.EstimateBytes(dense, shape, DType::kBF16));
#endif
}

TEST(AttentionEngineOption, ParsesNamesAndRejectsOthers) {
  for (AttentionEngine e :
       {AttentionEngine::kAuto, AttentionEngine::kOwn, AttentionEngine::kCudnn}) {
    auto parsed = ParseAttentionEngine(AttentionEngineName(e));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, e);
  }
  EXPECT_EQ(*ParseAttentionEngine(""), AttentionEngine::kAuto);
  EXPECT_EQ(ParseAttentionEngine("fastest").status().code(), absl::StatusCode::kInvalidArgument);
}

// A bad ATTNSERVE_ATTENTION_ENGINE is a configuration error, with or without a GPU: the
// environment is read once, by CudaOptionsFromEnv (MakeCudaDevices reads nothing).
TEST(AttentionEngineOption, BadEnvironmentValueIsInvalidArgument) {
  constexpr char kEnv[] = "ATTNSERVE_ATTENTION_ENGINE";
  const char* old = std::getenv(kEnv);
  const std::string saved = old != nullptr ? old : "";
  setenv(kEnv, "fastest", 1);
  auto options = CudaOptionsFromEnv();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << options.status();
  setenv(kEnv, "own", 1);
  options = CudaOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->engine, AttentionEngine::kOwn);
  if (old != nullptr) {
    setenv(kEnv, saved.c_str(), 1);
  } else {
    unsetenv(kEnv);
  }
}

// ---- lanes: Run from two threads at once on one device ------------------------------------------

// `t` copied into the device's host memory (page-locked): copies from it are asynchronous, so the
// lanes' copies can overlap.
HostTensor Pinned(Device& dev, const HostTensor& t) {
  HostTensor p = *HostTensor::Create(t.dtype(), t.dims(), nullptr, &dev.host_memory());
  std::memcpy(p.data(), t.data(), t.nbytes());
  return p;
}

std::unique_ptr<Device> MakeLanesDevice(AttentionEngine engine, int lanes) {
  CudaOptions options;
  options.engine = engine;
  options.lanes = lanes;
  auto made = MakeCudaDevices({0}, options);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  return std::move((*made)[0]);
}

// Two threads run different cases (own kernels and, where it loads, cuDNN; f32 ones whose plan
// takes workspaces from the shared allocator; block-sparse and dilated) on one device of two
// lanes, several times each on fresh seeded inputs: every output matches the float64 reference
// element-wise.
TEST(CudaDeviceLanes, ConcurrentRunsMatchReference) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Device> dev = MakeLanesDevice(AttentionEngine::kAuto, 2);
  ASSERT_TRUE(dev != nullptr);
  EXPECT_EQ(dev->lanes(), 2);
  const std::vector<Case> all = AllCases();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  constexpr int kRounds = 3;
  struct Work {
    const Case* c;
    QkvInputs in;
    ReferenceResult ref;
    Outcome got;
  };
  // Thread t runs cases t, t + 2, t + 4, ...; each round on new inputs.
  std::vector<std::vector<Work>> work(2);
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < all.size(); ++i) {
      Work w{&all[i], MakeRandomInputs(all[i].shape, all[i].dtype, seed + 97 * round + i), {}, {}};
      auto ref = ReferenceAttention(w.c->spec, w.in.q, w.in.k, w.in.v);
      ASSERT_TRUE(ref.ok()) << ref.status();
      w.ref = *std::move(ref);
      w.in = QkvInputs{Pinned(*dev, w.in.q), Pinned(*dev, w.in.k), Pinned(*dev, w.in.v)};
      work[i % 2].push_back(std::move(w));
    }
  }
  std::vector<std::thread> threads;
  for (auto& list : work) {
    threads.emplace_back([&dev, &list] {
      for (Work& w : list) {
        auto out = dev->Run(w.c->spec, w.in.q, w.in.k, w.in.v, RunControl{}, &w.got.info);
        w.got.status = out.status();
        if (out.ok()) w.got.out = *std::move(out);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& list : work) {
    for (const Work& w : list) {
      SCOPED_TRACE(w.c->name);
      ASSERT_TRUE(w.got.status.ok()) << w.got.status;
      ExpectMatches(w.ref, w.got, w.c->dtype, "lanes");
    }
  }
  EXPECT_EQ(dev->Stats().memory_used_bytes, 0);
}

// The case the lanes are for: a 4096-token GQA bf16 request (48 MiB in, 32 MiB out), mostly
// copies. Prints N sequential runs against the same N from two threads (not asserted: timing).
TEST(CudaDeviceLanes, TwoThreadsOverlapCopiesTiming) {
  SKIP_WITHOUT_GPU();
  const AttentionShape shape{1, 4096, 32, 8, 128};
  const AttentionSpec spec = Spec(DenseSpec{}, true);
  for (int lanes : {1, 2}) {
    std::unique_ptr<Device> dev = MakeLanesDevice(AttentionEngine::kAuto, lanes);
    ASSERT_TRUE(dev != nullptr);
    const QkvInputs raw = MakeRandomInputs(shape, DType::kBF16, 7);
    const QkvInputs in{Pinned(*dev, raw.q), Pinned(*dev, raw.k), Pinned(*dev, raw.v)};
    auto run = [&] {
      auto out = dev->Run(spec, in.q, in.k, in.v, RunControl{}, nullptr);
      EXPECT_TRUE(out.ok()) << out.status();
    };
    auto two_threads = [&](int runs_each) {
      std::vector<std::thread> threads;
      for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&] {
          for (int i = 0; i < runs_each; ++i) run();
        });
      }
      for (std::thread& t : threads) t.join();
    };
    // Warm-up on every lane: its cuDNN engine and graph, the allocator and pinned caches.
    two_threads(5);
    constexpr int kRuns = 60;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns; ++i) run();
    const auto t1 = std::chrono::steady_clock::now();
    two_threads(kRuns / 2);
    const auto t2 = std::chrono::steady_clock::now();
    const double seq = std::chrono::duration<double>(t1 - t0).count();
    const double par = std::chrono::duration<double>(t2 - t1).count();
    std::printf("lanes=%d: %d runs of %s: sequential %.3f ms/run (%.0f/s), 2 threads %.3f ms/run "
                "(%.0f/s), speed-up %.2fx\n",
                lanes, kRuns, ShapeString(shape, DType::kBF16).c_str(), 1e3 * seq / kRuns,
                kRuns / seq, 1e3 * par / kRuns, kRuns / par, seq / par);
  }
}

}  // namespace
}  // namespace attnserve
