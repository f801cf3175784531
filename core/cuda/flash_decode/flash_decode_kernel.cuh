// flash_decode: split-KV attention for a few query rows against a long key range (mma.sync
// m16n8k16, ldmatrix, cp.async), and the LSE combine of its splits.
//
// One CTA = one split of the admitted key range for one (KV head, batch). Its rows are every
// query row that reads the KV head (kv_group heads x q_len tokens, packed: row r is token
// r / kv_group, head kv_head * kv_group + r % kv_group), so the CTA reads each K/V byte of its
// split once. Four warps: warp (wm, wn) multiplies rows [wm, wm + 1) x kRowsPerWarp against keys
// [kSubN wn, kSubN wn + kSubN) of each 64-key tile (flash_fwd's ComputeScores / SoftmaxStep /
// AccumulatePV on a (kRowsPerWarp, kSubN) score tile), keeping its own online softmax; after the
// key loop the key slices merge by LSE through shared memory. Masks compare global positions and
// are evaluated only on tiles that are not admitted by every row (the ends of the range).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/flash_decode/flash_decode_params.h"
#include "core/cuda/flash_decode/flash_decode_traits.h"
#include "core/cuda/flash_fwd/flash_fwd_kernel.cuh"

namespace attnserve {
namespace flash_decode {

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// Writes the finished row value (o of element d, and the LSE once per row) of packed row r.
template <typename Elem>
__device__ __forceinline__ void StoreFinal(const FlashDecodeParams& p, int batch, int kv_head,
                                           int r, int d, float o, float lse) {
  const int64_t token = r / p.kv_group;
  const int64_t head = static_cast<int64_t>(kv_head) * p.kv_group + r % p.kv_group;
  const int64_t at = batch * p.o_batch_stride + token * p.o_row_stride + head * p.o_head_stride + d;
  if (p.o_f32) {
    static_cast<float*>(p.o)[at] = o;
  } else {
    static_cast<Elem*>(p.o)[at] = FromFloat<Elem>(o);
  }
  if (d == 0) {
    p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + token * p.lse_row_stride] = lse;
  }
}

// Loads the query rows of `kv_head`, packed (row r: token r / kv_group, head
// kv_head * kv_group + r % kv_group), into the swizzled (kRows, kHeadDim) tile; rows past `rows`
// are zero-filled. Joins the caller's next cp.async commit group.
template <typename Traits>
__device__ __forceinline__ void LoadPackedQ(const FlashDecodeParams& p, uint32_t smem_q_addr,
                                            int batch, int kv_head, int rows) {
  using Elem = typename Traits::Elem;
  constexpr int kChunks = Traits::kChunksPerRow;
  const Elem* q_base = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride +
                       static_cast<int64_t>(kv_head) * p.kv_group * p.q_head_stride;
  for (int idx = threadIdx.x; idx < Traits::kRows * kChunks; idx += Traits::kNThreads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bool in = r < rows;
    const int64_t offset =
        in ? (r / p.kv_group) * p.q_row_stride + (r % p.kv_group) * p.q_head_stride : 0;
    flash_fwd::CpAsync16(smem_q_addr + flash_fwd::SwizzledOffset<kChunks>(r, c) * 2,
                         q_base + offset + c * 8, in ? 16 : 0);
  }
}

// The key rows packed row r admits, inclusive: [lo, hi] (empty when lo > hi, as for a padding row
// r >= rows).
__device__ __forceinline__ void RowKeyBounds(const FlashDecodeParams& p, int r, int rows,
                                             int64_t& lo, int64_t& hi) {
  if (r >= rows) {
    lo = 1;
    hi = 0;
    return;
  }
  const int64_t qk = p.q_pos_offset + r / p.kv_group - p.k_pos_offset;  // query pos - key pos 0
  lo = 0;
  hi = p.kv_len - 1;
  if (p.window >= 0) lo = max(lo, qk - p.window);
  if (p.causal) {
    hi = min(hi, qk);
  } else if (p.window >= 0) {
    hi = min(hi, qk + p.window);
  }
}

// -inf for the scores of keys a row does not admit or past the split: a (kRowsPerWarp, kSubN)
// warp tile of the rows from row0 starting at key ks; this thread's rows are g and g + 8 of each
// 16-row fragment, columns 2t, 2t + 1. The row bounds are computed here rather than kept in
// registers for the whole loop: only the tiles at the ends of the range are masked.
template <typename Traits>
__device__ __forceinline__ void MaskScores(typename flash_fwd::WarpTile<Traits>::Scores& s,
                                           const FlashDecodeParams& p, int64_t ks,
                                           int64_t split_end, int row0, int rows, int g, int t) {
#pragma unroll
  for (int f = 0; f < Traits::kMFrags; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t lo, hi;
      RowKeyBounds(p, row0 + f * 16 + g + h * 8, rows, lo, hi);
      hi = min(hi, split_end - 1);
#pragma unroll
      for (int i = 0; i < flash_fwd::WarpTile<Traits>::kNTilesS; ++i) {
#pragma unroll
        for (int j = 2 * h; j < 2 * h + 2; ++j) {
          const int64_t key = ks + i * 8 + 2 * t + (j & 1);
          if (!((key >= lo) & (key <= hi))) s[f][i][j] = -INFINITY;
        }
      }
    }
  }
}

