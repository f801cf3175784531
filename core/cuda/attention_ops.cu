#include "core/cuda/attention_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace attnserve {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t work, int per_block = kThreads) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  // Grid-stride loops cover anything beyond this.
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));
}

__device__ __forceinline__ float LoadAsFloat(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

__device__ __forceinline__ void StoreFromFloat(DType dt, void* p, int64_t i, float v) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
  }
}

__global__ void ConvertKernel(DType in_dt, const void* in, DType out_dt, void* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    StoreFromFloat(out_dt, out, i, LoadAsFloat(in_dt, in, i));
  }
}

__global__ void FillFloatKernel(float* out, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void FillUniformKernel(DType dt, void* out, int64_t n, uint64_t seed, float lo,
                                  float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = SplitMix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    StoreFromFloat(dt, out, i, lo + (hi - lo) * u);
  }
}

}  // namespace

cudaError_t LaunchConvert(DType in_dtype, const void* in, DType out_dtype, void* out, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(in_dtype, in, out_dtype, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchFillFloat(float* out, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillFloatKernel<<<GridFor(n), kThreads, 0, stream>>>(out, value, n);
  return cudaGetLastError();
}

cudaError_t LaunchFillUniform(DType dtype, void* out, int64_t n, uint64_t seed, float lo, float hi,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillUniformKernel<<<GridFor(n), kThreads, 0, stream>>>(dtype, out, n, seed, lo, hi);
  return cudaGetLastError();
}

}  // namespace attnserve
