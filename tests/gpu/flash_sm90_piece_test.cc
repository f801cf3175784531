// flash_sm90_test, params level: RunAttentionForward on FlashFwdParams from BuildFlashFwdParams
// (the sm90 kernels forced through FlashKernelOptions) vs a float64 loop in this file:
// rectangular CSR pieces with seqlen_k != seqlen and global position offsets (ring pieces), all
// three mask kinds, accumulate mode merging two key pieces, then a plain store of one piece. Each
// case runs once per sm90 schedule (flash_sm90_test_util.h); the header of flash_sm90_test.cc
// describes the whole binary.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "gtest/gtest.h"
#include "tests/gpu/flash_sm90_test_util.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::sm90_test::ExpectedSm90Kernel;
using ::attnserve::sm90_test::ForcedSm90;
using ::attnserve::sm90_test::kLseTol;
using ::attnserve::sm90_test::OTol;
using ::attnserve::sm90_test::TestSchedules;
using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::UploadTensor;
using ::attnserve::testing::UploadVector;

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
                        const std::vector<float>& v, int64_t n, int64_t nk, int hq, int hkv, int d,
                        int block, const HostCsr& csr, int64_t q_off, int64_t k_off,
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
  int64_t n, nk;  // query rows; key rows (two pieces of nk / 2 and the rest)
  int64_t q_off;  // global position of query row 0
  bool rule_causal;
  int64_t rule_window;
};

// The float64 result of the first `pieces` reference pieces merged, compared with a launch's O
// (as floats, [n, H, D]) and LSE ([H, n]). Accumulate runs (pieces == 2) leave O untouched
// (poisoned) on rows with no admissible key; store runs write zeros there.
void ExpectMatchesPieces(const RefPiece* ref, int pieces, int64_t n, int hq, int d,
                         const std::vector<float>& o, const std::vector<float>& l, double otol,
                         const char* what) {
  double max_err = 0, max_ref = 0, lse_err = 0;
  int64_t bad = 0, rows = 0;
  std::vector<double> out(d);
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < hq; ++h) {
      const int64_t rh = i * hq + h;
      double m = -std::numeric_limits<double>::infinity();
      for (int pi = 0; pi < pieces; ++pi) m = std::max(m, ref[pi].m[rh]);
      const bool empty = std::isinf(m);
      double lsum = 0;
      std::fill(out.begin(), out.end(), 0.0);
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
}

// One case's inputs on the device: q [1, n, hq, d], k/v [1, nk, hkv, d] split into two key pieces
// at rows piece_off[1], each with its own uploaded CSR and float64 reference.
struct PieceSetup {
  static constexpr int kHq = 4, kHkv = 2;
  int64_t piece_len[2] = {0, 0};
  int64_t piece_off[2] = {0, 0};
  RefPiece ref[2];
  DeviceBuffer q, k, v;
  DeviceBuffer row_ptr[2], col_idx[2], mask[2];
};

void SetUpPieces(const PieceCase& pc, uint64_t seed, CachingAllocator& alloc, PieceSetup& s) {
  std::mt19937_64 rng(seed);
  const int hq = PieceSetup::kHq, hkv = PieceSetup::kHkv, d = pc.head_dim, bs = pc.block;
  const int64_t n = pc.n, nk = pc.nk, nk1 = (nk / 2 / bs) * bs + bs / 2 + 3;  // ragged pieces
  s.piece_len[0] = nk1;
  s.piece_len[1] = nk - nk1;
  s.piece_off[1] = nk1;
  const AttentionShape qshape{1, n, hq, hq, d};
  const AttentionShape kshape{1, nk, hkv, hkv, d};
  auto qi = MakeRandomInputs(qshape, pc.dtype, seed);
  auto ki = MakeRandomInputs(kshape, pc.dtype, seed + 1);
  std::vector<float> qf(qi.q.numel()), kf(ki.k.numel()), vf(ki.v.numel());
  qi.q.ToFloat32(qf.data());
  ki.k.ToFloat32(kf.data());
  ki.v.ToFloat32(vf.data());
  auto dq = UploadTensor(alloc, qi.q);
  auto dk = UploadTensor(alloc, ki.k);
  auto dv = UploadTensor(alloc, ki.v);
  ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok());
  s.q = std::move(*dq);
  s.k = std::move(*dk);
  s.v = std::move(*dv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const int64_t nqb = (n + bs - 1) / bs;
  for (int piece = 0; piece < 2; ++piece) {
    const int64_t off = s.piece_off[piece] * hkv * d;
    const HostCsr csr = RandomCsr(nqb, (s.piece_len[piece] + bs - 1) / bs, rng);
    s.ref[piece] = ReferencePiece(qf, std::vector<float>(kf.begin() + off, kf.end()),
                                  std::vector<float>(vf.begin() + off, vf.end()), n,
                                  s.piece_len[piece], hq, hkv, d, bs, csr, pc.q_off,
                                  s.piece_off[piece], pc.rule_causal, pc.rule_window, scale);
    auto rp = UploadVector(alloc, csr.row_ptr);
    auto ci = UploadVector(alloc, csr.col_idx);
    auto mk = UploadVector(alloc, csr.mask);
    ASSERT_TRUE(rp.ok() && ci.ok() && mk.ok());
    s.row_ptr[piece] = std::move(*rp);
    s.col_idx[piece] = std::move(*ci);
    s.mask[piece] = std::move(*mk);
  }
}

