// The split-KV decode path (core/cuda/flash_decode) through CudaDevice: decode-shaped requests
// (few query rows per KV head against many keys, dense and window, causal or not, GQA, packed
// sequences that mix decode and longer spans) equal the float64 reference for forced split counts
// and the automatic one, with outputs poisoned first; and the decode kernel agrees with the
// prefill kernels (DecodeKernel::kFlashFwd) on the same request.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/flash_decode/flash_decode.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
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
  AttentionShape shape;  // batch, Nq, Hq, Hkv, D, Nkv
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  struct Shape {
    const char* name;
    int64_t batch, nq, hq, hkv, d, nkv;
  };
  const Shape shapes[] = {
      {"nq1_gqa4_d128", 1, 1, 8, 2, 128, 5000},    // one token, 4 rows per KV head
      {"nq3_mha_d64", 2, 3, 4, 4, 64, 3000},       // ragged rows (3), batch 2
      {"nq16_gqa4_d128", 1, 16, 8, 2, 128, 4100},  // 64 rows: four row tiles
      {"nq5_gqa8_d64", 1, 5, 16, 2, 64, 777},      // 40 rows: padded tile, short keys
      {"nq64_mha_d128", 1, 64, 2, 2, 128, 2000},   // 64 tokens of one head
      {"nq2_gqa4_d128_tiny", 1, 2, 4, 1, 128, 5},  // fewer keys than a tile
  };
  const AttentionPattern patterns[] = {DenseSpec{}, WindowSpec{700}};
  const char* pattern_names[] = {"dense", "window"};
  for (const Shape& s : shapes) {
    for (int p = 0; p < 2; ++p) {
      for (bool causal : {true, false}) {
        const AttentionShape shape{s.batch, s.nq, s.hq, s.hkv, s.d, s.nkv};
        const std::string base = absl::StrCat(pattern_names[p], causal ? "_causal_" : "_", s.name);
        // bottom-right aligned (decode), and queries in the middle of the keys
        cases.push_back({base + "_end", SpecAt(patterns[p], causal, s.nkv - s.nq), shape});
        if (s.nkv > 2 * s.nq) {
          cases.push_back({base + "_mid", SpecAt(patterns[p], causal, s.nkv / 2), shape});
        }
      }
    }
  }
  // Queries right after the keys' end (q_offset = Nkv): with a window of 2 the last two rows admit
  // nothing (O = 0, LSE = -inf written by the decode kernel, no fill before it).
  cases.push_back({"window_past_end", SpecAt(WindowSpec{2}, false, 995), {1, 4, 4, 2, 64, 995}});
  // A window no query reaches at all: nothing to launch, the fill alone.
  cases.push_back({"window_nothing", SpecAt(WindowSpec{0}, false, 995), {1, 3, 4, 2, 64, 995}});
  // A caller's "unlimited" window: every key (BuildFlashDecodeParams drops the window).
  cases.push_back({"window_int64_max",
                   SpecAt(WindowSpec{std::numeric_limits<int64_t>::max()}, false, 2996),
                   {1, 4, 8, 2, 128, 3000}});
  // Key shards (a context split over devices: keys at positions [k_offset, k_offset + Nkv) of a
  // sequence of kv_total): decode at the sequence's end, a window reaching into the shard from
  // queries before it, and (not decode pieces: the rect CSR and implicit dense paths) a window
  // chunk and a causal chunk whose first 100 rows come before the shard's first key.
  const auto shard = [](AttentionPattern pattern, bool causal, int64_t q_offset) {
    AttentionSpec s = SpecAt(std::move(pattern), causal, q_offset);
    s.k_offset = 2000;
    s.kv_total = 6000;
    return s;
  };
  cases.push_back(
      {"shard_decode_dense_causal", shard(DenseSpec{}, true, 5996), {1, 4, 8, 2, 128, 3000}});
  cases.push_back({"shard_decode_window_before",
                   shard(WindowSpec{500}, false, 1800),
                   {1, 16, 8, 2, 128, 3000}});
  cases.push_back({"shard_chunk_window_before",
                   shard(WindowSpec{300}, false, 1800),
                   {1, 300, 4, 2, 128, 3000}});
  cases.push_back({"shard_chunk_dense_causal_before",
                   shard(DenseSpec{}, true, 1900),
                   {1, 300, 4, 2, 64, 3000}});
  // Packed: a decode sequence (1 query row) next to longer ones, causal dense (an f32
  // accumulator for the non-decode spans) and window.
  AttentionSpec packed = SpecAt(DenseSpec{}, true, 0);
  packed.cu_seqlens_q = {0, 300, 301, 305};
  packed.cu_seqlens_k = {0, 300, 2300, 3000};
  cases.push_back({"packed_dense_causal", packed, {1, 305, 8, 2, 128, 3000}});
  AttentionSpec packed_window = packed;
  packed_window.pattern = WindowSpec{500};
  cases.push_back({"packed_window_causal", packed_window, {1, 305, 8, 2, 128, 3000}});
  return cases;
}

