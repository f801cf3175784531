// The head dims the flash_fwd family is instantiated for (one .cu per head dim and dtype, in
// flash_fwd/ and flash_fwd_sm90/): the CUDA backend's head-dim table. CudaSupportsHeadDim
// (cuda_attention.h) is how everything above the kernels asks it.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_HEAD_DIMS_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_HEAD_DIMS_H_

#include <cstdint>

namespace attnserve {

inline constexpr int kFlashFwdHeadDims[] = {64, 128};

constexpr bool FlashFwdHasHeadDim(int64_t head_dim) {
  for (int d : kFlashFwdHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_HEAD_DIMS_H_
