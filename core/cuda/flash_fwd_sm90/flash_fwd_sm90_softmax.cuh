// flash_fwd_sm90 online softmax (exp2 domain, f32) over a consumer warpgroup's 64 query rows.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_SOFTMAX_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_SOFTMAX_CUH_

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {
namespace flash_sm90 {

#if ATTNSERVE_FLASH_SM90_DEVICE

// Running statistics of the two rows a thread holds in the wgmma accumulator layout (rows g and
// g + 8 of its warp's 16, index h), kept in registers: a local of the consumer, used through
// forceinline members only, so it is never addressed in memory.
//   kBlock: keys per S tile ((64, kBlock) S = kBlock / 2 registers per thread);
//   kHeadDim: columns of O ((64, kHeadDim) O = kHeadDim / 2 registers per thread).
template <int kBlock, int kHeadDim>
struct OnlineSoftmax {
  static constexpr float kStaleMaxLog2 = 8.f;
  float row_max[2];  // running max of the raw (unscaled) scores (within 2^8 of it, scaled)
  float row_sum[2];  // this thread's share of the denominator (its quad holds the rest)

  __device__ __forceinline__ void Reset() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // One key tile: raises the running max by the tile's, rescales the denominators and O by
  // exp2(old - new), and turns the (masked) scores s into unnormalised probabilities in place.
  // scale_log2 = softmax scale * log2(e), so exp2 of the scaled difference is the natural exp.
  __device__ __forceinline__ void Step(float (&s)[kBlock / 2], float (&acc_o)[kHeadDim / 2],
                                       float scale_log2) {
    float alpha[2];
    StepScores(s, alpha, scale_log2);
    RescaleO(acc_o, alpha);
  }

  // Step without touching O: the running max, the denominators and the probabilities, plus the
  // factor O must still be multiplied by (RescaleO). Split for the consumer that overlaps this
  // tile's softmax with the previous tile's P V GEMM, which is still accumulating into O.
  __device__ __forceinline__ void StepScores(float (&s)[kBlock / 2], float (&alpha)[2],
                                             float scale_log2) {
    float scaled_max[2];
    StepMax(s, alpha, scaled_max, scale_log2);
    StepExp(s, scaled_max, scale_log2);
  }

  // The first half of StepScores: the tile's row maxima joined with the running ones, the
  // factors alpha for O and the denominators (row_sum is rescaled here), and the scaled maxima
  // StepExp subtracts. Reads s, does not change it.
  __device__ __forceinline__ void StepMax(const float (&s)[kBlock / 2], float (&alpha)[2],
                                          float (&scaled_max)[2], float scale_log2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      static_assert(kBlock % 16 == 0, "pairs of 8-key column groups");
      // Four independent chains over the row's kBlock / 4 scores of this thread (a chain of
      // kBlock / 16 dependent maxima instead of kBlock / 8), then joined with the running max.
      float m4[4] = {s[2 * h], s[2 * h + 1], s[4 + 2 * h], s[4 + 2 * h + 1]};
#pragma unroll
      for (int i = 2; i < kBlock / 8; i += 2) {
        m4[0] = fmaxf(m4[0], s[4 * i + 2 * h]);
        m4[1] = fmaxf(m4[1], s[4 * i + 2 * h + 1]);
        m4[2] = fmaxf(m4[2], s[4 * (i + 1) + 2 * h]);
        m4[3] = fmaxf(m4[3], s[4 * (i + 1) + 2 * h + 1]);
      }
      float mx = fmaxf(row_max[h], fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3])));
      // The quad (lanes 4 g .. 4 g + 3) holds the row's kBlock columns.
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A max that grew by at most 2^kStaleMaxLog2 (scaled) is not taken: the row keeps its
      // old max, so alpha is exactly 1 and O needs no rescale (the consumer skips it where the
      // whole warp's alphas are 1); the probabilities of this tile may then reach 2^8, which the
      // f32 accumulators and the bf16/f16 P hold with their usual relative precision, and the
      // epilogue's LSE (max + log sum) uses the same kept max, so the result is unchanged. A
      // first max (row_max = -inf: the difference is +inf) is always taken.
      if ((mx - row_max[h]) * scale_log2 <= kStaleMaxLog2) mx = row_max[h];
      // All keys masked so far: offset 0 so that exp2(-inf) = 0 rather than NaN.
      scaled_max[h] = mx == -INFINITY ? 0.f : mx * scale_log2;
      alpha[h] = Exp2(row_max[h] * scale_log2 - scaled_max[h]);
      row_max[h] = mx;
      row_sum[h] *= alpha[h];
    }
  }

  // s * scale_log2 - scaled_max in place (the exponent StepExp<true> takes).
  __device__ __forceinline__ void StepScale(float (&s)[kBlock / 2], const float (&scaled_max)[2],
                                            float scale_log2) const {
#pragma unroll
    for (int i = 0; i < kBlock / 2; ++i) s[i] = fmaf(s[i], scale_log2, -scaled_max[(i >> 1) & 1]);
  }

  // The second half: the probabilities exp2(s * scale_log2 - scaled_max) in place, added to the
  // denominators. kScaled: StepScale already turned s into the exponents.
  template <bool kScaled = false>
  __device__ __forceinline__ void StepExp(float (&s)[kBlock / 2], const float (&scaled_max)[2],
                                          float scale_log2) {
#pragma unroll
    for (int i = 0; i < kBlock / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[4 * i + j] = kScaled ? Exp2(s[4 * i + j])
                               : Exp2(fmaf(s[4 * i + j], scale_log2, -scaled_max[j >> 1]));
        row_sum[j >> 1] += s[4 * i + j];
      }
    }
  }

  // The kept-max tile (ConsumeItemOverlapped's kept-max tiles): the tile's exponents against the
  // running max as it stands, without the tile's row maxima, and checked afterwards. The check is
  // on this thread's sum of the tile's probabilities per row, which bounds each of them (all
  // >= 0): where it holds, no probability exceeds 2^kStaleMaxLog2 and this is what StepMax would
  // have done too (it keeps a max that grew by at most that much); where the warp sees a larger
  // sum it takes the maxima after all (KeptMaxMissed, which raises the max to the tile's). The
  // running max must be finite (a row with a key so far, or EstimateFirstMax's estimate): the
  // consumer takes StepMax for a tile without that.
  __device__ __forceinline__ void StepScaleKept(float (&s)[kBlock / 2], float scale_log2) const {
    const float scaled_max[2] = {row_max[0] * scale_log2, row_max[1] * scale_log2};
    StepScale(s, scaled_max, scale_log2);
  }

  // An item's first tile as a kept-max tile: the running max (none yet) set to the row maxima of
  // a subset of the tile's scores (the columns of every fourth 8-key group: a quarter of them),
  // which is at most the tile's max, so that only the overflow side can miss and KeptMaxHeld /
  // KeptMaxMissed settle it as for the later tiles. False (row_max left alone: the caller takes
  // StepMax) where a row of the warp gets no finite estimate (-inf or NaN scores).
  __device__ __forceinline__ bool EstimateFirstMax(const float (&s)[kBlock / 2]) {
    static_assert(kBlock % 32 == 0, "every fourth 8-key group");
    float est[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m2[2] = {s[2 * h], s[2 * h + 1]};
#pragma unroll
      for (int i = 4; i < kBlock / 8; i += 4) {
        m2[0] = fmaxf(m2[0], s[4 * i + 2 * h]);
        m2[1] = fmaxf(m2[1], s[4 * i + 2 * h + 1]);
      }
      float mx = fmaxf(m2[0], m2[1]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      est[h] = mx;
    }
    const bool finite =
        __all_sync(0xffffffffu, fabsf(est[0]) < INFINITY && fabsf(est[1]) < INFINITY);
    if (finite) {
      row_max[0] = est[0];
      row_max[1] = est[1];
    }
    return finite;
  }

  // The probabilities exp2(x) of the exponents x (StepScaleKept) into pr, x left as it is, and
  // this thread's sum of them per row into t (a chain per row, as StepExp's).
  __device__ __forceinline__ void StepExpKept(const float (&x)[kBlock / 2], float (&pr)[kBlock / 2],
                                              float (&t)[2]) const {
#pragma unroll
    for (int i = 0; i < kBlock / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        pr[4 * i + j] = Exp2(x[4 * i + j]);
        t[j >> 1] = i == 0 && (j & 1) == 0 ? pr[4 * i + j] : t[j >> 1] + pr[4 * i + j];
      }
    }
  }

  // Whether the kept max holds for the warp's rows (warp-uniform): no row's share of the tile's
  // probabilities above 2^kStaleMaxLog2 in this thread.
  __device__ __forceinline__ static bool KeptMaxHeld(const float (&t)[2]) {
    static_assert(kStaleMaxLog2 == 8.f, "the limit below is 2^kStaleMaxLog2");
    constexpr float limit = 256.f;
    return !__any_sync(0xffffffffu, t[0] > limit || t[1] > limit);
  }

  // A row of the warp went past the kept max: the rows' maxima of the exponents x (the scores
  // less the kept max, scaled), the running max raised where they are positive, alpha for O and
  // the denominators (row_sum rescaled), and pr and t taken again against the raised max.
  __device__ __forceinline__ void KeptMaxMissed(const float (&x)[kBlock / 2],
                                                float (&pr)[kBlock / 2], float (&t)[2],
                                                float (&alpha)[2], float scale_log2) {
    float d[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = x[2 * h];
#pragma unroll
      for (int i = 0; i < kBlock / 8; ++i) {
        mx = fmaxf(mx, fmaxf(x[4 * i + 2 * h], x[4 * i + 2 * h + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float raised = mx > 0.f ? row_max[h] + __fdividef(mx, scale_log2) : row_max[h];
      d[h] = raised * scale_log2 - row_max[h] * scale_log2;
      alpha[h] = Exp2(-d[h]);
      row_max[h] = raised;
      row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < kBlock / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        pr[4 * i + j] = Exp2(x[4 * i + j] - d[j >> 1]);
        t[j >> 1] = i == 0 && (j & 1) == 0 ? pr[4 * i + j] : t[j >> 1] + pr[4 * i + j];
      }
    }
  }

  // RescaleO where a row max of the warp grew (alpha = exp2(0) = 1 exactly otherwise): a warp
  // vote, so the branch is warp-uniform. (Unconditional, interleaved with the exponentials as
  // FA4 does it, it was 2% slower on causal (bench/results/h200x2-2026-11-28-kernel7, ab-ew);
  // after them, with the exponentials first, 1-4% slower on every case (h200-2026-11-28-
  // kernel14/c, v2).)
  __device__ __forceinline__ void RescaleOWhereGrown(float (&acc_o)[kHeadDim / 2],
                                                     const float (&alpha)[2]) const {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) RescaleO(acc_o, alpha);
  }

  // O of the thread's two rows times the factors StepScores returned.
  __device__ __forceinline__ void RescaleO(float (&acc_o)[kHeadDim / 2],
                                           const float (&alpha)[2]) const {
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc_o[4 * i + j] *= alpha[j >> 1];
    }
  }
};

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_SOFTMAX_CUH_
