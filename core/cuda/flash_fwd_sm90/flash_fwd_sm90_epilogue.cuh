// flash_fwd_sm90 epilogue: a consumer warpgroup's O rows and their LSE, stored (input dtype O,
// natural-log LSE) or LSE-merged into an f32 accumulator (accumulate mode), straight from the
// registers.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_EPILOGUE_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_EPILOGUE_CUH_

#include <cstdint>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_softmax.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {
namespace flash_sm90 {

#if ATTNSERVE_FLASH_SM90_DEVICE

// Where O and LSE of (y, z) start (tile scheduler's naming: head index y, z = batch * num_segs +
// seg): O element offset (O is Elem, or f32 when accumulating, with the same element strides)
// and the LSE base pointer.
struct OutputBase {
  int64_t o_offset;
  float* lse;
};
__device__ __forceinline__ OutputBase MakeOutputBase(const FlashFwdParams& p, int y, int z) {
  const int head = p.head_start + y * p.head_step;
  const auto [batch, seg] = SplitZ(z, p.num_segs);
  return {batch * p.o_batch_stride + seg * p.o_seg_stride + head * p.o_head_stride,
          p.lse + batch * p.lse_batch_stride + seg * p.lse_seg_stride + head * p.lse_head_stride};
}

// A quad's 4 x 4 transpose of 32-bit words (lanes 4 g + t, t = lane % 4): lane t's x[j] becomes
// lane j's x[t], in two butterfly steps (lanes t ^ 2, then t ^ 1) of two shuffles each. Every lane
// of the warp takes part.
__device__ __forceinline__ void QuadTranspose(uint32_t (&x)[4], int t) {
  const bool hi2 = (t & 2) != 0;
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi2 ? x[0] : x[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi2 ? x[1] : x[3], 2);
  x[0] = hi2 ? r0 : x[0];
  x[1] = hi2 ? r1 : x[1];
  x[2] = hi2 ? x[2] : r0;
  x[3] = hi2 ? x[3] : r1;
  const bool hi1 = (t & 1) != 0;
  r0 = __shfl_xor_sync(0xffffffffu, hi1 ? x[0] : x[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, hi1 ? x[2] : x[3], 1);
  x[0] = hi1 ? r0 : x[0];
  x[1] = hi1 ? x[1] : r0;
  x[2] = hi1 ? r1 : x[2];
  x[3] = hi1 ? x[3] : r1;
}

// O in 16-byte stores where every row of O starts 16-byte aligned (OutputVectorOk): a warp's
// 4-byte stores write 16 bytes of each of 8 rows (32 of them per thread and item at D = 128),
// and the LSU queue they fill held the epilogue's register reuse (long-scoreboard stalls on the
// registers the stores still read: ~5% of the warp samples at 99% of block pairs skipped).
template <typename Elem>
__device__ __forceinline__ bool OutputVectorOk(const FlashFwdParams& p) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p.o) |
                        static_cast<uint64_t>((p.o_row_stride | p.o_head_stride |
                                               p.o_batch_stride | p.o_seg_stride) *
                                              static_cast<int64_t>(sizeof(Elem)));
  return (bits & 15) == 0;
}

// 1 / l and log(l) by one MUFU each (approximate, ~1 ulp; l >= 1 for a row with a key, its
// largest term being exp2(0)) rather than IEEE 1 / l and logf, ~40 instructions per row behind
// branches that kept ptxas from overlapping the two rows. H200, seven interleaved reps
// (bench/results/h200-2026-11-29-kernel17): 99% of block pairs skipped 1.5-1.6% faster in every
// rep (random and local_window), 90% and D = 64 level. At 176-key tiles (D = 128 dense and
// causal, where the epilogue is <1% of the time) ptxas reordered the loop around the shorter
// epilogue and dense ran 0.3% slower over 200 back-to-back calls: they keep the IEEE forms.
constexpr bool FastEpilogueMath(int key_tile) { return key_tile == 128; }

