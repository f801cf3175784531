// The CUDA backend against the float64 reference: every spec kind and generator, causal and not,
// GQA, ragged lengths, head dims 64/128, bf16/f16/f32 inputs. Device outputs are poisoned with
// 0xFF bytes (NaN in every dtype) before each launch, so an element the kernels skip fails.
// Skips cleanly when there is no GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_device.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::PlanRunResult;
using ::attnserve::testing::RunPlanOnGpu;
using ::attnserve::testing::ShapeString;

// The project's GPU tolerances: max |o - ref| / max |ref|.
double OTol(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 5e-3;
    case DType::kBF16:
      return 1e-2;
    case DType::kF32:
      return testing::kF32InputOTolerance;  // computed in bf16 (cuda_attention.h)
  }
  return 0;
}
// LSE is f32 from exact low-precision inputs; f32 inputs are rounded to bf16 first.
double LseTol(DType dtype) { return dtype == DType::kF32 ? testing::kF32InputLseTolerance : 2e-3; }

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype;
};

std::string DTypeTag(DType d) { return std::string(DTypeName(d)); }

// The CSR generator's test layout: row i keeps block 0, block i - 2 and block i (when in range,
// ascending, distinct), and every fifth row keeps nothing (rows with no key: O = 0, LSE = -inf).
CsrGen TestCsr(int64_t nb) {
  CsrGen g;
  g.row_ptr.push_back(0);
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 5 != 3) {
      std::vector<int64_t> cols = {0};
      if (i - 2 > 0) cols.push_back(i - 2);
      if (i > 0) cols.push_back(i);
      for (int64_t c : cols) g.col_idx.push_back(c);
    }
    g.row_ptr.push_back(static_cast<int64_t>(g.col_idx.size()));
  }
  return g;
}

std::vector<std::pair<std::string, AttentionPattern>> Patterns(int64_t n) {
  std::vector<std::pair<std::string, AttentionPattern>> p;
  p.push_back({"dense", DenseSpec{}});
  p.push_back({"window100", WindowSpec{100}});
  p.push_back({"dilated3", DilatedSpec{{128, 256, 512}, {1, 2, 4}}});
  // No rate-1 branch: some (head, position) pairs belong to no branch -> empty rows.
  p.push_back({"dilated_gaps", DilatedSpec{{64, 256}, {2, 4}}});
  for (int32_t bs : {64, 128}) {
    const std::string b = absl::StrCat("bs", bs, "_");
    auto sparse = [&](BlockGenerator g) { return BlockSparseSpec{bs, std::move(g)}; };
    p.push_back({b + "local_window", sparse(LocalWindowGen{1})});
    p.push_back({b + "dilated_sparse", sparse(DilatedSparseGen{{2, 3}})});
    p.push_back({b + "global_local", sparse(GlobalLocalGen{1, 1})});
    p.push_back({b + "strided", sparse(StridedGen{3, 0})});
    p.push_back({b + "random", sparse(RandomGen{0.3, 1234})});
    p.push_back({b + "csr", sparse(TestCsr(NumBlocks(n, bs)))});
  }
  return p;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  struct ShapeVariant {
    std::string tag;
    int64_t b, n, hq, hkv;
  };
  // Ragged N with GQA (g = 2) and an exact multiple without GQA, two batches.
  const ShapeVariant variants[] = {{"n300_gqa", 1, 300, 4, 2}, {"n256_b2", 2, 256, 2, 2}};
  for (const ShapeVariant& sv : variants) {
    for (const auto& [pname, pattern] : Patterns(sv.n)) {
      for (bool causal : {false, true}) {
        for (int64_t d : {64, 128}) {
          for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
            // f32 goes through the bf16 kernel: one head dim is enough on the second variant.
            if (sv.tag == "n256_b2" && dt == DType::kF32 && d == 64) continue;
            Case c;
            c.spec.pattern = pattern;
            c.spec.causal = causal;
            c.shape = {sv.b, sv.n, sv.hq, sv.hkv, d};
            c.dtype = dt;
            c.name = absl::StrCat(pname, causal ? "_causal" : "", "_", sv.tag, "_d", d, "_",
                                  DTypeTag(dt));
            cases.push_back(std::move(c));
          }
        }
      }
    }
  }
  // Multi-tile rows and a non-default scale.
  {
    Case c;
    c.spec.pattern = BlockSparseSpec{128, RandomGen{0.4, 7}};
    c.spec.causal = true;
    c.spec.scale = 0.3f;
    c.shape = {1, 1500, 2, 1, 128};
    c.dtype = DType::kBF16;
    c.name = "long_random_causal_scale_d128_bf16";
    cases.push_back(c);
    c.spec.pattern = DenseSpec{};
    c.spec.causal = false;
    c.spec.scale = 0.f;
    c.shape = {1, 1100, 2, 2, 64};
    c.dtype = DType::kF16;
    c.name = "long_dense_d64_f16";
    cases.push_back(c);
  }
  return cases;
}

class CudaAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(c.name, " ", ShapeString(c.shape, c.dtype), " seed=", seed));
  std::printf("[ case ] %s seed=%llu\n", c.name.c_str(), static_cast<unsigned long long>(seed));
  auto in = MakeRandomInputs(c.shape, c.dtype, seed);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  // On device buffers with poisoned outputs (RunPlanOnGpu).
  absl::StatusOr<PlanRunResult> run = RunPlanOnGpu(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(run.ok()) << run.status();
  // Everything went back to the cache.
  EXPECT_EQ(run->in_use_after, 0);
  const ErrorStats e = CompareToReference(*ref, run->o, &run->lse);
  EXPECT_EQ(e.nonfinite, 0) << "unwritten or non-finite outputs";
  EXPECT_LE(e.o_rel, OTol(c.dtype)) << "o max abs err " << e.o_max_abs << " / max|ref| "
                                    << e.o_ref_max_abs;
  EXPECT_LE(e.lse_max_abs, LseTol(c.dtype));
  EXPECT_GT(e.checked, 0);
}

INSTANTIATE_TEST_SUITE_P(AllSpecs, CudaAttentionTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// The Device path (host tensors in, host tensors out) and its memory accounting.
TEST(CudaDeviceTest, RunMatchesReferenceAndFreesMemory) {
  SKIP_WITHOUT_GPU();
  auto devices = MakeCudaDevices({0});
  ASSERT_TRUE(devices.ok()) << devices.status();
  Device& dev = *(*devices)[0];
  EXPECT_EQ(dev.name(), "cuda:0");
  EXPECT_EQ(dev.kind(), BackendKind::kCuda);
  EXPECT_FALSE(dev.uuid().empty());
  std::printf("device %s %s %s\n", dev.name().c_str(), dev.model().c_str(), dev.uuid().c_str());
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  for (AttentionPattern pattern :
       {AttentionPattern(DilatedSpec{{128, 512}, {1, 4}}),
        AttentionPattern(BlockSparseSpec{64, RandomGen{0.25, 99}}),
        AttentionPattern(WindowSpec{37})}) {
    AttentionSpec spec;
    spec.pattern = pattern;
    spec.causal = true;
    const AttentionShape shape{1, 777, 4, 1, 128};
    auto in = MakeRandomInputs(shape, DType::kBF16, seed);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_GT(dev.EstimateBytes(spec, shape, DType::kBF16), 0);
    RunInfo info;
    auto out = dev.Run(spec, in.q, in.k, in.v, RunControl{}, &info);
    ASSERT_TRUE(out.ok()) << out.status();
    const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.o_rel, 1e-2);
    EXPECT_LE(e.lse_max_abs, 2e-3);
    EXPECT_GT(info.flops, 0);
    EXPECT_GT(info.compute_seconds, 0);
    const DeviceStats s = dev.Stats();
    EXPECT_EQ(s.memory_used_bytes, 0);
    EXPECT_GT(s.memory_reserved_bytes, 0);
    EXPECT_GT(s.memory_peak_bytes, 0);
    EXPECT_GT(s.memory_total_bytes, 0);
  }
}

TEST(CudaDeviceTest, CancelledRunReturnsCancelled) {
  SKIP_WITHOUT_GPU();
  auto devices = MakeCudaDevices({0});
  ASSERT_TRUE(devices.ok()) << devices.status();
  const AttentionShape shape{1, 256, 2, 2, 64};
  auto in = MakeRandomInputs(shape, DType::kF16, FreshSeed());
  std::atomic<bool> cancel{true};
  RunControl control;
  control.cancel = &cancel;
  auto out = (*devices)[0]->Run(AttentionSpec{}, in.q, in.k, in.v, control, nullptr);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*devices)[0]->Stats().memory_used_bytes, 0);
}

