// Requests that are not square on a GPU (docs/DESIGN.md "The math": Nq != Nkv, a query offset,
// packed sequences): CudaDevice runs their RectLayout pieces on the flash kernels, and every
// output equals the float64 reference on fresh seeded inputs with outputs poisoned first.
#include <cuda_runtime.h>

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
using ::attnserve::testing::QkvInputs;
using ::attnserve::testing::SpecAt;

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const AttentionPattern patterns[] = {DenseSpec{}, WindowSpec{300},
                                       BlockSparseSpec{128, LocalWindowGen{1}},
                                       BlockSparseSpec{64, RandomGen{0.3, 7}}};
  const char* names[] = {"dense", "window", "local_window", "random"};
  for (int p = 0; p < 4; ++p) {
    for (bool causal : {false, true}) {
      const std::string base = absl::StrCat(names[p], causal ? "_causal" : "");
      // decode: 1 and 16 rows at the end of 2,000 keys (GQA 8/2)
      cases.push_back(
          {base + "_decode1", SpecAt(patterns[p], causal, 1999), {1, 1, 8, 2, 128, 2000}});
      cases.push_back(
          {base + "_decode16", SpecAt(patterns[p], causal, 1984), {2, 16, 8, 2, 64, 2000}});
      // a chunk of prefill starting inside a block, and queries past the keys' end
      cases.push_back(
          {base + "_chunk", SpecAt(patterns[p], causal, 700), {1, 500, 4, 4, 128, 1200}});
      cases.push_back(
          {base + "_more_q", SpecAt(patterns[p], causal, 100), {1, 900, 4, 2, 64, 600}});
    }
  }
  // packed: three sequences of different lengths, one decode-like
  AttentionSpec packed = SpecAt(DenseSpec{}, true, 0);
  packed.cu_seqlens_q = {0, 300, 301, 700};
  packed.cu_seqlens_k = {0, 300, 1300, 1700};
  cases.push_back({"packed_dense_causal", packed, {1, 700, 4, 2, 128, 1700}});
  AttentionSpec packed_window = packed;
  packed_window.pattern = WindowSpec{128};
  cases.push_back({"packed_window_causal", packed_window, {1, 700, 4, 2, 128, 1700}});
  return cases;
}

TEST(RectAttentionTest, EveryKindMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  Device& device = *(*made)[0];
  for (const Case& c : Cases()) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(absl::StrCat(c.name, " ", std::string(DTypeName(dtype))));
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(absl::StrCat("seed=", seed));
      ASSERT_TRUE(ValidateSpec(c.spec, c.shape).ok()) << ValidateSpec(c.spec, c.shape);
      const QkvInputs in = MakeRandomInputs(c.shape, dtype, seed);
      auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
      ASSERT_TRUE(ref.ok()) << ref.status();
      // Into poisoned host outputs: every element must come back from the device.
      AttentionOutputs out;
      out.o = testing::PoisonedOutput(c.shape, dtype);
      out.lse = testing::PoisonedLse(c.shape);
      RunInfo info;
      ASSERT_TRUE(device.RunInto(c.spec, in.q, in.k, in.v, RunControl{}, &info, out).ok());
      EXPECT_EQ(info.engine, "flash_fwd");
      const ErrorStats e = CompareToReference(*ref, out.o, &out.lse);
      EXPECT_EQ(e.nonfinite, 0) << "an output element was not written (or not -inf/0 where no key)";
      EXPECT_LE(e.o_rel, dtype == DType::kF32 ? testing::kF32InputOTolerance : 1e-2);
      EXPECT_LE(e.lse_max_abs, dtype == DType::kF32 ? testing::kF32InputLseTolerance : 2e-3);
      EXPECT_GT(info.flops, 0);
    }
  }
}

TEST(RectAttentionTest, DilatedIsRefusedClearly) {
  SKIP_WITHOUT_GPU();
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  AttentionSpec spec;
  spec.pattern = DilatedSpec{{256}, {2}};
  spec.q_offset = 100;
  const AttentionShape shape{1, 100, 2, 2, 64, 200};
  const QkvInputs in = MakeRandomInputs(shape, DType::kBF16, FreshSeed());
  auto out = (*made)[0]->Run(spec, in.q, in.k, in.v, RunControl{}, nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented) << out.status();
}

}  // namespace
}  // namespace attnserve
