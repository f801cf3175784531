// The Hopper (sm_90a, wgmma) forward kernel (core/cuda/flash_fwd_sm90), forced with
// ATTNSERVE_FLASH_KERNEL=sm90, against float64 references:
// - spec level (CudaAttentionPlan -> RunAttentionForward) vs core/reference: dense, causal, window
//   (causal and not), block-sparse random / local_window / caller CSR (empty rows), dilated (the
//   accumulate epilogue), ragged N, GQA, several batches, bf16 and f16, head dims 64/128, blocks
//   64/128; every run checks that the sm90 kernel is the one that ran;
// - params level (RunAttentionForward on raw FlashFwdParams) vs a float64 loop in this file:
//   rectangular CSR pieces with seqlen_k != seqlen and global position offsets (ring pieces), all
//   three mask kinds, accumulate mode merging two key pieces;
// - sm90 vs sm80 on N = 16384 (dense causal, block-sparse 90% skipped).
// Every sm90 run is done once per kernel variant (ATTNSERVE_SM90_VARIANT = v1, v2, v3; v2 is the
// warp-specialized kernel, v3 its persistent form, both layout block 128 only: block 64 runs v1
// under any), against the same reference, and checks which variant ran (LastFlashKernelName
// "sm90" / "sm90v2" / "sm90v3"); v3 runs once per work-item order (head- and position-major).
// The spec and piece cases run v3 with its grid capped at
// kV3TestCtas CTAs (ATTNSERVE_SM90_V3_MAX_CTAS), so that each CTA runs many work items of
// different lengths (empty CSR rows included) back to back; the large cases run the full grid.
// Outputs are poisoned (0xFF bytes = NaN) before every launch; inputs are fresh seeded uniforms.
// Skips where there is no GPU, the GPU is not compute capability 9.x, or the build lacks sm_90a.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::ShapeString;

// Tolerances of the existing GPU tests: max |o - ref| / max |ref|, and max |lse - ref|.
double OTol(DType dtype) { return dtype == DType::kF16 ? 5e-3 : 1e-2; }
constexpr double kLseTol = 2e-3;

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// Sets ATTNSERVE_FLASH_KERNEL for a scope.
class ScopedKernel : public ScopedEnv {
 public:
  explicit ScopedKernel(const char* value) : ScopedEnv("ATTNSERVE_FLASH_KERNEL", value) {}
};

// The sm90 kernel variants every sm90 case runs with (ATTNSERVE_SM90_VARIANT): v1, v2, v3, or the
// comma-separated subset in ATTNSERVE_SM90_TEST_VARIANTS (bench/sm90_check.sh runs one process
// per variant, so that a hang in one cannot cost the other's results).
std::vector<const char*> TestVariants() {
  const char* env = std::getenv("ATTNSERVE_SM90_TEST_VARIANTS");
  const std::string list = env != nullptr && *env != '\0' ? env : "v1,v2,v3";
  std::vector<const char*> out;
  if (list.find("v1") != std::string::npos) out.push_back("v1");
  if (list.find("v2") != std::string::npos) out.push_back("v2");
  if (list.find("v3") != std::string::npos) out.push_back("v3");
  return out;
}
bool TestsVariant(const char* variant) {
  for (const char* v : TestVariants()) {
    if (std::string(v) == variant) return true;
  }
  return false;
}

// LastFlashKernelName() expected for a forced-sm90 launch of `variant` at layout block `block`
// (v2 and v3 exist for block 128 only).
const char* ExpectedSm90Name(const std::string& variant, int block) {
  if (block != 128) return kFlashKernelSm90;
  if (variant == "v2") return kFlashKernelSm90V2;
  if (variant == "v3") return kFlashKernelSm90V3;
  return kFlashKernelSm90;
}

// v3's grid cap in the spec and piece cases (ATTNSERVE_SM90_V3_MAX_CTAS): few CTAs, many items
// each (an odd count, so that items land on CTAs in shifting phases of the K/V ring).
constexpr char kV3TestCtas[] = "3";