void ExpectMatches(Device& device, const Case& c, DType dtype, uint64_t seed,
                   HostTensor* o_out = nullptr, std::string* kernel = nullptr) {
  ASSERT_TRUE(ValidateSpec(c.spec, c.shape).ok()) << ValidateSpec(c.spec, c.shape);
  const QkvInputs in = MakeRandomInputs(c.shape, dtype, seed);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  AttentionOutputs out;
  out.o = testing::PoisonedOutput(c.shape, dtype);
  out.lse = testing::PoisonedLse(c.shape);
  RunInfo info;
  const absl::Status st = device.RunInto(c.spec, in.q, in.k, in.v, RunControl{}, &info, out);
  ASSERT_TRUE(st.ok()) << st;
  const ErrorStats e = CompareToReference(*ref, out.o, &out.lse);
  EXPECT_EQ(e.nonfinite, 0) << "an output element was not written (or not -inf/0 where no key)";
  const bool f32 = dtype == DType::kF32;  // computed in bf16 (gpu_test_util.h)
  EXPECT_LE(e.o_rel, dtype == DType::kF16 ? 4e-3 : (f32 ? testing::kF32InputOTolerance : 1e-2));
  EXPECT_LE(e.lse_max_abs, f32 ? testing::kF32InputLseTolerance : 2e-3);
  if (o_out != nullptr) *o_out = std::move(out.o);
  if (kernel != nullptr) *kernel = info.kernel;
}

// The decode kernels this device can run: the mma.sync one everywhere, the wgmma one on a 9.x
// device of a build with sm_90a.
std::vector<FlashKernelArch> DecodeArchs() {
  std::vector<FlashKernelArch> archs = {FlashKernelArch::kSm80};
  if (FlashFwdSm90Built() && CurrentDeviceIsSm90()) archs.push_back(FlashKernelArch::kSm90);
  return archs;
}

// Every case on each decode kernel (the mma.sync kernel; the wgmma kernel on Hopper, also for the
// row counts the automatic choice leaves to mma.sync), forced split counts and the automatic one.
// Host only (no device call, runs on any machine): a window at least the problem's largest
// |query - key| distance is dropped, so that no key range adds a position to a window near
// INT64_MAX (which wrapped to an empty range: O = 0 for a non-causal decode step); one below it
// is kept and admits what the rule says.
TEST(FlashDecodeParamsTest, AWindowReachingEveryKeyIsDropped) {
  FlashDecodeProblem d;
  d.tensors.shape = {1, 4, 8, 2, 128, 5000};
  d.q_len = 4;
  d.kv_len = 5000;
  d.q_pos = 4996;  // rows at 4996..4999: the largest distance is 4999 (row 3 to key 0)
  for (const bool causal : {false, true}) {
    d.causal = causal;
    for (const int64_t w : {int64_t{4999}, std::numeric_limits<int64_t>::max()}) {
      d.window = w;
      const FlashDecodeParams p = BuildFlashDecodeParams(d);
      EXPECT_EQ(p.window, -1) << w;
      EXPECT_EQ(p.key_begin, 0);
      EXPECT_EQ(p.key_end, 5000);
      EXPECT_EQ(FlashDecodeAdmittedPairs(p), causal ? 4997 + 4998 + 4999 + 5000 : 4 * 5000);
    }
    d.window = 4998;  // row 3 no longer reaches key 0
    const FlashDecodeParams p = BuildFlashDecodeParams(d);
    EXPECT_EQ(p.window, 4998);
    EXPECT_EQ(FlashDecodeAdmittedPairs(p), causal ? 4997 + 4998 + 4999 + 4999 : 3 * 5000 + 4999);
  }
}

