// flash_decode launch: grid, shared memory and stream for one (head dim, dtype), every row tile
// count. Included by exactly one .cu per (head dim, dtype); everything else goes through
// RunFlashDecode (flash_decode.h), the one runtime -> template dispatch of the family.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_LAUNCH_H_
#define ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_LAUNCH_H_

#include <cuda_runtime.h>

#include "core/cuda/flash_decode/flash_decode_params.h"

namespace attnserve {

// Launches the split kernel and, with more than one split, the combine (params validated by the
// caller). Returns the launch error, if any.
template <int kHeadDim, typename Elem>
cudaError_t RunFlashDecodeKernels(const FlashDecodeParams& params, cudaStream_t stream);

// CTAs of the split kernel for `rows` packed rows (the wgmma kernel when `wgmma`) that fit on one
// SM of the current device.
template <int kHeadDim, typename Elem>
cudaError_t FlashDecodeCtasPerSm(int rows, bool wgmma, int* ctas);

}  // namespace attnserve

#ifdef __CUDACC__
#include "core/cuda/flash_decode/flash_decode_kernel.cuh"
#include "core/cuda/flash_decode/flash_decode_sm90_kernel.cuh"

namespace attnserve {
namespace flash_decode {

// The split kernel of a traits type: the mma.sync kernel for FlashDecodeTraits, the wgmma one for
// FlashDecodeSm90Traits.
template <typename Traits>
struct SplitKernel {
  static constexpr auto kFn = &FlashDecodeKernel<Traits>;
};
template <int kHeadDim, typename Elem>
struct SplitKernel<FlashDecodeSm90Traits<kHeadDim, Elem>> {
  static constexpr auto kFn = &FlashDecodeSm90Kernel<FlashDecodeSm90Traits<kHeadDim, Elem>>;
};

template <typename Traits>
cudaError_t PrepareKernel() {
  constexpr int kSmem = Traits::kSmemBytes;
  // Above 48 KB the dynamic shared memory limit has to be raised per kernel (idempotent, cheap).
  if constexpr (kSmem > 48 * 1024) {
    return cudaFuncSetAttribute(SplitKernel<Traits>::kFn,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  }
  return cudaSuccess;
}

template <typename Traits>
cudaError_t Launch(const FlashDecodeParams& p, cudaStream_t stream) {
  cudaError_t err = PrepareKernel<Traits>();
  if (err != cudaSuccess) return err;
  // grid: (splits, KV heads, batch); gridDim.y/z are limited to 65535 (checked by the dispatch).
  const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.kv_heads),
                  static_cast<unsigned>(p.batch));
  SplitKernel<Traits>::kFn<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  const dim3 combine_grid(static_cast<unsigned>(p.q_len * p.kv_group),
                          static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
  FlashDecodeCombineKernel<typename Traits::Elem>
      <<<combine_grid, static_cast<unsigned>(p.head_dim), p.num_splits * sizeof(float), stream>>>(
          p);
  return cudaGetLastError();
}

template <typename Traits>
cudaError_t Occupancy(int* ctas) {
  cudaError_t err = PrepareKernel<Traits>();
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, SplitKernel<Traits>::kFn,
                                                       Traits::kNThreads, Traits::kSmemBytes);
}

}  // namespace flash_decode

template <int kHeadDim, typename Elem>
cudaError_t RunFlashDecodeKernels(const FlashDecodeParams& p, cudaStream_t stream) {
  if (p.wgmma) return flash_decode::Launch<FlashDecodeSm90Traits<kHeadDim, Elem>>(p, stream);
  const int rows = p.q_len * p.kv_group;
  if (rows <= 16) return flash_decode::Launch<FlashDecodeTraits<kHeadDim, Elem, 1>>(p, stream);
  if (rows <= 32) return flash_decode::Launch<FlashDecodeTraits<kHeadDim, Elem, 2>>(p, stream);
  return flash_decode::Launch<FlashDecodeTraits<kHeadDim, Elem, 4>>(p, stream);
}

template <int kHeadDim, typename Elem>
cudaError_t FlashDecodeCtasPerSm(int rows, bool wgmma, int* ctas) {
  if (wgmma) return flash_decode::Occupancy<FlashDecodeSm90Traits<kHeadDim, Elem>>(ctas);
  if (rows <= 16) return flash_decode::Occupancy<FlashDecodeTraits<kHeadDim, Elem, 1>>(ctas);
  if (rows <= 32) return flash_decode::Occupancy<FlashDecodeTraits<kHeadDim, Elem, 2>>(ctas);
  return flash_decode::Occupancy<FlashDecodeTraits<kHeadDim, Elem, 4>>(ctas);
}

}  // namespace attnserve
#endif  // __CUDACC__

#endif  // ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_LAUNCH_H_
