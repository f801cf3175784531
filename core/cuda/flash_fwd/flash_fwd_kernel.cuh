// flash_fwd: block-sparse FlashAttention-2 forward (mma.sync m16n8k16, ldmatrix, cp.async).
//
// One CTA = one query block row of the block layout (kBlockM query rows) for one (batch*segment,
// head). It walks the row's kept key blocks (CSR col_idx, or the implicit dense row) in 64-key
// tiles through a kStages-deep cp.async pipeline, applies the block's mask kind (kFull: nothing
// unless the tile is ragged, kCausalDiagonal: key <= query, kPartial: TokenRule), and keeps an
// online softmax in f32 with exp2 and a log2(e)-prescaled scale. Writes O in the input dtype and
// LSE (natural log) in f32; rows with no admissible key get O = 0 and LSE = -inf. In accumulate
// mode (dilated branches, ring steps) it LSE-merges into an f32 O and the LSE instead of storing.
// Queries and keys may be different shards (seqlen_k, q/k_pos_offset): masks compare global
// positions.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd/flash_fwd_traits.h"

namespace attnserve {
namespace flash_fwd {

// ---- PTX wrappers --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 zero-fills the destination (out-of-range rows).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                           uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// 2^x on the SFU (MUFU.EX2), flushing denormals: ex2(-inf) = +0, which the masked scores rely on.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename Elem>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  // D(16x8 f32) += A(16x16 bf16, row) * B(16x8 bf16, col)
  __device__ __forceinline__ static void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// Element offset of (row, 8-element chunk) in a swizzled (rows, kHeadDim) tile.
template <int kChunksPerRow>
__device__ __forceinline__ int SwizzledOffset(int row, int chunk) {
  return row * (kChunksPerRow * 8) + ((chunk ^ (row & 7)) * 8);
}

// The kept key block list of one query block row: CSR entries or the implicit dense row.
struct RowBlocks {
  int64_t begin;  // first CSR entry (or 0 for implicit dense)
  int64_t count;  // entries
};

__device__ __forceinline__ void BlockOfEntry(const FlashFwdParams& p, int64_t row, int64_t e,
                                             int64_t& col, int& mask) {
  if (p.col_idx != nullptr) {
    col = p.col_idx[e];
    mask = p.block_mask[e];
  } else {
    col = e;
    mask = (p.dense_causal && col == row) ? 1 : 0;
  }
}

// Loads `rows` rows (starting at token row0, up to `limit`) of a (kRows, kHeadDim) tile into
// swizzled shared memory; rows at or beyond limit are zero-filled.
template <typename Traits, int kRows>
__device__ __forceinline__ void LoadTile(uint32_t smem_base, const typename Traits::Elem* gbase,
                                         int64_t row_stride, int64_t row0, int64_t limit) {
  constexpr int kChunks = Traits::kChunksPerRow;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % Traits::kNThreads == 0, "tile chunks divide the CTA");
#pragma unroll
  for (int i = 0; i < kTotal / Traits::kNThreads; ++i) {
    const int idx = i * Traits::kNThreads + threadIdx.x;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int64_t token = row0 + r;
    const bool in = token < limit;
    const typename Traits::Elem* src = gbase + (in ? token : 0) * row_stride + c * 8;
    CpAsync16(smem_base + SwizzledOffset<kChunks>(r, c) * 2, src, in ? 16 : 0);
  }
}

// Per-warp tile shapes of the kernel below. Warp w owns query rows [w kRowsPerWarp, + kRowsPerWarp)
// of the CTA's tile as kMFrags MMA row fragments of 16; in fragment f a thread holds rows
// f * 16 + g and f * 16 + g + 8 (g = lane / 4), columns 2 t, 2 t + 1 of every 8-column n-tile
// (t = lane % 4): the mma.sync m16n8k16 C-fragment layout.
template <typename Traits>
struct WarpTile {
  static constexpr int kMFrags = Traits::kMFrags;
  static constexpr int kNTilesS = Traits::kSubN / 8;      // n-tiles of a score sub-tile
  static constexpr int kKStepsD = Traits::kHeadDim / 16;  // k-steps over the head dim
  static constexpr int kNTilesO = Traits::kHeadDim / 8;   // n-tiles of the output tile
  using Scores = float[kMFrags][kNTilesS][4];             // (kRowsPerWarp, kSubN)
  using Out = float[kMFrags][kNTilesO][4];                // (kRowsPerWarp, kHeadDim)
  // Q A fragments (kRowsPerWarp, kHeadDim) when Q stays in registers, else a 1-element dummy.
  using QFrags = uint32_t[Traits::kQInRegs ? kMFrags : 1][Traits::kQInRegs ? kKStepsD : 1][4];
};

// ldmatrix row address of the Q A fragment (f, kk) of warp `warp`: 16 rows x 16 columns of the
// (kBlockM, kHeadDim) Q tile.
template <typename Traits>
__device__ __forceinline__ uint32_t QFragAddr(uint32_t smem_q_addr, int warp, int lane, int f,
                                              int kk) {
  const int r = warp * Traits::kRowsPerWarp + f * 16 + (lane % 16);
  const int c = kk * 2 + lane / 16;
  return smem_q_addr + SwizzledOffset<Traits::kChunksPerRow>(r, c) * 2;
}

// Zero O, running max -inf, denominators 0.
template <typename Traits>
__device__ __forceinline__ void ResetState(typename WarpTile<Traits>::Out& acc_o,
                                           float (&row_max)[Traits::kMFrags][2],
                                           float (&row_sum)[Traits::kMFrags][2]) {
#pragma unroll
  for (int f = 0; f < Traits::kMFrags; ++f) {
#pragma unroll
    for (int i = 0; i < WarpTile<Traits>::kNTilesO; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc_o[f][i][j] = 0.f;
    }
  }
#pragma unroll
  for (int f = 0; f < Traits::kMFrags; ++f) {
    row_max[f][0] = row_max[f][1] = -INFINITY;
    row_sum[f][0] = row_sum[f][1] = 0.f;
  }
}

// The warp's Q A fragments (kRowsPerWarp, kHeadDim) from the Q tile into registers (kQInRegs).
template <typename Traits>
__device__ __forceinline__ void LoadQFrags(typename WarpTile<Traits>::QFrags& q_frag,
                                           uint32_t smem_q_addr, int warp, int lane) {
#pragma unroll
  for (int f = 0; f < Traits::kMFrags; ++f) {
#pragma unroll
    for (int kk = 0; kk < WarpTile<Traits>::kKStepsD; ++kk) {
      LdMatrixX4(QFragAddr<Traits>(smem_q_addr, warp, lane, f, kk), q_frag[f][kk][0],
                 q_frag[f][kk][1], q_frag[f][kk][2], q_frag[f][kk][3]);
    }
  }
}

// S = Q K^T of a score sub-tile: (kRowsPerWarp, kSubN) per warp, K rows [srow0, srow0 + kSubN)
// of the stage's K tile. Each K fragment feeds every row fragment.
template <typename Traits>
__device__ __forceinline__ void ComputeScores(typename WarpTile<Traits>::Scores& s,
                                              const typename WarpTile<Traits>::QFrags& q_frag,
                                              uint32_t smem_q_addr, uint32_t k_addr, int srow0,
                                              int warp, int lane) {
  using Elem = typename Traits::Elem;
  using W = WarpTile<Traits>;
#pragma unroll
  for (int f = 0; f < W::kMFrags; ++f) {
#pragma unroll
    for (int i = 0; i < W::kNTilesS; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[f][i][j] = 0.f;
    }
  }
#pragma unroll
  for (int kk = 0; kk < W::kKStepsD; ++kk) {
    uint32_t qa[W::kMFrags][4];
#pragma unroll
    for (int f = 0; f < W::kMFrags; ++f) {
      if constexpr (Traits::kQInRegs) {
#pragma unroll
        for (int j = 0; j < 4; ++j) qa[f][j] = q_frag[f][kk][j];
      } else {
        LdMatrixX4(QFragAddr<Traits>(smem_q_addr, warp, lane, f, kk), qa[f][0], qa[f][1], qa[f][2],
                   qa[f][3]);
      }
    }
#pragma unroll
    for (int np = 0; np < W::kNTilesS / 2; ++np) {
      const int m = lane / 8;
      const int r = srow0 + np * 16 + (m / 2) * 8 + lane % 8;
      const int c = kk * 2 + (m % 2);
      uint32_t b0, b1, b2, b3;
      LdMatrixX4(k_addr + SwizzledOffset<Traits::kChunksPerRow>(r, c) * 2, b0, b1, b2, b3);
#pragma unroll
      for (int f = 0; f < W::kMFrags; ++f) {
        Mma<Elem>::Run(s[f][2 * np], qa[f], b0, b1);
        Mma<Elem>::Run(s[f][2 * np + 1], qa[f], b2, b3);
      }
    }
  }
}

// Masking of a sub-tile starting at key ks: mask kind per tile (CTA-uniform: 0 full, 1 causal
// diagonal, 2 partial = TokenRule), plus bounds for a ragged last tile. Rows and keys are local;
// delta = q_pos_offset - k_pos_offset turns them into the global positions the masks compare.
template <typename Traits>
__device__ __forceinline__ void ApplyMask(typename WarpTile<Traits>::Scores& s,
                                          const FlashFwdParams& p, int mask, int64_t ks, int64_t nk,
                                          int64_t warp_row0, int64_t delta, int g, int t) {
  using W = WarpTile<Traits>;
  const bool ragged = ks + Traits::kSubN > nk;
  if (mask != 0 || ragged) {
#pragma unroll
    for (int f = 0; f < W::kMFrags; ++f) {
#pragma unroll
      for (int i = 0; i < W::kNTilesS; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t key = ks + i * 8 + 2 * t + (j & 1);
          const int64_t qr = warp_row0 + f * 16 + g + (j >> 1) * 8 + delta;  // key-row coords
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
          if (!ok) s[f][i][j] = -INFINITY;
        }
      }
    }
  }
}