// After the key loop: merges the kWarpsN key slices of every row by LSE through shared memory
// (`smem`, the free K/V stages), normalises, and stores O and LSE: the final outputs with one
// split, else this split's f32 partials.
template <typename Traits>
__device__ __forceinline__ void MergeSlicesAndStore(
    const FlashDecodeParams& p, const typename flash_fwd::WarpTile<Traits>::Out& acc_o,
    const float (&row_max)[Traits::kMFrags][2], const float (&row_sum)[Traits::kMFrags][2],
    float* smem, int split, int kv_head, int batch, int rows) {
  using W = flash_fwd::WarpTile<Traits>;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kRows = Traits::kRows;
  constexpr int kRowsPerWarp = Traits::kRowsPerWarp;
  constexpr int kWarpsM = Traits::kWarpsM;
  constexpr int kWarpsN = Traits::kWarpsN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM;
  float* sm_o = smem;                                        // [kNWarps][kRowsPerWarp][kD]
  float* sm_m = sm_o + Traits::kNWarps * kRowsPerWarp * kD;  // [kWarpsN][kRows]: raw score max
  float* sm_l = sm_m + kWarpsN * kRows;                      // [kWarpsN][kRows]: denominator
  float* slab = sm_o + warp * kRowsPerWarp * kD;
#pragma unroll
  for (int f = 0; f < Traits::kMFrags; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = f * 16 + g + h * 8;  // within the warp's rows
      float l = row_sum[f][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (t == 0) {
        sm_m[wn * kRows + wm * kRowsPerWarp + row] = row_max[f][h];
        sm_l[wn * kRows + wm * kRowsPerWarp + row] = l;
      }
#pragma unroll
      for (int i = 0; i < W::kNTilesO; ++i) {
        *reinterpret_cast<float2*>(slab + row * kD + i * 8 + 2 * t) =
            make_float2(acc_o[f][i][2 * h], acc_o[f][i][2 * h + 1]);
      }
    }
  }
  __syncthreads();

  const int used_rows = min(rows, kRows);
  const int64_t slot = (static_cast<int64_t>(split) * p.batch + batch) * p.kv_heads + kv_head;
  for (int idx = threadIdx.x; idx < used_rows * kD; idx += Traits::kNThreads) {
    const int r = idx / kD;
    const int d = idx % kD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarpsN; ++w) mx = fmaxf(mx, sm_m[w * kRows + r]);
    float denom = 0.f, acc = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarpsN; ++w) {
        const float mw = sm_m[w * kRows + r];
        const float a = mw == -INFINITY ? 0.f : flash_fwd::Exp2((mw - mx) * p.scale_log2);
        denom += a * sm_l[w * kRows + r];
        acc +=
            a * sm_o[((w * kWarpsM + r / kRowsPerWarp) * kRowsPerWarp + r % kRowsPerWarp) * kD + d];
      }
    }
    const bool empty = !(denom > 0.f);  // also catches NaN
    const float o = empty ? 0.f : acc / denom;
    const float lse = empty ? -INFINITY : mx * p.scale + logf(denom);
    if (p.num_splits == 1) {
      StoreFinal<typename Traits::Elem>(p, batch, kv_head, r, d, o, lse);
    } else {
      p.o_partial[(slot * rows + r) * kD + d] = o;
      if (d == 0) p.lse_partial[slot * rows + r] = lse;
    }
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads) FlashDecodeKernel(const FlashDecodeParams p) {
  using Elem = typename Traits::Elem;
  using W = flash_fwd::WarpTile<Traits>;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kSubN = Traits::kSubN;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* smem_q = reinterpret_cast<Elem*>(smem_raw);  // (kRows, kHeadDim)
  Elem* smem_kv = smem_q + Traits::kQTileElems;      // kStages x [K, V] (kBlockN, kHeadDim)
  const uint32_t smem_q_addr = flash_fwd::SmemAddr(smem_q);
  const uint32_t smem_kv_addr = flash_fwd::SmemAddr(smem_kv);
  constexpr uint32_t kStageBytes = 2u * Traits::kKVTileElems * sizeof(Elem);
  constexpr uint32_t kVOffsetBytes = Traits::kKVTileElems * sizeof(Elem);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;                 // row within the 8-row half of the MMA tile
  const int t = lane % 4;                 // column pair within an n-tile
  const int wm = warp % Traits::kWarpsM;  // the warp's rows: [wm, wm + 1) x kRowsPerWarp
  const int wn = warp / Traits::kWarpsM;  // the warp's key slice of every tile

  const int split = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z);
  const int rows = p.q_len * p.kv_group;

  const int64_t split_begin = p.key_begin + split * p.split_keys;
  const int64_t split_end = min(split_begin + p.split_keys, p.key_end);
  const int64_t num_tiles =
      split_end > split_begin ? (split_end - split_begin + kBlockN - 1) / kBlockN : 0;

  const Elem* k_base =
      static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const Elem* v_base =
      static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  auto load_kv = [&](int64_t tile, int stage) {
    const int64_t k0 = split_begin + tile * kBlockN;
    const uint32_t base = smem_kv_addr + stage * kStageBytes;
    flash_fwd::LoadTile<Traits, kBlockN>(base, k_base, p.k_row_stride, k0, split_end);
    flash_fwd::LoadTile<Traits, kBlockN>(base + kVOffsetBytes, v_base, p.v_row_stride, k0,
                                         split_end);
  };
  // Prologue: Q and the first kStages - 1 key tiles, one commit group each (Q rides with tile 0).
  LoadPackedQ<Traits>(p, smem_q_addr, batch, kv_head, rows);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_kv(s, s);
    flash_fwd::CpAsyncCommit();
  }

  constexpr int kMFrags = Traits::kMFrags;
  typename W::Out acc_o;      // (kRowsPerWarp, kHeadDim) per warp, C-fragment layout
  float row_max[kMFrags][2];  // running max of raw scores
  float row_sum[kMFrags][2];  // this thread's share of the denominators
  flash_fwd::ResetState<Traits>(acc_o, row_max, row_sum);
  typename W::QFrags q_frag;

  const int64_t full_end = min(p.full_end, split_end);
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    flash_fwd::CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile `tile` is visible to all; everyone is done with tile - 1's stage
    {
      const int64_t next = tile + kStages - 1;
      if (next < num_tiles) load_kv(next, static_cast<int>(next % kStages));
      flash_fwd::CpAsyncCommit();
    }
    if (tile == 0) flash_fwd::LoadQFrags<Traits>(q_frag, smem_q_addr, wm, lane);

    const int64_t ks = split_begin + tile * kBlockN + wn * kSubN;  // the warp's first key
    if (ks >= split_end) continue;
    const uint32_t k_addr = smem_kv_addr + static_cast<int>(tile % kStages) * kStageBytes;
    const uint32_t v_addr = k_addr + kVOffsetBytes;
    const int srow0 = wn * kSubN;

    typename W::Scores s;  // (kRowsPerWarp, kSubN)
    flash_fwd::ComputeScores<Traits>(s, q_frag, smem_q_addr, k_addr, srow0, wm, lane);
    if (ks < p.full_begin || ks + kSubN > full_end) {
      MaskScores<Traits>(s, p, ks, split_end, wm * Traits::kRowsPerWarp, rows, g, t);
    }
    flash_fwd::SoftmaxStep<Traits>(s, acc_o, row_max, row_sum, p.scale_log2);
    flash_fwd::AccumulatePV<Traits>(acc_o, s, v_addr, srow0, lane);
  }
  flash_fwd::CpAsyncWait<0>();
  __syncthreads();  // the stages are free: the epilogue reuses them
  MergeSlicesAndStore<Traits>(p, acc_o, row_max, row_sum, reinterpret_cast<float*>(smem_kv), split,
                              kv_head, batch, rows);
}

