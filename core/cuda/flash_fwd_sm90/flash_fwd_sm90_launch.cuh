// flash_fwd_sm90 launch: grid, shared memory and stream for one (head dim, block, dtype).
// Included by the per-dtype .cu files, which instantiate RunFlashFwdSm90Impl.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_LAUNCH_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_LAUNCH_CUH_

#include <cuda_runtime.h>

#include "core/cuda/flash_fwd/flash_fwd_params.h"

namespace attnserve {

template <int kHeadDim, int kBlock, typename Elem>
cudaError_t RunFlashFwdSm90Impl(const FlashFwdParams& params, cudaStream_t stream);

// v2 (warp-specialized, flash_fwd_sm90_v2_kernel.cuh): layout block 128 only.
template <int kHeadDim, typename Elem>
cudaError_t RunFlashFwdSm90V2Impl(const FlashFwdParams& params, cudaStream_t stream);

// v3 (persistent v2, flash_fwd_sm90_v3_kernel.cuh): layout block 128 only; grid = min(num_sms,
// work items). pos_major: work items ordered by query-block position first (heavy-first across
// heads), else by head first (K/V of one head shared in L2 by the CTAs running together).
// overlap: the consumers overlap each tile's softmax with the previous tile's P V GEMM.
template <int kHeadDim, typename Elem>
cudaError_t RunFlashFwdSm90V3Impl(const FlashFwdParams& params, int num_sms, bool pos_major,
                                  bool overlap, cudaStream_t stream);

}  // namespace attnserve

#ifdef __CUDACC__
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_kernel.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_v2_kernel.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_v3_kernel.cuh"

namespace attnserve {

template <int kHeadDim, int kBlock, typename Elem>
cudaError_t RunFlashFwdSm90Impl(const FlashFwdParams& params, cudaStream_t stream) {
  using Traits = flash_sm90::Sm90Traits<kHeadDim, kBlock, Elem>;
  auto kernel = &flash_sm90::FlashFwdSm90Kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(params.num_q_blocks),
                  static_cast<unsigned>(params.num_heads),
                  static_cast<unsigned>(params.batch * params.num_segs));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

template <int kHeadDim, typename Elem>
cudaError_t RunFlashFwdSm90V2Impl(const FlashFwdParams& params, cudaStream_t stream) {
  using Traits = flash_sm90::Sm90V2Traits<kHeadDim, Elem>;
  auto kernel = &flash_sm90::FlashFwdSm90V2Kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(params.num_q_blocks),
                  static_cast<unsigned>(params.num_heads),
                  static_cast<unsigned>(params.batch * params.num_segs));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

template <int kHeadDim, typename Elem>
cudaError_t RunFlashFwdSm90V3Impl(const FlashFwdParams& params, int num_sms, bool pos_major,
                                  bool overlap, cudaStream_t stream) {
  using Traits = flash_sm90::Sm90V3Traits<kHeadDim, Elem>;
  auto kernel = overlap ? &flash_sm90::FlashFwdSm90V3Kernel<Traits, true>
                        : &flash_sm90::FlashFwdSm90V3Kernel<Traits, false>;
  constexpr int kSmem = Traits::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const long long items = static_cast<long long>(params.num_q_blocks) * params.num_heads *
                          params.batch * params.num_segs;
  if (items <= 0) return cudaSuccess;
  if (items > (1LL << 30)) return cudaErrorInvalidValue;  // int item index (+ grid) in the kernel
  const unsigned grid =
      static_cast<unsigned>(items < num_sms ? items : static_cast<long long>(num_sms));
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params, static_cast<int>(items), pos_major);
  return cudaGetLastError();
}

}  // namespace attnserve
#endif  // __CUDACC__

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_LAUNCH_CUH_
