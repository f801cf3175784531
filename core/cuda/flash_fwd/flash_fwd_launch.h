// flash_fwd launch: grid, shared memory and stream for one (head dim, dtype, block size).
// Included by exactly one .cu per (head dim, dtype), which instantiates RunFlashFwd for both block
// sizes. Everything else goes through RunAttentionForward (core/cuda/cuda_attention.h), the
// one runtime -> template dispatch.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_LAUNCH_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_LAUNCH_H_

#include <cuda_runtime.h>

#include "core/cuda/flash_fwd/flash_fwd_params.h"

namespace attnserve {

// Launches the kernel for params (validated by the caller). Returns the launch error, if any.
template <int kHeadDim, int kBlockM, typename Elem>
cudaError_t RunFlashFwd(const FlashFwdParams& params, cudaStream_t stream);

}  // namespace attnserve

#ifdef __CUDACC__
#include "core/cuda/flash_fwd/flash_fwd_kernel.cuh"

namespace attnserve {

template <int kHeadDim, int kBlockM, typename Elem>
cudaError_t RunFlashFwd(const FlashFwdParams& params, cudaStream_t stream) {
  using Traits = typename FlashFwdConfig<kHeadDim, kBlockM, Elem>::Traits;
  auto kernel = &flash_fwd::FlashFwdKernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  // Above 48 KB the dynamic shared memory limit has to be raised per kernel (idempotent, cheap).
  if constexpr (kSmem > 48 * 1024) {
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  // grid: (query blocks, heads, batch * segments). gridDim.y/z are limited to 65535.
  const dim3 grid(static_cast<unsigned>(params.num_q_blocks), static_cast<unsigned>(params.num_heads),
                  static_cast<unsigned>(params.batch * params.num_segs));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace attnserve
#endif  // __CUDACC__

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_LAUNCH_H_