// Finishes the denominators over each quad and writes the thread's two rows (my_row0 + 8 h) of
// O (64, kHeadDim) and their LSE: with vector_ok (OutputVectorOk) in 16-byte stores, otherwise
// (rows not 16-byte aligned, or accumulate mode) a word or a float2 at a time. Rows past the
// query end are skipped; a row with no admissible key (denominator 0, or NaN) gets O = 0 and
// LSE = -inf, and in accumulate mode leaves the accumulator untouched. Accumulate: LSE_out =
// log(e^LSE_acc + e^LSE), O_acc = w_acc O_acc + w_new O with the weights exp(LSE_* - LSE_out);
// O_acc is not read when w_acc is 0 (LSE_acc = -inf: nothing accumulated yet, its contents may
// be garbage).
template <typename Elem, int kBlock, int kHeadDim>
__device__ __forceinline__ void StoreOutput(const FlashFwdParams& p,
                                            const float (&acc_o)[kHeadDim / 2],
                                            const OnlineSoftmax<kBlock, kHeadDim>& softmax,
                                            const OutputBase& out, int64_t my_row0, int t,
                                            bool vector_ok) {
  const int64_t n = p.seqlen;
  float row_l[2];
  float lse_prev[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = softmax.row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    row_l[h] = l;
    const int64_t r = my_row0 + 8 * h;
    lse_prev[h] = (p.accumulate && r < n) ? out.lse[r * p.lse_row_stride] : -INFINITY;
  }
  __syncwarp();  // the quad's t == 0 lane rewrites the LSE the other three lanes just read
  // Row h's 1 / l (0 for a row with no admissible key: empty) and its natural-log LSE.
  constexpr bool kFast = FastEpilogueMath(kBlock);
  auto row_inv = [&](int h, bool& empty) {
    empty = !(row_l[h] > 0.f);
    return empty ? 0.f : (kFast ? __fdividef(1.f, row_l[h]) : 1.f / row_l[h]);
  };
  auto row_lse = [&](int h, bool empty) {
    return empty ? -INFINITY
                 : softmax.row_max[h] * p.scale + (kFast ? __logf(row_l[h]) : logf(row_l[h]));
  };
  if (!p.accumulate && vector_ok) {
    // Each quad transposes its row's 16 words in groups of four, so that lane t holds the 8
    // columns [8 (4 k + t), 8 (4 k + t) + 8) of group k: four 16-byte stores per row. The
    // shuffles run on every lane (rows past the query end only skip the stores).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bool empty;
      const float inv = row_inv(h, empty);
      const int64_t r = my_row0 + 8 * h;
      Elem* orow = static_cast<Elem*>(p.o) + out.o_offset + r * p.o_row_stride;
#pragma unroll
      for (int k = 0; k < kHeadDim / 32; ++k) {
        uint32_t x[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int i = 4 * k + j;
          x[j] = Pack<Elem>(acc_o[4 * i + 2 * h] * inv, acc_o[4 * i + 2 * h + 1] * inv);
        }
        QuadTranspose(x, t);
        if (r < n) {
          // Streaming (st.global.cs, evict-first): O is not read again by this kernel, and
          // leaves L2 to the K/V tiles that the head group's items read again.
          __stcs(reinterpret_cast<uint4*>(orow + 8 * (4 * k + t)),
                 make_uint4(x[0], x[1], x[2], x[3]));
        }
      }
      if (t == 0 && r < n) out.lse[r * p.lse_row_stride] = row_lse(h, empty);
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    bool empty;
    const float inv = row_inv(h, empty);
    const int64_t r = my_row0 + 8 * h;
    if (r >= n) continue;
    const float lse_new = row_lse(h, empty);
    if (!p.accumulate) {
      Elem* orow = static_cast<Elem*>(p.o) + out.o_offset + r * p.o_row_stride;
#pragma unroll
      for (int i = 0; i < kHeadDim / 8; ++i) {
        __stcs(reinterpret_cast<unsigned int*>(orow + i * 8 + 2 * t),
               Pack<Elem>(acc_o[4 * i + 2 * h] * inv, acc_o[4 * i + 2 * h + 1] * inv));
      }
      if (t == 0) out.lse[r * p.lse_row_stride] = lse_new;
    } else if (!empty) {
      const float l_acc = lse_prev[h];
      const float l_max = fmaxf(l_acc, lse_new);
      const float l_out = l_max + log1pf(__expf(fminf(l_acc, lse_new) - l_max));
      const float w_acc = l_acc == -INFINITY ? 0.f : __expf(l_acc - l_out);
      const float w_new = __expf(lse_new - l_out) * inv;
      float* orow = static_cast<float*>(p.o) + out.o_offset + r * p.o_row_stride;
#pragma unroll
      for (int i = 0; i < kHeadDim / 8; ++i) {
        float2* dst = reinterpret_cast<float2*>(orow + i * 8 + 2 * t);
        float2 cur = w_acc == 0.f ? make_float2(0.f, 0.f) : *dst;
        cur.x = fmaf(w_acc, cur.x, w_new * acc_o[4 * i + 2 * h]);
        cur.y = fmaf(w_acc, cur.y, w_new * acc_o[4 * i + 2 * h + 1]);
        *dst = cur;
      }
      if (t == 0) out.lse[r * p.lse_row_stride] = l_out;
    }
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_EPILOGUE_CUH_