TEST(FlashDecodeTest, EveryCaseAndSplitCountMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (FlashKernelArch arch : DecodeArchs()) {
    for (int splits : {0, 1, 2, 7}) {
      CudaOptions options;
      options.flash.decode_splits = splits;
      options.flash.arch = arch;
      auto made = MakeCudaDevices({0}, options);
      ASSERT_TRUE(made.ok()) << made.status();
      Device& device = *(*made)[0];
      for (const Case& c : Cases()) {
        for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
          if (splits != 0 && dtype == DType::kF32) continue;  // f32 runs the bf16 kernel
          const uint64_t seed = FreshSeed();
          SCOPED_TRACE(absl::StrCat(c.name, " ", std::string(DTypeName(dtype)),
                                    " arch=", std::string(FlashKernelArchName(arch)), " splits=", splits,
                                    " seed=", seed));
          std::string kernel;
          ExpectMatches(device, c, dtype, seed, nullptr, &kernel);
          // The 64-row decode step runs the kernel the arch names.
          if (absl::StrContains(c.name, "nq16_gqa4") && absl::StrContains(c.name, "_end")) {
            EXPECT_EQ(kernel, arch == FlashKernelArch::kSm90 ? "decode_sm90" : "decode");
          }
        }
      }
    }
  }
}

// The automatic choice on Hopper: the wgmma kernel for 64 packed rows, mma.sync for 16.
TEST(FlashDecodeTest, AutoPicksTheWgmmaKernelForManyRowsOnHopper) {
  SKIP_WITHOUT_GPU();
  if (!(FlashFwdSm90Built() && CurrentDeviceIsSm90())) {
    GTEST_SKIP() << "the wgmma decode kernel needs a 9.x device and an sm_90a build";
  }
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  const struct {
    int64_t nq;
    const char* want;
  } steps[] = {{16, "decode_sm90"}, {4, "decode"}};
  for (const auto& step : steps) {
    const Case c{"auto", SpecAt(DenseSpec{}, true, 9000 - step.nq), {1, step.nq, 32, 8, 128, 9000}};
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat("nq=", step.nq, " seed=", seed));
    std::string kernel;
    ExpectMatches(*(*made)[0], c, DType::kBF16, seed, nullptr, &kernel);
    EXPECT_EQ(kernel, step.want);
  }
}

TEST(FlashDecodeTest, AgreesWithThePrefillKernels) {
  SKIP_WITHOUT_GPU();
  CudaOptions prefill;
  prefill.flash.decode = DecodeKernel::kFlashFwd;
  auto split = MakeCudaDevices({0});
  auto flash = MakeCudaDevices({0}, prefill);
  ASSERT_TRUE(split.ok() && flash.ok());
  // A long context: 70,000 keys, decode of 4 tokens, GQA 32/8 (the serving shape, smaller).
  const Case c{
      "dense_causal_long", SpecAt(DenseSpec{}, true, 70000 - 4), {1, 4, 32, 8, 128, 70000}};
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  HostTensor a, b;
  ExpectMatches(*(*split)[0], c, DType::kBF16, seed, &a);
  ExpectMatches(*(*flash)[0], c, DType::kBF16, seed, &b);
  ASSERT_EQ(a.nbytes(), b.nbytes());
  const auto* x = reinterpret_cast<const uint16_t*>(a.data());
  const auto* y = reinterpret_cast<const uint16_t*>(b.data());
  int64_t far = 0;
  for (size_t i = 0; i < a.nbytes() / 2; ++i) {
    const float fx = Bf16ToFloat(x[i]), fy = Bf16ToFloat(y[i]);
    if (std::abs(fx - fy) > 2e-2f * (1.f + std::abs(fy))) ++far;
  }
  EXPECT_EQ(far, 0);
}

}  // namespace
}  // namespace attnserve