// The launch of key piece `piece` into `o` (f32 when accumulating) and `lse`.
FlashFwdParams PieceParams(const PieceCase& pc, const PieceSetup& s, int piece, bool accumulate,
                           void* o, float* lse) {
  const size_t esz = DTypeSize(pc.dtype);
  const int64_t kv_off = s.piece_off[piece] * PieceSetup::kHkv * pc.head_dim * esz;
  FlashFwdTensors t;
  t.q = s.q.get();
  t.k = static_cast<const std::byte*>(s.k.get()) + kv_off;
  t.v = static_cast<const std::byte*>(s.v.get()) + kv_off;
  t.o = o;
  t.lse = lse;
  t.shape = {1, pc.n, PieceSetup::kHq, PieceSetup::kHkv, pc.head_dim};
  t.kv_tokens = pc.nk;
  t.dtype = pc.dtype;
  FlashFwdRange range;
  range.q_len = pc.n;
  range.kv_len = s.piece_len[piece];
  range.q_pos_offset = pc.q_off;
  range.k_pos_offset = s.piece_off[piece];
  range.accumulate = accumulate;
  FlashFwdLayoutView layout;
  layout.kind = FlashFwdLayoutView::Kind::kCsr;
  layout.block_size = pc.block;
  layout.row_ptr = s.row_ptr[piece].as<int64_t>();
  layout.col_idx = s.col_idx[piece].as<int32_t>();
  layout.block_mask = s.mask[piece].as<uint8_t>();
  layout.rule_causal = pc.rule_causal;
  layout.rule_window = pc.rule_window;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(pc.head_dim)));
  return BuildFlashFwdParams(t, range, layout, scale);
}

class FlashSm90PieceTest : public ::testing::TestWithParam<PieceCase> {};

// Two key pieces [0, nk1) and [nk1, nk), each with its own CSR, launched in accumulate mode into
// one f32 O / LSE (LSE starts at -inf, O poisoned), then one non-accumulate launch of piece 0
// alone; both compared with the float64 loop.
TEST_P(FlashSm90PieceTest, RectangularPiecesWithOffsets) {
  SKIP_WITHOUT_SM90();
  const PieceCase& pc = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(pc.name, " seed=", seed));
  CachingAllocator alloc(0);
  PieceSetup s;
  SetUpPieces(pc, seed, alloc, s);
  if (HasFatalFailure()) return;
  const int hq = PieceSetup::kHq, d = pc.head_dim;
  const int64_t n = pc.n;
  const size_t esz = DTypeSize(pc.dtype);
  auto dacc = DeviceBuffer::Create(alloc, n * hq * d * sizeof(float));
  auto dout = DeviceBuffer::Create(alloc, n * hq * d * esz);
  auto dlse = DeviceBuffer::Create(alloc, n * hq * sizeof(float));
  ASSERT_TRUE(dacc.ok() && dout.ok() && dlse.ok());
  // Every schedule.
  // The persistent one with TMA loads (default) and with cp.async loads.
  struct Run {
    Sm90Schedule schedule;
    bool tma;
  };
  std::vector<Run> runs;
  for (const Sm90Schedule schedule : TestSchedules()) {
    runs.push_back({schedule, true});
    if (schedule == Sm90Schedule::kPersistent) runs.push_back({schedule, false});
  }
  for (const auto& [schedule, tma] : runs) {
    SCOPED_TRACE(absl::StrCat("schedule ", std::string(Sm90ScheduleName(schedule)),
                              tma ? "" : ", cp.async"));
    FlashKernelOptions options = ForcedSm90(schedule);
    options.sm90_tma = tma;
    {
      std::vector<float> ninf(n * hq, -std::numeric_limits<float>::infinity());
      ASSERT_EQ(cudaMemcpy(dlse->get(), ninf.data(), ninf.size() * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(dacc->get(), 0xFF, n * hq * d * sizeof(float)), cudaSuccess);
    }
    for (int piece = 0; piece < 2; ++piece) {
      FlashKernel ran = FlashKernel::kSm80;
      const absl::Status st = RunAttentionForward(
          PieceParams(pc, s, piece, /*accumulate=*/true, dacc->get(), dlse->as<float>()), options,
          nullptr, &ran);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(ran, ExpectedSm90Kernel(schedule)) << FlashKernelName(ran);
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
    ExpectMatchesPieces(s.ref, 2, n, hq, d, acc, lse, OTol(pc.dtype),
                        "accumulate, two pieces (f32 output)");

    // Piece 0 alone, plain store in the input dtype.
    ASSERT_EQ(cudaMemset(dout->get(), 0xFF, n * hq * d * esz), cudaSuccess);
    ASSERT_EQ(cudaMemset(dlse->get(), 0xFF, n * hq * 4), cudaSuccess);
    const absl::Status st = RunAttentionForward(
        PieceParams(pc, s, 0, /*accumulate=*/false, dout->get(), dlse->as<float>()), options,
        nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto o = HostTensor::Create(pc.dtype, {1, n, hq, d});
    ASSERT_TRUE(o.ok());
    ASSERT_EQ(cudaMemcpy(o->data(), dout->get(), o->nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lse.data(), dlse->get(), lse.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<float> of(o->numel());
    o->ToFloat32(of.data());
    ExpectMatchesPieces(s.ref, 1, n, hq, d, of, lse, OTol(pc.dtype), "piece 0, store");
  }  // schedules
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

}  // namespace
}  // namespace attnserve
