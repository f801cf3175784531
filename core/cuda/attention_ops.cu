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

// Weights of the LSE rule for one (acc, new) pair: acc' = wa * acc + wn * new. A new lse of -inf
// (nothing admitted) keeps the accumulator (wa = 1, wn = 0); an empty accumulator takes the new.
__device__ __forceinline__ void MergeWeights(float acc_lse, float new_lse, float& wa, float& wn) {
  if (new_lse == -INFINITY) {
    wa = 1.f;
    wn = 0.f;
    return;
  }
  const float m = fmaxf(acc_lse, new_lse);
  const float ea = acc_lse == -INFINITY ? 0.f : __expf(acc_lse - m);
  const float en = __expf(new_lse - m);
  const float inv = 1.f / (ea + en);
  wa = ea * inv;
  wn = en * inv;
}

// One thread per 4 consecutive elements of one (batch, row, head) of O. Reads the accumulator's
// old LSE; the LSE itself is updated by MergeLseKernel, launched after this one.
template <typename Elem>
__global__ void MergeOKernel(const Elem* o, const float* lse, float* acc_o, const float* acc_lse,
                             int64_t rows, int64_t heads, int64_t head_dim,
                             int64_t acc_o_batch_stride, int64_t acc_lse_batch_stride,
                             int64_t acc_lse_head_stride, int64_t total_quads) {
  const int64_t quads_per_head = head_dim / 4;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total_quads;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % quads_per_head;
    int64_t t = i / quads_per_head;
    const int64_t h = t % heads;
    t /= heads;
    const int64_t r = t % rows;
    const int64_t b = t / rows;
    float wa, wn;
    MergeWeights(acc_lse[b * acc_lse_batch_stride + h * acc_lse_head_stride + r],
                 lse[(b * heads + h) * rows + r], wa, wn);
    if (wn == 0.f) continue;
    const Elem* src = o + ((b * rows + r) * heads + h) * head_dim + c * 4;
    float4* dst = reinterpret_cast<float4*>(acc_o + b * acc_o_batch_stride +
                                            (r * heads + h) * head_dim + c * 4);
    float4 a = *dst;
    a.x = wa * a.x + wn * static_cast<float>(src[0]);
    a.y = wa * a.y + wn * static_cast<float>(src[1]);
    a.z = wa * a.z + wn * static_cast<float>(src[2]);
    a.w = wa * a.w + wn * static_cast<float>(src[3]);
    *dst = a;
  }
}

__global__ void MergeLseKernel(const float* lse, float* acc_lse, int64_t rows, int64_t heads,
                               int64_t acc_lse_batch_stride, int64_t acc_lse_head_stride,
                               int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i % rows;
    const int64_t h = (i / rows) % heads;
    const int64_t b = i / (rows * heads);
    const float n = lse[i];
    if (n == -INFINITY) continue;
    float* a = acc_lse + b * acc_lse_batch_stride + h * acc_lse_head_stride + r;
    const float m = fmaxf(*a, n);
    *a = *a == -INFINITY ? n : m + __logf(__expf(*a - m) + __expf(n - m));
  }
}

}  // namespace

cudaError_t LaunchLseMergeInto(DType o_dtype, const void* o, const float* lse, float* acc_o,
                               float* acc_lse, int64_t batch, int64_t rows, int64_t heads,
                               int64_t head_dim, int64_t acc_o_batch_stride,
                               int64_t acc_lse_batch_stride, int64_t acc_lse_head_stride,
                               cudaStream_t stream) {
  if (batch == 0 || rows == 0 || heads == 0) return cudaSuccess;
  if (head_dim % 4 != 0 || acc_o_batch_stride % 4 != 0 ||
      reinterpret_cast<uintptr_t>(acc_o) % 16 != 0 ||
      (o_dtype != DType::kBF16 && o_dtype != DType::kF16)) {
    return cudaErrorInvalidValue;
  }
  const int64_t quads = batch * rows * heads * (head_dim / 4);
  if (o_dtype == DType::kBF16) {
    MergeOKernel<__nv_bfloat16><<<GridFor(quads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(o), lse, acc_o, acc_lse, rows, heads, head_dim,
        acc_o_batch_stride, acc_lse_batch_stride, acc_lse_head_stride, quads);
  } else {
    MergeOKernel<__half><<<GridFor(quads), kThreads, 0, stream>>>(
        static_cast<const __half*>(o), lse, acc_o, acc_lse, rows, heads, head_dim,
        acc_o_batch_stride, acc_lse_batch_stride, acc_lse_head_stride, quads);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t items = batch * heads * rows;
  MergeLseKernel<<<GridFor(items), kThreads, 0, stream>>>(lse, acc_lse, rows, heads,
                                                          acc_lse_batch_stride,
                                                          acc_lse_head_stride, items);
  return cudaGetLastError();
}

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
