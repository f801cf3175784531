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
// mask: 0 full (only the key end applies), 1 causal diagonal, 2 partial (TokenRule). The caller
// skips the call for a full, non-ragged tile (mask 0 and k0 + kBlock <= nk), a test it makes in
// key-block numbers once per tile.
// Every rule admits an interval of keys per row, so the thread turns it into an interval
// [lo, hi] of its column offset c = 8 i + j % 2 (key = k0 + 2 t + c) once per row, in 32 bits
// clamped to [-1, kBlock]; each score then costs a compare with a compile-time c and a select,
// not 64-bit position arithmetic:
//   key < nk                  <=> c <= nk - (k0 + 2 t) - 1
//   key <= qr (causal)        <=> c <= qr - (k0 + 2 t)
//   |qr - key| <= window      <=> qr - (k0 + 2 t) - window <= c <= qr - (k0 + 2 t) + window
template <int kBlock>
__device__ __forceinline__ void ApplyMask(float (&s)[kBlock / 2], const FlashFwdParams& p, int mask,
                                          int64_t k0, int64_t nk, int64_t my_row0, int64_t delta,
                                          int t) {
  const int64_t base = k0 + 2 * t;  // the key of column offset 0
  auto clamp = [](int64_t v) {
    return static_cast<int>(v < -1 ? int64_t{-1} : (v > kBlock ? int64_t{kBlock} : v));
  };
  const int end = clamp(nk - base - 1);  // last admissible column offset for the key end
  const bool causal = mask == 1 || (mask == 2 && p.rule_causal);
  const bool window = mask == 2 && p.rule_window >= 0;
  int lo[2], hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t rel = my_row0 + 8 * h + delta - base;  // qr - key of column offset 0
    lo[h] = 0;
    hi[h] = end;
    if (causal) hi[h] = min(hi[h], clamp(rel));
    if (window) {
      hi[h] = min(hi[h], clamp(rel + p.rule_window));
      lo[h] = clamp(rel - p.rule_window);
    }
  }
  if (!window) {  // warpgroup-uniform: the lower bound is column 0
#pragma unroll
    for (int i = 0; i < kBlock / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (8 * i + (j & 1) > hi[j >> 1]) s[4 * i + j] = -INFINITY;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kBlock / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = 8 * i + (j & 1);
        if (c < lo[j >> 1] || c > hi[j >> 1]) s[4 * i + j] = -INFINITY;
      }
    }
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MASK_CUH_