#define SKIP_WITHOUT_SM90()                                                              \
  do {                                                                                   \
    if (CudaDeviceCount() <= 0) GTEST_SKIP() << "no CUDA device available";              \
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);                                            \
    if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "device 0 is not compute capability 9.x"; \
    if (!FlashFwdSm90Built()) GTEST_SKIP() << "this build has no sm_90a kernels";        \
  } while (0)

// ---- spec level: CudaAttentionPlan vs core/reference ------------------------------------------

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype;
};

// Row i keeps block 0, block i - 2 and block i; every fifth row keeps nothing (O = 0, LSE = -inf).
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

std::vector<Case> SpecCases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, AttentionPattern pattern, bool causal, AttentionShape shape,
                 DType dt) {
    Case c;
    c.spec.pattern = std::move(pattern);
    c.spec.causal = causal;
    c.shape = shape;
    c.dtype = dt;
    c.name = absl::StrCat(name, causal ? "_causal" : "", "_b", shape.batch, "_n", shape.tokens,
                          "_hq", shape.q_heads, "_hkv", shape.kv_heads, "_d", shape.head_dim,
                          "_", std::string(DTypeName(dt)));
    cases.push_back(std::move(c));
  };
  // Shapes are kept small: the float64 reference is single-threaded (~40 s for all cases).
  const AttentionShape s1{1, 1000, 4, 2, 128};  // ragged N (1000 = 7 x 128 + 104), GQA 2:1
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const bool all = dt == DType::kBF16;  // f16: a subset of the layouts
    for (bool causal : {false, true}) {
      add("dense", DenseSpec{}, causal, s1, dt);
      add("dense", DenseSpec{}, causal, {1, 130, 2, 2, 64}, dt);
      if (all) add("dense_gqa4", DenseSpec{}, causal, {2, 520, 8, 2, 128}, dt);
      add("window100", WindowSpec{100}, causal, s1, dt);
      for (int32_t bs : {64, 128}) {
        const std::string b = absl::StrCat("bs", bs, "_");
        auto sparse = [&](BlockGenerator g) { return BlockSparseSpec{bs, std::move(g)}; };
        add(b + "random", sparse(RandomGen{0.3, 1234}), causal, s1, dt);
        if (all || bs == 64) add(b + "local_window", sparse(LocalWindowGen{1}), causal, s1, dt);
        if (all || bs == 128) {
          add(b + "csr", sparse(TestCsr(NumBlocks(1000, bs))), causal, {2, 1000, 4, 1, 128}, dt);
        }
        if (all) add(b + "random_d64", sparse(RandomGen{0.3, 77}), causal, {1, 1000, 4, 2, 64}, dt);
      }
      // Dilated: per-branch launches in accumulate mode (f32 LSE-merge epilogue).
      add("dilated", DilatedSpec{{128, 256, 512}, {1, 2, 4}}, causal, s1, dt);
    }
  }
  // Long ragged row (4097 = 32 blocks + 1 token), cheap heads for the float64 reference.
  add("dense_long", DenseSpec{}, true, {1, 4097, 2, 1, 64}, DType::kBF16);
  add("bs128_random_long", BlockSparseSpec{128, RandomGen{0.2, 5}}, false, {1, 4097, 2, 2, 128},
      DType::kBF16);
  return cases;
}

class FlashSm90SpecTest : public ::testing::TestWithParam<Case> {};

