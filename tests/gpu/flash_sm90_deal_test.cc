// The persistent schedule's dynamic deal (Sm90ItemDeal::kDynamic: CTAs draw CSR work items from a
// counter pair kept per stream, which the last CTA of every launch resets) next to the static
// one. An item's result does not depend on the CTA that runs it, so both deals must give the same
// bytes; the static run is checked against the float64 reference. The dynamic deal then runs
// several launches back to back on one stream (a counter the previous launch did not reset would
// skip items: the poisoned outputs stay NaN) and on two streams at once, with the grid capped
// (many items per CTA) and on the whole GPU (enough items for more than the two dealt rounds).
// Skips where there is no GPU, the GPU is not compute capability 9.x, or the build lacks sm_90a.
#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_options.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "gtest/gtest.h"
#include "tests/gpu/flash_sm90_test_util.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::sm90_test::ForcedSm90;
using ::attnserve::sm90_test::kLseTol;
using ::attnserve::sm90_test::OTol;
using ::attnserve::testing::DownloadTensor;
using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::PoisonedDeviceBuffer;
using ::attnserve::testing::UploadTensor;

bool SameBytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// One output pair on the device and its host copy.
struct Output {
  DeviceBuffer o, lse;
  HostTensor host_o, host_lse;
};

// 2 x 12 heads x 16 query blocks = 384 CSR rows: more than two rounds of the whole H200 grid
// (132 CTAs), so the dynamic deal draws there too. Causal: masked tiles (the mask path); not:
// kFull tiles (the mask-free variant).
TEST(FlashSm90DealTest, DynamicDealMatchesStaticOnOneStreamAndTwo) {
  SKIP_WITHOUT_SM90();
  const AttentionShape shape{2, 2048, 12, 4, 128};
  for (const bool causal : {false, true}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat(causal ? "causal" : "non-causal", " seed=", seed));
    AttentionSpec spec;
    spec.pattern = BlockSparseSpec{128, RandomGen{0.15, seed % 1000}};
    spec.causal = causal;
    auto in = MakeRandomInputs(shape, DType::kBF16, seed);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (const int max_ctas : {sm90_test::kPersistentTestCtas, 0}) {
      SCOPED_TRACE(absl::StrCat("max ctas ", max_ctas));
      CachingAllocator alloc(0);
      std::array<cudaStream_t, 2> streams{};
      for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      // A plan runs on one stream: one for the static deal, one per stream for the dynamic one.
      auto plan_of = [&](Sm90ItemDeal deal, cudaStream_t s) {
        CudaAttentionPlan::Options options;
        options.kernel = ForcedSm90(Sm90Schedule::kPersistent, max_ctas);
        options.kernel.sm90_item_deal = deal;
        return CudaAttentionPlan::Create(spec, shape, DType::kBF16, alloc, s, nullptr, options);
      };
      auto fixed = plan_of(Sm90ItemDeal::kStatic, streams[0]);
      ASSERT_TRUE(fixed.ok()) << fixed.status();
      std::array<std::unique_ptr<CudaAttentionPlan>, 2> drawn;
      for (int l = 0; l < 2; ++l) {
        auto plan = plan_of(Sm90ItemDeal::kDynamic, streams[l]);
        ASSERT_TRUE(plan.ok()) << plan.status();
        drawn[l] = std::move(*plan);
      }
      auto dq = UploadTensor(alloc, in.q);
      auto dk = UploadTensor(alloc, in.k);
      auto dv = UploadTensor(alloc, in.v);
      ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok());
      auto make_output = [&](Output& out) {
        out.host_o = *HostTensor::Create(DType::kBF16, {shape.batch, shape.tokens,
                                                        shape.q_heads, shape.head_dim});
        out.host_lse =
            *HostTensor::Create(DType::kF32, {shape.batch, shape.q_heads, shape.tokens});
        auto o = PoisonedDeviceBuffer(alloc, out.host_o.nbytes());
        auto lse = PoisonedDeviceBuffer(alloc, out.host_lse.nbytes());
        ASSERT_TRUE(o.ok() && lse.ok());
        out.o = std::move(*o);
        out.lse = std::move(*lse);
      };
      auto run = [&](const CudaAttentionPlan& plan, Output& out, cudaStream_t s) {
        FlashKernel kernel{};
        ASSERT_TRUE(plan.Run(dq->get(), dk->get(), dv->get(), out.o.get(), out.lse.as<float>(), s,
                             nullptr, &kernel)
                        .ok());
        EXPECT_EQ(kernel, FlashKernel::kSm90Persistent);
      };
      auto download = [&](Output& out) {
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(DownloadTensor(out.o.get(), out.host_o).ok());
        ASSERT_TRUE(DownloadTensor(out.lse.get(), out.host_lse).ok());
      };
      Output base;
      make_output(base);
      run(**fixed, base, streams[0]);
      download(base);
      const ErrorStats e = CompareToReference(*ref, base.host_o, &base.host_lse);
      EXPECT_EQ(e.nonfinite, 0);
      EXPECT_LE(e.o_rel, OTol(DType::kBF16));
      EXPECT_LE(e.lse_max_abs, kLseTol);
      // Three launches on one stream, then two streams at once, each on fresh poisoned outputs.
      for (int launch = 0; launch < 5; ++launch) {
        SCOPED_TRACE(absl::StrCat("dynamic launch ", launch));
        std::array<Output, 2> outs;
        const int lanes = launch < 3 ? 1 : 2;
        for (int l = 0; l < lanes; ++l) make_output(outs[l]);
        for (int l = 0; l < lanes; ++l) run(*drawn[l], outs[l], streams[l]);
        for (int l = 0; l < lanes; ++l) {
          download(outs[l]);
          EXPECT_TRUE(SameBytes(outs[l].host_o, base.host_o)) << "stream " << l;
          EXPECT_TRUE(SameBytes(outs[l].host_lse, base.host_lse)) << "stream " << l;
        }
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (cudaStream_t s : streams) cudaStreamDestroy(s);
    }
  }
}

}  // namespace
}  // namespace attnserve