TEST(CudaDeviceTest, UnsupportedHeadDimIsAnError) {
  SKIP_WITHOUT_GPU();
  auto devices = MakeCudaDevices({0});
  ASSERT_TRUE(devices.ok());
  const AttentionShape shape{1, 64, 1, 1, 96};
  auto in = MakeRandomInputs(shape, DType::kBF16, 1);
  auto out = (*devices)[0]->Run(AttentionSpec{}, in.q, in.k, in.v, RunControl{}, nullptr);
  EXPECT_FALSE(out.ok());
}

TEST(CudaDeviceTest, BadOrdinalIsInvalidArgument) {
  SKIP_WITHOUT_GPU();
  auto devices = MakeCudaDevices({CudaDeviceCount()});
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaDeviceCountTest, NeverCrashes) { EXPECT_GE(CudaDeviceCount(), 0); }

// ---- caching allocator ----------------------------------------------------------------------

TEST(CachingAllocatorTest, CountsReturnToZeroAndCacheIsReused) {
  SKIP_WITHOUT_GPU();
  CachingAllocator alloc(0);
  std::vector<void*> ptrs;
  size_t want = 0;
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{1} << 20, size_t{3} << 20,
                       size_t{100} << 20}) {
    auto p = alloc.Allocate(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_NE(*p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
    ptrs.push_back(*p);
    want += CachingAllocator::RoundSize(bytes);
  }
  AllocatorStats s = alloc.Stats();
  EXPECT_EQ(s.in_use_bytes, static_cast<int64_t>(want));
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(want));
  EXPECT_EQ(s.peak_bytes, static_cast<int64_t>(want));
  EXPECT_GT(s.total_bytes, 0);
  EXPECT_GT(s.free_bytes, 0);
  for (void* p : ptrs) alloc.Free(p);
  s = alloc.Stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(want));
  EXPECT_EQ(s.peak_bytes, static_cast<int64_t>(want));
  // Same sizes again: all served from the cache, no new cudaMalloc.
  const int64_t mallocs = s.num_mallocs;
  auto again = alloc.Allocate(size_t{3} << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(alloc.Stats().num_mallocs, mallocs);
  EXPECT_GE(alloc.Stats().cache_hits, 1);
  alloc.Free(*again);
  alloc.EmptyCache();
  s = alloc.Stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  alloc.ResetPeak();
  EXPECT_EQ(alloc.Stats().peak_bytes, 0);
}

TEST(CachingAllocatorTest, HugeAllocationIsResourceExhausted) {
  SKIP_WITHOUT_GPU();
  CachingAllocator alloc(0);
  auto p = alloc.Allocate(size_t{1} << 50);  // 1 PiB
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  EXPECT_EQ(alloc.Stats().in_use_bytes, 0);
  // The allocator (and the CUDA context) still work afterwards.
  auto q = alloc.Allocate(4096);
  ASSERT_TRUE(q.ok()) << q.status();
  alloc.Free(*q);
}

TEST(CachingAllocatorTest, DeviceBufferFreesOnDestruction) {
  SKIP_WITHOUT_GPU();
  CachingAllocator alloc(0);
  {
    auto b = DeviceBuffer::Create(alloc, 12345);
    ASSERT_TRUE(b.ok());
    EXPECT_GT(alloc.Stats().in_use_bytes, 0);
    DeviceBuffer moved = std::move(*b);
    EXPECT_GT(alloc.Stats().in_use_bytes, 0);
  }
  EXPECT_EQ(alloc.Stats().in_use_bytes, 0);
}

TEST(CachingAllocatorTest, RoundSizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize((1u << 20) + 1), 2u << 20);
  EXPECT_GE(CachingAllocator::RoundSize(100u << 20), 100u << 20);
  EXPECT_LE(CachingAllocator::RoundSize(100u << 20), (100u << 20) + (100u << 20) / 8);
}

}  // namespace
}  // namespace attnserve