// Online softmax step in the exp2 domain: raises the running max of each row by the sub-tile's,
// rescales the denominators and O by exp2(old - new), and turns the scores into unnormalised
// probabilities in place (scale_log2 = softmax scale * log2(e)).
template <typename Traits>
__device__ __forceinline__ void SoftmaxStep(typename WarpTile<Traits>::Scores& s,
                                            typename WarpTile<Traits>::Out& acc_o,
                                            float (&row_max)[Traits::kMFrags][2],
                                            float (&row_sum)[Traits::kMFrags][2],
                                            float scale_log2) {
  using W = WarpTile<Traits>;
#pragma unroll
  for (int f = 0; f < W::kMFrags; ++f) {
    float scaled_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[f][h];
#pragma unroll
      for (int i = 0; i < W::kNTilesS; ++i) {
        mx = fmaxf(mx, fmaxf(s[f][i][2 * h], s[f][i][2 * h + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with every key masked so far keeps max -inf: use 0 as the offset so that
      // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
      scaled_max[h] = mx == -INFINITY ? 0.f : mx * scale_log2;
      const float alpha = Exp2(row_max[f][h] * scale_log2 - scaled_max[h]);
      row_max[f][h] = mx;
      row_sum[f][h] *= alpha;
#pragma unroll
      for (int i = 0; i < W::kNTilesO; ++i) {
        acc_o[f][i][2 * h] *= alpha;
        acc_o[f][i][2 * h + 1] *= alpha;
      }
    }
#pragma unroll
    for (int i = 0; i < W::kNTilesS; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[f][i][j] = Exp2(fmaf(s[f][i][j], scale_log2, -scaled_max[j >> 1]));
        row_sum[f][j >> 1] += s[f][i][j];
      }
    }
  }
}

// O += P V for a sub-tile: P re-packed from C fragments into A fragments, V rows [srow0, srow0 +
// kSubN) of the stage's V tile through ldmatrix.trans; each V fragment feeds every row fragment.
template <typename Traits>
__device__ __forceinline__ void AccumulatePV(typename WarpTile<Traits>::Out& acc_o,
                                             const typename WarpTile<Traits>::Scores& s,
                                             uint32_t v_addr, int srow0, int lane) {
  using Elem = typename Traits::Elem;
  using W = WarpTile<Traits>;
#pragma unroll
  for (int kk = 0; kk < Traits::kSubN / 16; ++kk) {
    uint32_t a[W::kMFrags][4];
#pragma unroll
    for (int f = 0; f < W::kMFrags; ++f) {
      a[f][0] = Mma<Elem>::Pack(s[f][2 * kk][0], s[f][2 * kk][1]);
      a[f][1] = Mma<Elem>::Pack(s[f][2 * kk][2], s[f][2 * kk][3]);
      a[f][2] = Mma<Elem>::Pack(s[f][2 * kk + 1][0], s[f][2 * kk + 1][1]);
      a[f][3] = Mma<Elem>::Pack(s[f][2 * kk + 1][2], s[f][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < W::kNTilesO / 2; ++dp) {
      const int m = lane / 8;
      const int r = srow0 + kk * 16 + (m % 2) * 8 + lane % 8;
      const int c = dp * 2 + (m / 2);
      uint32_t b0, b1, b2, b3;
      LdMatrixX4Trans(v_addr + SwizzledOffset<Traits::kChunksPerRow>(r, c) * 2, b0, b1, b2, b3);
#pragma unroll
      for (int f = 0; f < W::kMFrags; ++f) {
        Mma<Elem>::Run(acc_o[f][2 * dp], a[f], b0, b1);
        Mma<Elem>::Run(acc_o[f][2 * dp + 1], a[f], b2, b3);
      }
    }
  }
}

// Epilogue: finish the denominators over the quad, normalise, write (or merge) O and LSE of the
// warp's rows. Rows past the query end are skipped; a row with no admissible key gets O = 0 and
// LSE = -inf (accumulate mode: the accumulator is left untouched). Accumulate: LSE_out =
// log(e^LSE_acc + e^LSE), O_acc = w_acc O_acc + w_new O with weights exp(LSE_* - LSE_out); O_acc
// is not read when w_acc is 0 (nothing accumulated yet).
template <typename Traits>
__device__ __forceinline__ void StoreOutput(const FlashFwdParams& p,
                                            const typename WarpTile<Traits>::Out& acc_o,
                                            const float (&row_max)[Traits::kMFrags][2],
                                            const float (&row_sum)[Traits::kMFrags][2],
                                            typename Traits::Elem* o_base, float* lse_base,
                                            int64_t warp_row0, int g, int t) {
  using Elem = typename Traits::Elem;
  using W = WarpTile<Traits>;
  const int64_t n = p.seqlen;
  float row_l[W::kMFrags][2];
  float lse_prev[W::kMFrags][2];  // accumulate mode: the accumulator's LSE, read before any write
#pragma unroll
  for (int f = 0; f < W::kMFrags; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[f][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      row_l[f][h] = l;
      const int64_t r = warp_row0 + f * 16 + g + h * 8;
      lse_prev[f][h] = (p.accumulate && r < n) ? lse_base[r * p.lse_row_stride] : -INFINITY;
    }
  }
  __syncwarp();  // the quad's t == 0 lane rewrites the LSE the other three lanes just read
#pragma unroll
  for (int f = 0; f < W::kMFrags; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = row_l[f][h];
      const bool empty = !(l > 0.f);  // also catches NaN
      const float inv = empty ? 0.f : 1.f / l;
      const int64_t r = warp_row0 + f * 16 + g + h * 8;
      if (r >= n) continue;
      const float lse_new = empty ? -INFINITY : row_max[f][h] * p.scale + logf(l);
      if (!p.accumulate) {
        Elem* orow = o_base + r * p.o_row_stride;
#pragma unroll
        for (int i = 0; i < W::kNTilesO; ++i) {
          const uint32_t packed =
              Mma<Elem>::Pack(acc_o[f][i][2 * h] * inv, acc_o[f][i][2 * h + 1] * inv);
          *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) = packed;
        }
        if (t == 0) lse_base[r * p.lse_row_stride] = lse_new;
      } else if (!empty) {
        const float l_acc = lse_prev[f][h];
        const float l_max = fmaxf(l_acc, lse_new);
        const float l_out = l_max + log1pf(__expf(fminf(l_acc, lse_new) - l_max));
        const float w_acc = l_acc == -INFINITY ? 0.f : __expf(l_acc - l_out);
        const float w_new = __expf(lse_new - l_out) * inv;
        float* orow =
            reinterpret_cast<float*>(p.o) + (o_base - static_cast<Elem*>(p.o)) + r * p.o_row_stride;
#pragma unroll
        for (int i = 0; i < W::kNTilesO; ++i) {
          float2* dst = reinterpret_cast<float2*>(orow + i * 8 + 2 * t);
          float2 cur = w_acc == 0.f ? make_float2(0.f, 0.f) : *dst;
          cur.x = fmaf(w_acc, cur.x, w_new * acc_o[f][i][2 * h]);
          cur.y = fmaf(w_acc, cur.y, w_new * acc_o[f][i][2 * h + 1]);
          *dst = cur;
        }
        if (t == 0) lse_base[r * p.lse_row_stride] = l_out;
      }
    }
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    FlashFwdKernel(const FlashFwdParams p) {
  using Elem = typename Traits::Elem;
  using W = WarpTile<Traits>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kSubTiles = kBlockM / kBlockN;  // 64-key tiles per layout block (1 or 2)
  constexpr int kSubN = Traits::kSubN;          // keys per score sub-tile
  constexpr int kMFrags = Traits::kMFrags;
  constexpr int kRowsPerWarp = Traits::kRowsPerWarp;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* smem_q = reinterpret_cast<Elem*>(smem_raw);  // (kBlockM, kHeadDim)
  Elem* smem_kv = smem_q + Traits::kQTileElems;      // kStages x [K (kBlockN, kHeadDim),
                                                     //            V (kBlockN, kHeadDim)]
  const uint32_t smem_q_addr = SmemAddr(smem_q);
  const uint32_t smem_kv_addr = SmemAddr(smem_kv);
  constexpr uint32_t kStageBytes = 2u * Traits::kKVTileElems * sizeof(Elem);
  constexpr uint32_t kVOffsetBytes = Traits::kKVTileElems * sizeof(Elem);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;  // row within the 8-row half of the MMA tile
  const int t = lane % 4;  // column pair within an n-tile

  const int64_t row =
      p.row_order != nullptr ? static_cast<int64_t>(p.row_order[blockIdx.x]) : blockIdx.x;
  const int head = p.head_start + static_cast<int>(blockIdx.y) * p.head_step;
  const int kv_head = head / p.kv_group;
  const int batch = static_cast<int>(blockIdx.z) / p.num_segs;
  const int seg = static_cast<int>(blockIdx.z) % p.num_segs;

  const Elem* q_base = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride +
                       seg * p.q_seg_stride + head * p.q_head_stride;
  const Elem* k_base = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride +
                       seg * p.k_seg_stride + kv_head * p.k_head_stride;
  const Elem* v_base = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride +
                       seg * p.v_seg_stride + kv_head * p.v_head_stride;
  Elem* o_base = static_cast<Elem*>(p.o) + batch * p.o_batch_stride + seg * p.o_seg_stride +
                 head * p.o_head_stride;
  float* lse_base =
      p.lse + batch * p.lse_batch_stride + seg * p.lse_seg_stride + head * p.lse_head_stride;

  const int64_t q0 = row * kBlockM;
  const int64_t n = p.seqlen;                                  // query rows
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;  // key rows
  // Global query position minus global key position = local query row - local key row + delta.
  const int64_t delta = p.q_pos_offset - p.k_pos_offset;

  // Kept key blocks of this row.
  RowBlocks blocks;
  if (p.col_idx != nullptr) {
    blocks.begin = p.row_ptr[row];
    blocks.count = p.row_ptr[row + 1] - blocks.begin;
  } else {
    blocks.begin = 0;
    blocks.count = p.dense_causal ? min(row + 1, p.num_k_blocks) : p.num_k_blocks;
  }
  // Key tiles: kSubTiles per block, except that sub-tiles starting at or past n are dropped (only
  // the last, ragged block can have them; it is the last entry of a row since columns ascend).
  const int64_t num_tiles = blocks.count * kSubTiles;

  auto tile_key_start = [&](int64_t tile, int& mask) -> int64_t {
    const int64_t e = tile / kSubTiles;
    int64_t col;
    BlockOfEntry(p, row, blocks.begin + e, col, mask);
    return col * kBlockM + (tile % kSubTiles) * kBlockN;
  };

  auto load_kv = [&](int64_t tile, int stage) {
    int mask;
    const int64_t k0 = tile_key_start(tile, mask);
    const uint32_t base = smem_kv_addr + stage * kStageBytes;
    LoadTile<Traits, kBlockN>(base, k_base, p.k_row_stride, k0, nk);
    LoadTile<Traits, kBlockN>(base + kVOffsetBytes, v_base, p.v_row_stride, k0, nk);
  };

  // Prologue: Q plus the first kStages - 1 key tiles, one commit group each (Q rides with tile 0).
  LoadTile<Traits, kBlockM>(smem_q_addr, q_base, p.q_row_stride, q0, n);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_kv(s, s);
    CpAsyncCommit();
  }

  // Per-thread state (WarpTile: the warp's rows as kMFrags MMA row fragments of 16).
  typename W::Out acc_o;      // (kRowsPerWarp, kHeadDim) per warp, C-fragment layout
  float row_max[kMFrags][2];  // running max of raw (unscaled) scores
  float row_sum[kMFrags][2];  // this thread's share of the softmax denominator
  ResetState<Traits>(acc_o, row_max, row_sum);
  typename W::QFrags q_frag;  // loaded at the first tile when Q stays in registers

  const int64_t warp_row0 = q0 + warp * kRowsPerWarp;

  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile `tile` is visible to all; everyone is done with tile - 1's stage

    {
      const int64_t next = tile + kStages - 1;
      if (next < num_tiles) load_kv(next, static_cast<int>(next % kStages));
      CpAsyncCommit();
    }

    if constexpr (Traits::kQInRegs) {
      if (tile == 0) LoadQFrags<Traits>(q_frag, smem_q_addr, warp, lane);
    }

    int mask;
    const int64_t k0 = tile_key_start(tile, mask);
    // Tiles wholly past the key end (second half of a short last block): nothing to do.
    if (k0 >= nk) continue;
    // Causal diagonal: a warp whose last row precedes the tile's first key sees only masked keys.
    if (mask == 1 && k0 > warp_row0 + kRowsPerWarp - 1 + delta) continue;
    if (warp_row0 >= n) continue;  // rows past the end (ragged last query block)

    const int stage = static_cast<int>(tile % kStages);
    const uint32_t k_addr = smem_kv_addr + stage * kStageBytes;
    const uint32_t v_addr = k_addr + kVOffsetBytes;

    // The 64-key tile is processed in score sub-tiles of kSubN keys (traits: register budget).
#pragma unroll
    for (int sub = 0; sub < kBlockN / kSubN; ++sub) {
      const int64_t ks = k0 + sub * kSubN;  // first key of the sub-tile
      if (ks >= nk) break;
      if (mask == 1 && ks > warp_row0 + kRowsPerWarp - 1 + delta) break;
      const int srow0 = sub * kSubN;  // its first row in the shared K/V tile

      typename W::Scores s;  // (kRowsPerWarp, kSubN) per warp
      ComputeScores<Traits>(s, q_frag, smem_q_addr, k_addr, srow0, warp, lane);
      ApplyMask<Traits>(s, p, mask, ks, nk, warp_row0, delta, g, t);
      SoftmaxStep<Traits>(s, acc_o, row_max, row_sum, p.scale_log2);
      AccumulatePV<Traits>(acc_o, s, v_addr, srow0, lane);
    }
  }
  CpAsyncWait<0>();

  StoreOutput<Traits>(p, acc_o, row_max, row_sum, o_base, lse_base, warp_row0, g, t);
}

}  // namespace flash_fwd
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_KERNEL_CUH_
