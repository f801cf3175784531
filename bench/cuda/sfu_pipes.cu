// Kernels of attnbench_sfu (sfu_pipes.h). Each CTA (one per SM) times its own loop with clock64;
// a row's figure is the mean over the CTAs of cycles / (units per warp * warps per sub-partition).
#include "bench/cuda/sfu_pipes.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"
#include "core/cuda/flash_fwd_sm90/wgmma_ops.h"

namespace attnserve::bench {
namespace {

__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t CvtBf16x2(float lo, float hi) {
  uint32_t r;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Round-half-up bf16 pair by integer ops (two adds and a byte permute), the conversion's
// alternative off the conversion unit.
__device__ __forceinline__ uint32_t IntPackBf16x2(float lo, float hi) {
  const uint32_t a = __float_as_uint(lo) + 0x8000u;
  const uint32_t b = __float_as_uint(hi) + 0x8000u;
  uint32_t r;
  asm volatile("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// 2^x on the FMA pipe: x = j + f, j = round(x) by a magic-number add, 2^f by a degree-3
// polynomial on [-0.5, 0.5], j added into the exponent field (x in (-126, 0]).
__device__ __forceinline__ float Exp2Poly(float x) {
  const float t = x + 12582912.f;
  const float f = x - (t - 12582912.f);
  const float p =
      fmaf(fmaf(fmaf(0.0555041086648216f, f, 0.2402264923172690f), f, 0.6931471805599453f), f,
           1.0f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

enum Mode : int {
  kEx2 = 0,         // ex2, then a dependent add
  kCvt = 1,         // bf16x2 conversion, a mask and an add (the result fed back)
  kFfma = 2,        // two dependent FMAs (with a register and an immediate)
  kEx2Cvt = 3,      // kEx2, plus a conversion of every second pair
  kEx2IntPack = 4,  // kEx2, plus an integer pack of every second pair
  kPoly = 5,        // Exp2Poly, then a dependent add
  kFadd = 6,        // two dependent adds of register operands
  kFmnmx = 7,       // a max and a min of register operands (the row maxima's instruction)
  kFfma3 = 8,       // two dependent FMAs of three register operands
};

// One unit of kMode on chain value v with per-chain register operands w and u (kFadd, kFmnmx,
// kFfma3; the other modes ignore them).
template <int kMode>
__device__ __forceinline__ void FpUnit(float& v, float& w, float u) {
  if constexpr (kMode == kFadd) {
    v = __fadd_rn(v, w);  // not contracted with u's product into an FMA
    v = __fadd_rn(v, u);
  } else if constexpr (kMode == kFmnmx) {
    v = fmaxf(v, w);
    w = fminf(w, v);
  } else if constexpr (kMode == kFfma3) {
    v = fmaf(v, w, u);
    v = fmaf(v, w, u);
  } else {
    v = fmaf(v, 0.999f, -0.001f);
    v = fmaf(v, 0.999f, -0.001f);
  }
}

// kChains independent chains per thread, each `iters` units of kMode.
template <int kMode, int kChains>
__global__ void SfuLoop(float* out, long long* cycles, int iters, float seed) {
  float v[kChains], w[kChains], u[kChains];
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    v[i] = -1e-3f * static_cast<float>(threadIdx.x + i + 1);
    w[i] = 0.999f - seed * static_cast<float>(i);  // from a kernel argument: registers,
    u[i] = -seed * static_cast<float>(i + 1);       // not immediates
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; ++i) {
      if constexpr (kMode == kEx2 || kMode == kEx2Cvt || kMode == kEx2IntPack) {
        v[i] = Ex2(v[i]) - 1.5f;
        if constexpr (kMode == kEx2Cvt) {
          if (i & 1) acc ^= CvtBf16x2(v[i - 1], v[i]);
        }
        if constexpr (kMode == kEx2IntPack) {
          if (i & 1) acc ^= IntPackBf16x2(v[i - 1], v[i]);
        }
      } else if constexpr (kMode == kCvt) {
        const uint32_t r = CvtBf16x2(v[i], v[(i + 1) % kChains]);
        v[i] = __uint_as_float(r & 0xffff0000u) - 0.5f;
      } else if constexpr (kMode == kFfma || kMode == kFadd || kMode == kFmnmx ||
                           kMode == kFfma3) {
        FpUnit<kMode>(v[i], w[i], u[i]);
      } else {
        v[i] = Exp2Poly(v[i]) - 1.5f;
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kChains; ++i) s += v[i] + w[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s + static_cast<float>(acc & 1u);
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

// Warpgroup 0 runs eight chains of kMode (kEx2 or an FpUnit mode) for `iters` rounds and times
// them; warpgroup 1 meanwhile issues wgmma m64n128k16 (bf16, f32 accumulators) in commit groups
// of 8, waiting for each group: kRs = false both operands from shared memory (64 KB of bf16
// values), true A from registers. It times its first kTimedGroups groups, which end inside
// warpgroup 0's loop (at most ~510k cycles against ~390k-1M of that loop on an H200), and runs
// 1500 in all, so that warpgroup 0 never runs alone.
constexpr int kTimedGroups = 300;
constexpr int kWgmmaSmem = 65536;
template <int kMode, bool kRs>
__global__ void __launch_bounds__(256) NextToWgmma(float* out, long long* cycles,
                                                   long long* wgmma_cycles, int iters,
                                                   float seed) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < kWgmmaSmem / 4; i += blockDim.x) {  // bf16 in [2^-7, 2^-6)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x007f007fu);
  }
  flash_sm90::FenceProxyAsyncShared();
  __syncthreads();
  if (threadIdx.x >= 128) {
    constexpr int kGroups = 1500;
    const uint32_t base = flash_sm90::SmemAddr(smem);
    const uint64_t da = flash_sm90::MakeDesc(base, 16, 1024);
    const uint64_t db = flash_sm90::MakeDesc(base + 16384, 16, 1024);
    const uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    const long long t0 = clock64();
    long long t1 = t0;
    for (int g = 0; g < kGroups; ++g) {
      flash_sm90::WgmmaFence();
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if constexpr (kRs) {
          flash_sm90::Wgmma<128, true>::Rs(acc, a, flash_sm90::DescAdd(db, k * 256), 1);
        } else {
          flash_sm90::Wgmma<128, true>::Ss(acc, flash_sm90::DescAdd(da, k * 2),
                                           flash_sm90::DescAdd(db, k * 64), 1);
        }
      }
      flash_sm90::WgmmaCommit();
      flash_sm90::WgmmaWait<0>();
      if (g + 1 == kTimedGroups) t1 = clock64();
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 128) wgmma_cycles[blockIdx.x] = t1 - t0;
    return;
  }
  float v[8], w[8], u[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = -1e-3f * static_cast<float>(threadIdx.x + i + 1);
    w[i] = 0.999f - seed * static_cast<float>(i);  // from a kernel argument: registers,
    u[i] = -seed * static_cast<float>(i + 1);       // not immediates
  }
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (kMode == kEx2) {
        v[i] = Ex2(v[i]) - 1.5f;
      } else {
        FpUnit<kMode>(v[i], w[i], u[i]);
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s += v[i] + w[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
#endif
}

struct Buffers {
  float* out = nullptr;
  long long* cycles = nullptr;
  long long* wgmma_cycles = nullptr;
  ~Buffers() {
    cudaFree(out);
    cudaFree(cycles);
    cudaFree(wgmma_cycles);
  }
};

double MeanOf(const std::vector<long long>& v) {
  double m = 0;
  for (long long c : v) m += static_cast<double>(c);
  return v.empty() ? 0 : m / static_cast<double>(v.size());
}

template <int kMode, int kChains>
bool Row(const char* name, int warps, int chains_reported, int sms, Buffers& b,
         std::vector<SfuRow>& rows, std::string* error) {
  constexpr int kIters = 4096;
  const int threads = 128 * warps;  // four sub-partitions per SM: `warps` warps on each
  SfuLoop<kMode, kChains><<<sms, threads>>>(b.out, b.cycles, 16, 1e-4f);  // warm-up
  SfuLoop<kMode, kChains><<<sms, threads>>>(b.out, b.cycles, kIters, 1e-4f);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  std::vector<long long> host(sms);
  if (err == cudaSuccess) {
    err = cudaMemcpy(host.data(), b.cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    *error = std::string(name) + ": " + cudaGetErrorString(err);
    return false;
  }
  rows.push_back(
      {name, warps, chains_reported, MeanOf(host) / (double{kIters} * kChains * warps), "", 0});
  return true;
}

// One warp per sub-partition runs kMode next to a warpgroup issuing wgmma (kRs: A from
// registers); or, with `alone`, the wgmma warpgroup by itself (the row's unit is "-").
template <int kMode, bool kRs>
bool WgmmaRow(const char* name, bool alone, int sms, Buffers& b, std::vector<SfuRow>& rows,
              std::string* error) {
  const int iters = kMode == kEx2 ? 4096 : 16384;  // warpgroup 0 outlasts the timed groups
  auto* kernel = NextToWgmma<kMode, kRs>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgmmaSmem);
  if (err == cudaSuccess) {
    kernel<<<sms, 256, kWgmmaSmem>>>(b.out, b.cycles, b.wgmma_cycles, alone ? 0 : iters,
                                     1e-4f);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
  }
  std::vector<long long> exp_cycles(sms), wgmma_cycles(sms);
  if (err == cudaSuccess) {
    err = cudaMemcpy(exp_cycles.data(), b.cycles, sizeof(long long) * sms,
                     cudaMemcpyDeviceToHost);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpy(wgmma_cycles.data(), b.wgmma_cycles, sizeof(long long) * sms,
                     cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    *error = std::string("next to wgmma: ") + cudaGetErrorString(err);
    return false;
  }
  rows.push_back({alone ? "-" : name, 1, 0,
                  alone ? 0 : MeanOf(exp_cycles) / (double{iters} * 8), kRs ? "RS" : "SS",
                  MeanOf(wgmma_cycles) / (double{kTimedGroups} * 8)});
  return true;
}

// The SS row, then the RS row, of kMode next to wgmma (or of the wgmma alone).
template <int kMode>
bool WgmmaRows(const char* name, bool alone, int sms, Buffers& b, std::vector<SfuRow>& rows,
               std::string* error) {
  return WgmmaRow<kMode, false>(name, alone, sms, b, rows, error) &&
         WgmmaRow<kMode, true>(name, alone, sms, b, rows, error);
}

}  // namespace

std::vector<SfuRow> RunSfuRows(int device, std::string* error) {
  std::vector<SfuRow> rows;
  int sms = 0;
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  Buffers b;
  if (err == cudaSuccess) err = cudaMalloc(&b.out, sizeof(float) * sms * 512);
  if (err == cudaSuccess) err = cudaMalloc(&b.cycles, sizeof(long long) * sms);
  if (err == cudaSuccess) err = cudaMalloc(&b.wgmma_cycles, sizeof(long long) * sms);
  int major = 0;
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err != cudaSuccess) {
    *error = cudaGetErrorString(err);
    return {};
  }
  bool ok = true;
  // Throughput: eight independent chains per warp, one, two and four warps per sub-partition.
  for (int w : {1, 2, 4}) {
    ok = ok && Row<kEx2, 8>("ex2 + fadd", w, 0, sms, b, rows, error);
    ok = ok && Row<kCvt, 8>("cvt.rn.bf16x2 + lop + fadd", w, 0, sms, b, rows, error);
    ok = ok && Row<kFfma, 8>("2 ffma", w, 0, sms, b, rows, error);
    ok = ok && Row<kEx2Cvt, 8>("ex2 + fadd, cvt.rn.bf16x2 per 2", w, 0, sms, b, rows, error);
    ok = ok && Row<kEx2IntPack, 8>("ex2 + fadd, integer pack per 2", w, 0, sms, b, rows, error);
    ok = ok && Row<kPoly, 8>("polynomial exp2 + fadd", w, 0, sms, b, rows, error);
  }
  ok = ok && Row<kFfma3, 8>("2 ffma, 3 register operands", 1, 0, sms, b, rows, error);
  ok = ok && Row<kFadd, 8>("2 fadd", 1, 0, sms, b, rows, error);
  ok = ok && Row<kFmnmx, 8>("fmnmx max + min", 1, 0, sms, b, rows, error);
  // Latency: one warp per sub-partition, `chains` dependent ex2 + fadd chains in flight.
  ok = ok && Row<kEx2, 1>("ex2 + fadd", 1, 1, sms, b, rows, error);
  ok = ok && Row<kEx2, 2>("ex2 + fadd", 1, 2, sms, b, rows, error);
  ok = ok && Row<kEx2, 3>("ex2 + fadd", 1, 3, sms, b, rows, error);
  ok = ok && Row<kEx2, 4>("ex2 + fadd", 1, 4, sms, b, rows, error);
  ok = ok && Row<kEx2, 6>("ex2 + fadd", 1, 6, sms, b, rows, error);
  // Next to wgmma (Hopper): the same units with one warp per sub-partition while the other
  // warpgroup's GEMMs run, and the GEMMs' own rate alone and with each neighbour.
  if (major == 9) {
    ok = ok && WgmmaRows<kEx2>("", /*alone=*/true, sms, b, rows, error);
    ok = ok && WgmmaRows<kEx2>("ex2 + fadd", false, sms, b, rows, error);
    ok = ok && WgmmaRows<kFfma>("2 ffma", false, sms, b, rows, error);
    ok = ok && WgmmaRows<kFfma3>("2 ffma, 3 register operands", false, sms, b, rows, error);
    ok = ok && WgmmaRows<kFadd>("2 fadd", false, sms, b, rows, error);
    ok = ok && WgmmaRows<kFmnmx>("fmnmx max + min", false, sms, b, rows, error);
  }
  if (!ok) return {};
  return rows;
}

}  // namespace attnserve::bench
