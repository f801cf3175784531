// flash_decode on Hopper: the split kernel with a wgmma consumer (sm_90a), for the row tiles where
// the mma.sync kernel runs out of issue slots (64 packed rows: 16 query tokens x GQA 4).
//
// Same contract, grid and partial-result layout as FlashDecodeKernel (flash_decode_kernel.cuh):
// one CTA = one split of the admitted key range for one (KV head, batch), its rows every query row
// that reads the KV head, packed (row r: token r / kv_group, head kv_head * kv_group +
// r % kv_group). What differs is the math: one warpgroup (128 threads) holds all 64 rows, so a
// 64-key tile is two asynchronous instructions streams instead of four warps' ldmatrix + mma.sync
// chains: S = Q K^T as kHeadDim / 16 wgmma m64n64k16 (Q and K from shared memory), the online
// softmax in registers, O += P V as 4 wgmma m64nDk16 with P from registers and V read MN-major.
// The tile math is the prefill kernel's (flash_fwd_sm90_mainloop.cuh: IssueScores, PackP,
// GemmPV; OnlineSoftmax), the shared-memory layout its 128-byte swizzle in 64-column panels.
//
// Loads: cp.async by every thread into a ring of kStages stages, kStages - 1 tiles in flight; a
// thread fences its own writes for the async proxy (wgmma reads through it) before the CTA
// barrier that publishes the tile. Two CTAs per SM at D = 128 (one at a time in softmax while the
// other's wgmmas and loads run), three at D = 64.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_SM90_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_SM90_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/flash_decode/flash_decode_kernel.cuh"
#include "core/cuda/flash_decode/flash_decode_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_mainloop.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_softmax.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {

// Tile sizes of the wgmma decode kernel. kBlock, kHeadDim, kPanelBytes and kBF16 are the names
// the sm90 mainloop helpers read.
template <int kHeadDim_, typename Elem_>
struct FlashDecodeSm90Traits {
  using Elem = Elem_;
  static constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "one or two 64-column panels");
  static constexpr int kRows = 64;       // packed query rows: one wgmma M
  static constexpr int kBlock = 64;      // keys per tile: S is (64, 64), 32 registers a thread
  static constexpr int kNThreads = 128;  // one warpgroup
  // Q, K and V tiles all have 64 rows: a 64-column panel is 64 rows of 128 bytes.
  static constexpr int kPanelBytes = 64 * 128;
  static constexpr int kTileBytes = 64 * kHeadDim * 2;  // one (64, kHeadDim) tile of Elem
  // D=128: Q + 3 stages of K and V = 112 KB (+1 KB to align the tiles to 1024 bytes for the
  // swizzle): two CTAs per SM, four tiles (128 KB) in flight per SM as in the mma.sync kernel.
  // D=64: Q + 4 stages = 72 KB: three CTAs per SM.
  static constexpr int kStages = kHeadDim == 64 ? 4 : 3;
  static constexpr int kSmemBytes = kTileBytes * (1 + 2 * kStages) + 1024;
  // The epilogue writes straight from registers; nothing of it lives in shared memory.
};

namespace flash_decode {

#if ATTNSERVE_FLASH_SM90_DEVICE

// Loads key rows [k0, k0 + 64) of one head (rows past `end` zero-filled) into a swizzled
// (64, kHeadDim) tile at `tile`. Joins the caller's next cp.async commit group.
template <typename Traits>
__device__ __forceinline__ void LoadKvTileSm90(uint32_t tile, const typename Traits::Elem* base,
                                               int64_t row_stride, int64_t k0, int64_t end) {
  constexpr int kChunks = Traits::kHeadDim / 8;
#pragma unroll
  for (int it = 0; it < 64 * kChunks / Traits::kNThreads; ++it) {
    const int idx = threadIdx.x + it * Traits::kNThreads;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bool in = k0 + r < end;
    const auto* src = base + (in ? (k0 + r) * row_stride + c * 8 : 0);
    flash_sm90::CpAsync16(tile + flash_sm90::TileOffset<64>(r, c), src, in ? 16 : 0);
  }
}

// Query rows of `kv_head`, packed, into the swizzled (64, kHeadDim) Q tile; rows past `rows`
// are zero-filled.
template <typename Traits>
__device__ __forceinline__ void LoadPackedQSm90(const FlashDecodeParams& p, uint32_t tile,
                                                int batch, int kv_head, int rows) {
  using Elem = typename Traits::Elem;
  constexpr int kChunks = Traits::kHeadDim / 8;
  const Elem* q_base = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride +
                       static_cast<int64_t>(kv_head) * p.kv_group * p.q_head_stride;
#pragma unroll
  for (int it = 0; it < 64 * kChunks / Traits::kNThreads; ++it) {
    const int idx = threadIdx.x + it * Traits::kNThreads;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bool in = r < rows;
    const int64_t offset =
        in ? (r / p.kv_group) * p.q_row_stride + (r % p.kv_group) * p.q_head_stride + c * 8 : 0;
    flash_sm90::CpAsync16(tile + flash_sm90::TileOffset<64>(r, c), q_base + offset, in ? 16 : 0);
  }
}

// -inf for the scores of keys a row does not admit or past the split, in the wgmma accumulator
// layout: S register 4 i + j of a thread holds (row row0 + 8 (j / 2), key k0 + 8 i + 2 t + j % 2).
__device__ __forceinline__ void MaskScoresSm90(float (&s)[32], const FlashDecodeParams& p,
                                               int64_t k0, int64_t split_end, int row0, int rows,
                                               int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int64_t lo, hi;
    RowKeyBounds(p, row0 + 8 * h, rows, lo, hi);
    hi = min(hi, split_end - 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 2 * h; j < 2 * h + 2; ++j) {
        const int64_t key = k0 + i * 8 + 2 * t + (j & 1);
        if (!((key >= lo) & (key <= hi))) s[4 * i + j] = -INFINITY;
      }
    }
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    FlashDecodeSm90Kernel(const FlashDecodeParams p) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  using Elem = typename Traits::Elem;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kBlock = Traits::kBlock;
  constexpr uint32_t kTileBytes = Traits::kTileBytes;
  constexpr uint32_t kStageBytes = 2 * kTileBytes;  // K then V

