// DilatedRingAttentionCuda (core/parallel/dilated_ring_cuda) against the float64 reference on 2 GPUs
// (and 4 where present): dilated specs whose segments are longer than a shard, which
// RingAttentionCuda alone answers UNIMPLEMENTED for. Short-segment branches run per GPU with no
// communication; the long ones as CUDA rings over their gathered positions. Skips below 2 GPUs.
#include "core/parallel/dilated_ring_cuda.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
using ::attnserve::testing::ShapeString;

constexpr double kOTol = 1e-2;  // bf16 compute: max |o - ref| / max |ref|

AttentionSpec Dilated(std::vector<int64_t> w, std::vector<int64_t> r, bool causal) {
  AttentionSpec s;
  s.pattern = DilatedSpec{std::move(w), std::move(r)};
  s.causal = causal;
  return s;
}

void Check(const ReferenceResult& ref, const AttentionOutputs& out, DType dtype, double lse_tol) {
  EXPECT_EQ(out.o.dtype(), dtype);
  const ErrorStats e = CompareToReference(ref, out.o, &out.lse);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LE(e.o_rel, kOTol) << "o_max_abs=" << e.o_max_abs;
  EXPECT_LE(e.lse_max_abs, lse_tol);
}

// LongNet-like, the largest segment = N: branch 0 (4 segments of 512) runs locally, one part per
// GPU; branch 1 (one segment of N, rate 2) runs as a dense (causal) CUDA ring per head offset
// over its N/2 gathered positions, which RingAttentionCuda alone cannot place.
TEST(DilatedRingCudaTest, LongNetSegmentEqualsN) {
  SKIP_WITHOUT_GPUS(2);
  const AttentionShape shape{1, 2048, 4, 2, 64};
  const uint64_t seed = FreshSeed();
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  for (bool causal : {false, true}) {
    const AttentionSpec spec = Dilated({512, 2048}, {1, 2}, causal);
    SCOPED_TRACE(
        absl::StrCat("causal=", causal, " ", ShapeString(shape, DType::kBF16), " seed=", seed));
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    DilatedRingStats stats;
    auto out = DilatedRingAttentionCuda(spec, in.q, in.k, in.v, {0, 1}, {}, &stats);
    ASSERT_TRUE(out.ok()) << out.status();
    Check(*ref, *out, DType::kBF16, 2e-3);
    EXPECT_EQ(stats.local_jobs, 1);
    EXPECT_EQ(stats.ring_jobs, 2);  // offsets 0 and 1 of branch 1
    // Each offset's ring carries its 1024 positions and the 2 KV heads: K+V in bf16, sent once by
    // each of the 2 ranks' shards.
    EXPECT_EQ(stats.ring_bytes_moved, 2 * (2 * 1024 * 2 * 64 * 2));
  }
}

// f32 inputs (bf16 compute), GQA 8/2, head dim 128, N not a multiple of any segment, causal and
// not. On 2 GPUs: branches 0 and 1 local, branch 2 (segment > N) a dense ring per offset; on 4
// GPUs (where present) branch 1's 2 gathered segments of 512 run as a block-diagonal CSR ring.
TEST(DilatedRingCudaTest, RaggedGqaF32) {
  SKIP_WITHOUT_GPUS(2);
  const int gpus = CudaDeviceCount();
  const AttentionShape shape{1, 1500, 8, 2, 128};
  const uint64_t seed = FreshSeed();
  auto in = MakeRandomInputs(shape, DType::kF32, seed);
  std::vector<std::vector<int>> device_sets = {{0, 1}};
  if (gpus >= 4) device_sets.push_back({0, 1, 2, 3});
  for (bool causal : {false, true}) {
    const AttentionSpec spec = Dilated({256, 1024, 3000}, {1, 2, 4}, causal);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (const std::vector<int>& devices : device_sets) {
      SCOPED_TRACE(absl::StrCat("causal=", causal, " P=", devices.size(), " ",
                                ShapeString(shape, DType::kF32), " seed=", seed));
      DilatedRingStats stats;
      auto out = DilatedRingAttentionCuda(spec, in.q, in.k, in.v, devices, {}, &stats);
      ASSERT_TRUE(out.ok()) << out.status();
      Check(*ref, *out, DType::kF32, 3e-2);  // f32 inputs are rounded to bf16 first
      EXPECT_GT(stats.local_jobs, 0);
      EXPECT_GT(stats.ring_jobs, 0);
      EXPECT_GT(stats.ring_bytes_moved, 0);
    }
  }
}

}  // namespace
}  // namespace attnserve