// Merges the splits of one packed row (blockIdx.x) of one (KV head, batch): L = log sum_s
// exp(LSE_s), O = sum_s exp(LSE_s - L) O_s; a row no split admitted gets O = 0, LSE = -inf.
// One thread per head-dim element. The split LSEs are read once, in parallel, into shared memory
// (dynamic: num_splits floats) and turned into weights there, so the O loop has no dependent load
// chain: its loads are independent and unrolled.
template <typename Elem>
__global__ void FlashDecodeCombineKernel(const FlashDecodeParams p) {
  extern __shared__ float weight[];  // [num_splits]: LSE_s, then exp(LSE_s - L)
  __shared__ float row_lse;
  const int r = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z);
  const int d = static_cast<int>(threadIdx.x);
  const int splits = p.num_splits;
  const int64_t rows = static_cast<int64_t>(p.q_len) * p.kv_group;
  const int64_t split_pitch = static_cast<int64_t>(p.batch) * p.kv_heads * rows;
  const int64_t base = (static_cast<int64_t>(batch) * p.kv_heads + kv_head) * rows + r;
  for (int s = d; s < splits; s += blockDim.x) weight[s] = p.lse_partial[s * split_pitch + base];
  __syncthreads();
  if (d < 32) {
    float mx = -INFINITY;
    for (int s = d; s < splits; s += 32) mx = fmaxf(mx, weight[s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    if (mx != -INFINITY) {
      for (int s = d; s < splits; s += 32) sum += __expf(weight[s] - mx);  // exp(-inf) = 0
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float lse = mx == -INFINITY ? -INFINITY : mx + logf(sum);
    __syncwarp();  // every lane has read its LSEs before any is overwritten by a weight
    for (int s = d; s < splits; s += 32) {
      weight[s] = lse == -INFINITY ? 0.f : __expf(weight[s] - lse);
    }
    if (d == 0) row_lse = lse;
  }
  __syncthreads();
  const float* o_part = p.o_partial + base * p.head_dim + d;
  const int64_t o_pitch = split_pitch * p.head_dim;
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < splits; ++s) acc += weight[s] * o_part[s * o_pitch];
  StoreFinal<Elem>(p, batch, kv_head, r, d, acc, row_lse);
}

}  // namespace flash_decode
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_KERNEL_CUH_
