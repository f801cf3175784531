// flash_fwd_sm90 score masking: one key tile's block mask kind and the ragged key end, applied
// to a warpgroup's (64, kBlock) S accumulator in registers.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MASK_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MASK_CUH_

#include <cstdint>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {
namespace flash_sm90 {

#if ATTNSERVE_FLASH_SM90_DEVICE

// Sets every inadmissible score of the tile to -inf. S register 4 i + j of a thread holds
// (row my_row0 + 8 (j / 2), key k0 + 8 i + 2 t + j % 2) (the wgmma m64nN f32 accumulator layout:
// 8-key column groups i, quad lane t); rows and keys are local, `delta` = q_pos_offset -
// k_pos_offset turns them into global positions, which the causal and TokenRule masks compare.
// mask: 0 full (only the key end applies), 1 causal diagonal, 2 partial (TokenRule). Both tests
// below are warpgroup-uniform, so a full, non-ragged tile costs one branch.
template <int kBlock>
__device__ __forceinline__ void ApplyMask(float (&s)[kBlock / 2], const FlashFwdParams& p, int mask,
                                          int64_t k0, int64_t nk, int64_t my_row0, int64_t delta,
                                          int t) {
  const bool ragged = k0 + kBlock > nk;
  if (mask == 0 && !ragged) return;
#pragma unroll
  for (int i = 0; i < kBlock / 8; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t key = k0 + i * 8 + 2 * t + (j & 1);
      const int64_t qr = my_row0 + 8 * (j >> 1) + delta;  // key-row coordinates
      bool ok = key < nk;
      if (mask == 1) {
        ok = ok && key <= qr;
      } else if (mask == 2) {
        if (p.rule_causal) ok = ok && key <= qr;
        if (p.rule_window >= 0) {
          const int64_t d = qr - key;
          // Both bounds evaluated (bitwise &): a branch-free window test.
          const bool in_window = (d <= p.rule_window) & (-d <= p.rule_window);
          ok = ok && in_window;
        }
      }
      if (!ok) s[4 * i + j] = -INFINITY;
    }
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MASK_CUH_