// Runs the plan with the kernel forced; returns host O and LSE. Records which kernel ran.
void RunPlan(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
             HostTensor& o, HostTensor& lse, const char* kernel, std::string* ran,
             const char* variant = "v1", const char* v3_max_ctas = kV3TestCtas) {
  ScopedKernel env(kernel);
  ScopedEnv var("ATTNSERVE_SM90_VARIANT", variant);
  ScopedEnv ctas("ATTNSERVE_SM90_V3_MAX_CTAS", v3_max_ctas);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CachingAllocator alloc(0);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto plan = CudaAttentionPlan::Create(c.spec, c.shape, c.dtype, alloc, stream);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto dq = DeviceBuffer::Create(alloc, q.nbytes());
    auto dk = DeviceBuffer::Create(alloc, k.nbytes());
    auto dv = DeviceBuffer::Create(alloc, v.nbytes());
    auto dout = DeviceBuffer::Create(alloc, o.nbytes());
    auto dlse = DeviceBuffer::Create(alloc, lse.nbytes());
    ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dlse.ok());
    ASSERT_EQ(cudaMemcpy(dq->get(), q.data(), q.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dk->get(), k.data(), k.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dv->get(), v.data(), v.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dout->get(), 0xFF, o.nbytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(dlse->get(), 0xFF, lse.nbytes()), cudaSuccess);
    SetLastFlashKernelName("none");
    const absl::Status st = (*plan)->Run(dq->get(), dk->get(), dv->get(), dout->get(),
                                         dlse->as<float>(), stream);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    *ran = LastFlashKernelName();
    ASSERT_EQ(cudaMemcpy(o.data(), dout->get(), o.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lse.data(), dlse->get(), lse.nbytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  cudaStreamDestroy(stream);
}

TEST_P(FlashSm90SpecTest, MatchesReference) {
  SKIP_WITHOUT_SM90();
  const Case& c = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(c.name, " ", ShapeString(c.shape, c.dtype), " seed=", seed));
  auto in = MakeRandomInputs(c.shape, c.dtype, seed);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  // v3 runs once per work-item order (ATTNSERVE_SM90_V3_ORDER): head-major and position-major,
  // whatever the layout's default.
  std::vector<std::pair<const char*, const char*>> runs;
  for (const char* variant : TestVariants()) {
    if (std::string(variant) == "v3") {
      runs.emplace_back(variant, "head");
      runs.emplace_back(variant, "position");
    } else {
      runs.emplace_back(variant, "");
    }
  }
  for (const auto& [variant, order] : runs) {
    SCOPED_TRACE(absl::StrCat("ATTNSERVE_SM90_VARIANT=", variant, " ATTNSERVE_SM90_V3_ORDER=",
                              order));
    ScopedEnv order_env("ATTNSERVE_SM90_V3_ORDER", order);
    auto o = HostTensor::Create(c.dtype, {c.shape.batch, c.shape.tokens, c.shape.q_heads,
                                          c.shape.head_dim});
    auto lse = HostTensor::Create(DType::kF32, {c.shape.batch, c.shape.q_heads, c.shape.tokens});
    ASSERT_TRUE(o.ok() && lse.ok());
    std::string ran;
    RunPlan(c, in.q, in.k, in.v, *o, *lse, kFlashKernelSm90, &ran, variant);
    if (HasFatalFailure()) return;
    if (std::string(variant) == "v1") {
      EXPECT_EQ(ran, kFlashKernelSm90);
    } else if (c.name.rfind("bs128_", 0) == 0) {
      EXPECT_EQ(ran, ExpectedSm90Name(variant, 128));  // layout block 128: the v2 / v3 kernel
    } else {
      // The plan picks the block of dense / window / dilated specs: v2 / v3 at 128, v1 at 64.
      EXPECT_TRUE(ran == ExpectedSm90Name(variant, 128) || ran == kFlashKernelSm90) << ran;
    }
    const ErrorStats e = CompareToReference(*ref, *o, &*lse);
    EXPECT_EQ(e.nonfinite, 0) << "unwritten or non-finite outputs";
    EXPECT_LE(e.o_rel, OTol(c.dtype)) << "o max abs err " << e.o_max_abs << " / max|ref| "
                                      << e.o_ref_max_abs;
    EXPECT_LE(e.lse_max_abs, kLseTol);
    EXPECT_GT(e.checked, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, FlashSm90SpecTest, ::testing::ValuesIn(SpecCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- params level: rectangular pieces, position offsets, accumulate --------------------------

struct HostCsr {
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> col_idx;
  std::vector<uint8_t> mask;
};

// Float64 attention for one FlashFwdParams-style launch over contiguous [1, n, H, D] tensors
// (q, k, v given as float arrays of the rounded inputs): returns per (row, head) the unnormalised
// pieces (max-shifted) so that two pieces can be merged exactly: m (raw max), l = sum e^(s - m),
// acc = sum e^(s - m) v.
struct RefPiece {
  std::vector<double> m, l, acc;  // m/l: [n, H]; acc: [n, H, D]
};

RefPiece ReferencePiece(const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, int64_t n, int64_t nk, int hq, int hkv,
                        int d, int block, const HostCsr& csr, int64_t q_off, int64_t k_off,
                        bool rule_causal, int64_t rule_window, double scale) {
  RefPiece r;
  r.m.assign(n * hq, -std::numeric_limits<double>::infinity());
  r.l.assign(n * hq, 0.0);
  r.acc.assign(n * hq * d, 0.0);
  const int group = hq / hkv;
  std::vector<double> s;
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rb = i / block;
    keys.clear();
    for (int64_t e = csr.row_ptr[rb]; e < csr.row_ptr[rb + 1]; ++e) {
      const int64_t cb = csr.col_idx[e];
      const int mk = csr.mask[e];
      for (int64_t j = cb * block; j < std::min<int64_t>((cb + 1) * block, nk); ++j) {
        const int64_t qi = q_off + i, kj = k_off + j;
        bool ok = true;
        if (mk == 1) ok = kj <= qi;
        if (mk == 2) {
          if (rule_causal) ok = ok && kj <= qi;
          if (rule_window >= 0) ok = ok && std::llabs(qi - kj) <= rule_window;
        }
        if (ok) keys.push_back(j);
      }
    }
    for (int h = 0; h < hq; ++h) {
      const int kh = h / group;
      s.assign(keys.size(), 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t x = 0; x < keys.size(); ++x) {
        double dot = 0;
        for (int c = 0; c < d; ++c) {
          dot += static_cast<double>(q[(i * hq + h) * d + c]) * k[(keys[x] * hkv + kh) * d + c];
        }
        s[x] = dot * scale;
        mx = std::max(mx, s[x]);
      }
      if (keys.empty()) continue;
      double l = 0;
      double* acc = &r.acc[(i * hq + h) * d];
      for (size_t x = 0; x < keys.size(); ++x) {
        const double p = std::exp(s[x] - mx);
        l += p;
        for (int c = 0; c < d; ++c) acc[c] += p * v[(keys[x] * hkv + kh) * d + c];
      }
      r.m[i * hq + h] = mx;
      r.l[i * hq + h] = l;
    }
  }
  return r;
}

template <typename T>
absl::StatusOr<DeviceBuffer> UploadVec(CachingAllocator& alloc, const std::vector<T>& host) {
  auto buf = DeviceBuffer::Create(alloc, std::max<size_t>(1, host.size()) * sizeof(T));
  if (!buf.ok()) return buf.status();
  if (!host.empty() &&
      cudaMemcpy(buf->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) !=
          cudaSuccess) {
    return absl::InternalError("cudaMemcpy");
  }
  return buf;
}

// Random rectangular CSR over nqb x nkb blocks with random mask kinds; some rows empty.
HostCsr RandomCsr(int64_t nqb, int64_t nkb, std::mt19937_64& rng) {
  HostCsr c;
  c.row_ptr.push_back(0);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t r = 0; r < nqb; ++r) {
    if (r % 4 != 2) {
      for (int64_t b = 0; b < nkb; ++b) {
        if (u(rng) < 0.6) {
          c.col_idx.push_back(static_cast<int32_t>(b));
          c.mask.push_back(static_cast<uint8_t>(rng() % 3));
        }
      }
    }
    c.row_ptr.push_back(static_cast<int64_t>(c.col_idx.size()));
  }
  return c;
}

struct PieceCase {
  std::string name;
  DType dtype;
  int head_dim;
  int block;
  int64_t n, nk;          // query rows; key rows (two pieces of nk / 2 and the rest)
  int64_t q_off;          // global position of query row 0
  bool rule_causal;
  int64_t rule_window;
};

class FlashSm90PieceTest : public ::testing::TestWithParam<PieceCase> {};

// Two key pieces [0, nk1) and [nk1, nk), each with its own CSR, launched in accumulate mode into
// one f32 O / LSE (LSE starts at -inf, O poisoned), then one non-accumulate launch of piece 0
// alone; both compared with the float64 loop.
TEST_P(FlashSm90PieceTest, RectangularPiecesWithOffsets) {
  SKIP_WITHOUT_SM90();
  const PieceCase& pc = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(pc.name, " seed=", seed));
  std::mt19937_64 rng(seed);
  const int hq = 4, hkv = 2, d = pc.head_dim, bs = pc.block;
  const int64_t n = pc.n, nk = pc.nk, nk1 = (nk / 2 / bs) * bs + bs / 2 + 3;  // ragged pieces
  const int64_t piece_len[2] = {nk1, nk - nk1};
  const int64_t piece_off[2] = {0, nk1};

  const AttentionShape qshape{1, n, hq, hq, d};
  const AttentionShape kshape{1, nk, hkv, hkv, d};
  auto qi = MakeRandomInputs(qshape, pc.dtype, seed);
  auto ki = MakeRandomInputs(kshape, pc.dtype, seed + 1);
  std::vector<float> qf(qi.q.numel()), kf(ki.k.numel()), vf(ki.v.numel());
  qi.q.ToFloat32(qf.data());
  ki.k.ToFloat32(kf.data());
  ki.v.ToFloat32(vf.data());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  ScopedKernel env(kFlashKernelSm90);
  CachingAllocator alloc(0);
  auto dq = UploadVec(alloc, std::vector<std::byte>(qi.q.data(), qi.q.data() + qi.q.nbytes()));
  auto dk = UploadVec(alloc, std::vector<std::byte>(ki.k.data(), ki.k.data() + ki.k.nbytes()));
  auto dv = UploadVec(alloc, std::vector<std::byte>(ki.v.data(), ki.v.data() + ki.v.nbytes()));
  ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok());
  const size_t esz = DTypeSize(pc.dtype);
  auto dacc = DeviceBuffer::Create(alloc, n * hq * d * sizeof(float));
  auto dout = DeviceBuffer::Create(alloc, n * hq * d * esz);
  auto dlse = DeviceBuffer::Create(alloc, n * hq * sizeof(float));
  ASSERT_TRUE(dacc.ok() && dout.ok() && dlse.ok());

  const int64_t nqb = (n + bs - 1) / bs;
  RefPiece ref[2];
  std::vector<DeviceBuffer> keep;
  auto make_params = [&](int piece, const HostCsr& csr, bool accumulate, void* o,
                         FlashFwdParams& p) -> bool {
    auto rp = UploadVec(alloc, csr.row_ptr);
    auto ci = UploadVec(alloc, csr.col_idx);
    auto mk = UploadVec(alloc, csr.mask);
    if (!rp.ok() || !ci.ok() || !mk.ok()) return false;
    p = FlashFwdParams{};
    p.q = dq->get();
    p.k = static_cast<const std::byte*>(dk->get()) + piece_off[piece] * hkv * d * esz;
    p.v = static_cast<const std::byte*>(dv->get()) + piece_off[piece] * hkv * d * esz;
    p.o = o;
    p.lse = dlse->as<float>();
    p.q_row_stride = hq * d;
    p.q_head_stride = d;
    p.k_row_stride = p.v_row_stride = hkv * d;
    p.k_head_stride = p.v_head_stride = d;
    p.o_row_stride = hq * d;
    p.o_head_stride = d;
    p.q_batch_stride = n * hq * d;
    p.o_batch_stride = n * hq * d;
    p.k_batch_stride = p.v_batch_stride = nk * hkv * d;
    p.lse_head_stride = n;
    p.lse_batch_stride = n * hq;
    p.lse_row_stride = 1;
    p.accumulate = accumulate;
    p.seqlen = n;
    p.seqlen_k = piece_len[piece];
    p.q_pos_offset = pc.q_off;
    p.k_pos_offset = piece_off[piece];
    p.num_heads = hq;
    p.kv_group = hq / hkv;
    p.head_dim = d;
    p.block_size = bs;
    p.dtype = pc.dtype;
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    p.row_ptr = rp->as<int64_t>();
    p.col_idx = ci->as<int32_t>();
    p.block_mask = mk->as<uint8_t>();
    p.num_q_blocks = nqb;
    p.num_k_blocks = (piece_len[piece] + bs - 1) / bs;
    p.rule_causal = pc.rule_causal;
    p.rule_window = pc.rule_window;
    keep.push_back(std::move(*rp));
    keep.push_back(std::move(*ci));
    keep.push_back(std::move(*mk));
    return true;
  };

  HostCsr csr[2];
  for (int piece = 0; piece < 2; ++piece) {
    csr[piece] = RandomCsr(nqb, (piece_len[piece] + bs - 1) / bs, rng);
    ref[piece] = ReferencePiece(qf, std::vector<float>(kf.begin() + piece_off[piece] * hkv * d,
                                                       kf.end()),
                                std::vector<float>(vf.begin() + piece_off[piece] * hkv * d,
                                                   vf.end()),
                                n, piece_len[piece], hq, hkv, d, bs, csr[piece], pc.q_off,
                                piece_off[piece], pc.rule_causal, pc.rule_window, scale);
  }

  // Merged reference over both pieces.
  auto check = [&](const std::vector<float>& o, const std::vector<float>& l, int pieces,
                   double otol, const char* what) {
    double max_err = 0, max_ref = 0, lse_err = 0;
    int64_t bad = 0, rows = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int h = 0; h < hq; ++h) {
        const int64_t rh = i * hq + h;
        double m = -std::numeric_limits<double>::infinity();
        for (int pi = 0; pi < pieces; ++pi) m = std::max(m, ref[pi].m[rh]);
        const bool empty = std::isinf(m);
        double lsum = 0;
        std::vector<double> out(d, 0.0);
        if (!empty) {
          for (int pi = 0; pi < pieces; ++pi) {
            if (std::isinf(ref[pi].m[rh])) continue;
            const double w = std::exp(ref[pi].m[rh] - m);
            lsum += w * ref[pi].l[rh];
            for (int c = 0; c < d; ++c) out[c] += w * ref[pi].acc[rh * d + c];
          }
          for (int c = 0; c < d; ++c) out[c] /= lsum;
        }
        // LSE stored [B, H, N].
        const float got_lse = l[h * n + i];
        if (empty) {
          if (!(std::isinf(got_lse) && got_lse < 0)) ++bad;
          if (pieces == 2) continue;  // accumulate: O untouched (poisoned) for empty rows
        } else {
          ++rows;
          if (!std::isfinite(got_lse)) {
            ++bad;
          } else {
            lse_err = std::max(lse_err, std::abs(got_lse - (m + std::log(lsum))));
          }
        }
        for (int c = 0; c < d; ++c) {
          const double got = o[rh * d + c];
          if (!std::isfinite(got)) {
            ++bad;
            continue;
          }
          max_err = std::max(max_err, std::abs(got - out[c]));
          max_ref = std::max(max_ref, std::abs(out[c]));
        }
      }
    }
    SCOPED_TRACE(what);
    EXPECT_EQ(bad, 0) << "non-finite or wrongly empty outputs";
    EXPECT_GT(rows, 0);
    EXPECT_LE(max_err / std::max(max_ref, 1e-30), otol) << max_err << " / " << max_ref;
    EXPECT_LE(lse_err, kLseTol);
  };
  for (const char* variant : TestVariants()) {
    SCOPED_TRACE(absl::StrCat("ATTNSERVE_SM90_VARIANT=", variant));
    ScopedEnv var("ATTNSERVE_SM90_VARIANT", variant);
    ScopedEnv ctas("ATTNSERVE_SM90_V3_MAX_CTAS", kV3TestCtas);
    {
      std::vector<float> ninf(n * hq, -std::numeric_limits<float>::infinity());
      ASSERT_EQ(cudaMemcpy(dlse->get(), ninf.data(), ninf.size() * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(dacc->get(), 0xFF, n * hq * d * sizeof(float)), cudaSuccess);
    }
    for (int piece = 0; piece < 2; ++piece) {
      FlashFwdParams p;
      ASSERT_TRUE(make_params(piece, csr[piece], /*accumulate=*/true, dacc->get(), p));
      SetLastFlashKernelName("none");
      const absl::Status st = RunAttentionForward(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_STREQ(LastFlashKernelName(), ExpectedSm90Name(variant, bs));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> acc(n * hq * d), lse(n * hq);
    ASSERT_EQ(cudaMemcpy(acc.data(), dacc->get(), acc.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lse.data(), dlse->get(), lse.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    // f32 output, but P is rounded to the input dtype before the PV product (as in the sm80
    // kernel), so the bound is the input dtype's, not float32's (1e-3 failed at 1.04e-3 on an
    // H200).
    check(acc, lse, 2, OTol(pc.dtype), "accumulate, two pieces (f32 output)");

    // Piece 0 alone, plain store in the input dtype.
    {
      ASSERT_EQ(cudaMemset(dout->get(), 0xFF, n * hq * d * esz), cudaSuccess);
      ASSERT_EQ(cudaMemset(dlse->get(), 0xFF, n * hq * 4), cudaSuccess);
      FlashFwdParams p;
      ASSERT_TRUE(make_params(0, csr[0], /*accumulate=*/false, dout->get(), p));
      const absl::Status st = RunAttentionForward(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto o = HostTensor::Create(pc.dtype, {1, n, hq, d});
      ASSERT_TRUE(o.ok());
      ASSERT_EQ(cudaMemcpy(o->data(), dout->get(), o->nbytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(lse.data(), dlse->get(), lse.size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<float> of(o->numel());
      o->ToFloat32(of.data());
      check(of, lse, 1, OTol(pc.dtype), "piece 0, store");
    }
  }  // variants
}

INSTANTIATE_TEST_SUITE_P(
    Pieces, FlashSm90PieceTest,
    ::testing::Values(
        // Query chunk after the keys (ring step past the diagonal) and overlapping it.
        PieceCase{"bf16_d128_bs128_causal_rule", DType::kBF16, 128, 128, 700, 900, 500, true, -1},
        PieceCase{"f16_d128_bs128_window", DType::kF16, 128, 128, 700, 900, 300, false, 200},
        PieceCase{"bf16_d64_bs64_causal_window", DType::kBF16, 64, 64, 333, 520, 250, true, 90},
        PieceCase{"f16_d128_bs64_causal_rule", DType::kF16, 128, 64, 400, 610, 0, true, -1},
        PieceCase{"bf16_d64_bs128_window", DType::kBF16, 64, 128, 260, 1000, 700, false, 150}),
    [](const ::testing::TestParamInfo<PieceCase>& info) { return info.param.name; });

// ---- forced sm90 where it cannot run is an error, not a fallback --------------------------------

TEST(FlashSm90DispatchTest, ForcedUnsupportedIsUnimplemented) {
  FlashFwdParams p;
  p.head_dim = 96;
  p.block_size = 128;
  p.dtype = DType::kBF16;
  std::string why;
  EXPECT_FALSE(FlashFwdSm90Supports(p, &why));
  EXPECT_FALSE(why.empty());
  {
    ScopedKernel env("sm90");
    auto k = FlashKernelFor(p);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kUnimplemented) << k.status();
  }
  {
    ScopedKernel env("sm80");
    auto k = FlashKernelFor(p);
    ASSERT_TRUE(k.ok());
    EXPECT_STREQ(*k, "sm80");
  }
  {
    ScopedKernel env("bogus");
    EXPECT_EQ(FlashKernelFor(p).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    ScopedKernel env("sm80");
    ScopedEnv var("ATTNSERVE_SM90_VARIANT", "v4");
    EXPECT_EQ(FlashKernelFor(p).status().code(), absl::StatusCode::kInvalidArgument);
  }
  for (const char* v : {"v1", "v2", "v3", ""}) {
    ScopedEnv var("ATTNSERVE_SM90_VARIANT", v);
    Sm90Variant variant;
    EXPECT_TRUE(Sm90VariantFromEnv(&variant)) << v;
  }
}

// ---- sm90 vs sm80 on a large case ------------------------------------------------------------

TEST(FlashSm90VsSm80Test, LargeCasesAgree) {
  SKIP_WITHOUT_SM90();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const AttentionShape shape{1, 16384, 4, 4, 128};
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  std::vector<Case> cases(2);
  cases[0].spec.pattern = DenseSpec{};
  cases[0].spec.causal = true;
  cases[0].name = "dense_causal";
  cases[1].spec.pattern = BlockSparseSpec{128, RandomGen{0.1, 42}};
  cases[1].name = "bs128_random_90pct_skipped";
  for (Case& c : cases) {
    c.shape = shape;
    c.dtype = DType::kBF16;
    SCOPED_TRACE(c.name);
    // sm80, sm90 v1, sm90 v2, sm90 v3 (full persistent grid); each sm90 variant is compared
    // with sm80.
    constexpr int kRuns = 4;
    HostTensor o[kRuns], lse[kRuns];
    const char* kernels[kRuns] = {kFlashKernelSm80, kFlashKernelSm90, kFlashKernelSm90,
                                  kFlashKernelSm90};
    const char* variants[kRuns] = {"v1", "v1", "v2", "v3"};
    for (int i = 0; i < kRuns; ++i) {
      if (i > 0 && !TestsVariant(variants[i])) continue;
      auto ot = HostTensor::Create(DType::kBF16, {1, shape.tokens, shape.q_heads, 128});
      auto lt = HostTensor::Create(DType::kF32, {1, shape.q_heads, shape.tokens});
      ASSERT_TRUE(ot.ok() && lt.ok());
      o[i] = std::move(*ot);
      lse[i] = std::move(*lt);
      std::string ran;
      RunPlan(c, in.q, in.k, in.v, o[i], lse[i], kernels[i], &ran, variants[i], "0");
      if (HasFatalFailure()) return;
      if (i < 2) {
        EXPECT_EQ(ran, kernels[i]);
      } else {
        const char* wide = ExpectedSm90Name(variants[i], 128);
        EXPECT_TRUE(ran == wide || ran == kFlashKernelSm90) << ran;
        if (c.name.rfind("bs128_", 0) == 0) {
          EXPECT_EQ(ran, wide);
        }
      }
    }
    for (int run = 1; run < kRuns; ++run) {
      if (!TestsVariant(variants[run])) continue;
      SCOPED_TRACE(absl::StrCat("sm90 ", variants[run], " vs sm80"));
      std::vector<float> a(o[0].numel()), b(o[run].numel()), la(lse[0].numel()),
          lb(lse[run].numel());
      o[0].ToFloat32(a.data());
      o[run].ToFloat32(b.data());
      lse[0].ToFloat32(la.data());
      lse[run].ToFloat32(lb.data());
      double max_err = 0, max_ref = 0, lse_err = 0;
      int64_t bad = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
          ++bad;
          continue;
        }
        max_err = std::max(max_err, static_cast<double>(std::abs(a[i] - b[i])));
        max_ref = std::max(max_ref, static_cast<double>(std::abs(a[i])));
      }
      for (size_t i = 0; i < la.size(); ++i) {
        if (!std::isfinite(la[i]) || !std::isfinite(lb[i])) {
          ++bad;
          continue;
        }
        lse_err = std::max(lse_err, static_cast<double>(std::abs(la[i] - lb[i])));
      }
      EXPECT_EQ(bad, 0);
      EXPECT_GT(max_ref, 0);
      EXPECT_LE(max_err / std::max(max_ref, 1e-30), 1e-2);
      EXPECT_LE(lse_err, kLseTol);
    }  // runs
  }
}

}  // namespace
}  // namespace attnserve