  extern __shared__ unsigned char smem_raw[];
  // The 128-byte swizzle's descriptors take tiles at 1024-byte aligned addresses (base offset 0).
  const uint32_t smem_base = (flash_sm90::SmemAddr(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_tile = smem_base;
  const uint32_t kv_base = smem_base + kTileBytes;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int t = lane % 4;
  const int row0 = warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8

  const int split = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z);
  const int rows = p.q_len * p.kv_group;

  const int64_t split_begin = p.key_begin + split * p.split_keys;
  const int64_t split_end = min(split_begin + p.split_keys, p.key_end);
  const int64_t num_tiles =
      split_end > split_begin ? (split_end - split_begin + kBlock - 1) / kBlock : 0;

  const Elem* k_base =
      static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  const Elem* v_base =
      static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  auto load_kv = [&](int64_t tile, int stage) {
    const int64_t k0 = split_begin + tile * kBlock;
    const uint32_t at = kv_base + stage * kStageBytes;
    LoadKvTileSm90<Traits>(at, k_base, p.k_row_stride, k0, split_end);
    LoadKvTileSm90<Traits>(at + kTileBytes, v_base, p.v_row_stride, k0, split_end);
  };
  // Prologue: Q and the first kStages - 1 key tiles, one commit group each (Q rides with tile 0).
  LoadPackedQSm90<Traits>(p, q_tile, batch, kv_head, rows);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_kv(s, s);
    flash_sm90::CpAsyncCommit();
  }

  float acc_o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) acc_o[i] = 0.f;
  flash_sm90::OnlineSoftmax<kBlock, kD> softmax;
  softmax.Reset();

  const int64_t full_end = min(p.full_end, split_end);
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    flash_sm90::CpAsyncWait<kStages - 2>();
    flash_sm90::FenceProxyAsyncShared();  // this thread's landed copies, visible to wgmma
    __syncthreads();  // tile `tile` is complete; everyone is done with tile - 1's stage
    {
      const int64_t next = tile + kStages - 1;
      if (next < num_tiles) load_kv(next, static_cast<int>(next % kStages));
      flash_sm90::CpAsyncCommit();
    }
    const uint32_t k_tile = kv_base + static_cast<uint32_t>(tile % kStages) * kStageBytes;
    const int64_t k0 = split_begin + tile * kBlock;

    float s[kBlock / 2];
    flash_sm90::IssueScores<Traits>(s, q_tile, k_tile);
    flash_sm90::WaitScores(s);
    if (k0 < p.full_begin || k0 + kBlock > full_end) {
      MaskScoresSm90(s, p, k0, split_end, row0, rows, t);
    }
    softmax.Step(s, acc_o, p.scale_log2);
    uint32_t pa[kBlock / 16][4];
    flash_sm90::PackP<Elem, kBlock>(s, pa);
    flash_sm90::GemmPV<Traits>(acc_o, pa, k_tile + kTileBytes);  // waited for
  }
  flash_sm90::CpAsyncWait<0>();

  // Epilogue, from registers: this split's normalised O and LSE of the thread's two rows (the
  // final outputs with one split, else the f32 partials the combine merges).
  const int64_t slot = (static_cast<int64_t>(split) * p.batch + batch) * p.kv_heads + kv_head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = softmax.row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = row0 + 8 * h;
    if (r >= rows) continue;
    const bool empty = !(l > 0.f);  // also catches NaN
    const float inv = empty ? 0.f : 1.f / l;
    const float lse = empty ? -INFINITY : softmax.row_max[h] * p.scale + logf(l);
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) {
      const int d = i * 8 + 2 * t;
      const float o0 = acc_o[4 * i + 2 * h] * inv, o1 = acc_o[4 * i + 2 * h + 1] * inv;
      if (p.num_splits == 1) {
        StoreFinal<Elem>(p, batch, kv_head, r, d, o0, lse);
        StoreFinal<Elem>(p, batch, kv_head, r, d + 1, o1, lse);
      } else {
        *reinterpret_cast<float2*>(p.o_partial + (slot * rows + r) * kD + d) =
            make_float2(o0, o1);
      }
    }
    if (p.num_splits > 1 && t == 0) p.lse_partial[slot * rows + r] = lse;
  }
#else
  __trap();  // the dispatch launches this kernel only on 9.x devices of a build with sm_90a
#endif
}

}  // namespace flash_decode
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_SM90_KERNEL_CUH_
