// Kernels of attnbench_sfu (sfu_pipes.h). Each CTA (one per SM) times its own loop with clock64;
// a row's figure is the mean over the CTAs of cycles / (units per warp * warps per sub-partition).
#include "bench/cuda/sfu_pipes.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

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
  kFfma = 2,        // two dependent FMAs
  kEx2Cvt = 3,      // kEx2, plus a conversion of every second pair
  kEx2IntPack = 4,  // kEx2, plus an integer pack of every second pair
  kPoly = 5,        // Exp2Poly, then a dependent add
};

// kChains independent chains per thread, each `iters` units of kMode.
template <int kMode, int kChains>
__global__ void SfuLoop(float* out, long long* cycles, int iters) {
  float v[kChains];
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < kChains; ++i) v[i] = -1e-3f * static_cast<float>(threadIdx.x + i + 1);
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
      } else if constexpr (kMode == kFfma) {
        v[i] = fmaf(v[i], 0.999f, -0.001f);
        v[i] = fmaf(v[i], 0.999f, -0.001f);
      } else {
        v[i] = Exp2Poly(v[i]) - 1.5f;
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kChains; ++i) s += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s + static_cast<float>(acc & 1u);
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

struct Buffers {
  float* out = nullptr;
  long long* cycles = nullptr;
  ~Buffers() {
    cudaFree(out);
    cudaFree(cycles);
  }
};

template <int kMode, int kChains>
bool Row(const char* name, int warps, int chains_reported, int sms, Buffers& b,
         std::vector<SfuRow>& rows, std::string* error) {
  constexpr int kIters = 4096;
  const int threads = 128 * warps;  // four sub-partitions per SM: `warps` warps on each
  SfuLoop<kMode, kChains><<<sms, threads>>>(b.out, b.cycles, 16);  // warm-up
  SfuLoop<kMode, kChains><<<sms, threads>>>(b.out, b.cycles, kIters);
  cudaError_t err = cudaDeviceSynchronize();
  std::vector<long long> host(sms);
  if (err == cudaSuccess) {
    err = cudaMemcpy(host.data(), b.cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    *error = std::string(name) + ": " + cudaGetErrorString(err);
    return false;
  }
  double mean = 0;
  for (long long c : host) mean += static_cast<double>(c);
  mean /= sms;
  rows.push_back({name, warps, chains_reported, mean / (double{kIters} * kChains * warps)});
  return true;
}

}  // namespace

std::vector<SfuRow> RunSfuRows(int device, std::string* error) {
  std::vector<SfuRow> rows;
  int sms = 0;
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  Buffers b;
  if (err == cudaSuccess) err = cudaMalloc(&b.out, sizeof(float) * sms * 512);
  if (err == cudaSuccess) err = cudaMalloc(&b.cycles, sizeof(long long) * sms);
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
  // Latency: one warp per sub-partition, `chains` dependent ex2 + fadd chains in flight.
  ok = ok && Row<kEx2, 1>("ex2 + fadd", 1, 1, sms, b, rows, error);
  ok = ok && Row<kEx2, 2>("ex2 + fadd", 1, 2, sms, b, rows, error);
  ok = ok && Row<kEx2, 3>("ex2 + fadd", 1, 3, sms, b, rows, error);
  ok = ok && Row<kEx2, 4>("ex2 + fadd", 1, 4, sms, b, rows, error);
  ok = ok && Row<kEx2, 6>("ex2 + fadd", 1, 6, sms, b, rows, error);
  if (!ok) return {};
  return rows;
}

}  // namespace attnserve::bench
