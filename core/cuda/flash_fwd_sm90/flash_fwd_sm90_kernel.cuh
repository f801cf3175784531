// flash_fwd_sm90: block-sparse attention forward for Hopper (sm_90a) with warpgroup MMA (wgmma).
//
// Same contract and semantics as flash_fwd/flash_fwd_kernel.cuh (FlashFwdParams): one CTA = one
// query block row of the layout (kBlock = 64 or 128 query rows) for one (batch*segment, head); it
// walks the row's kept key blocks (CSR col_idx or the implicit dense row), applies each block's
// mask kind (0 full, 1 causal diagonal, 2 partial = TokenRule on global positions) and the
// ragged-end bounds, keeps an exp2 online softmax in f32, and writes O (input dtype) + LSE
// (natural log), or LSE-merges into an f32 O in accumulate mode. Rows with no admissible key:
// O = 0, LSE = -inf (accumulate: untouched).
//
// Structure (see core/cuda/NOTES.md, "Hopper path"):
// - kBlock / 64 consumer warpgroups; warpgroup w owns query rows [64w, 64w + 64) of the tile.
//   All threads are consumers and also issue the cp.async loads (no producer warpgroup).
// - Key tile = the layout's whole key block (kBlock keys), so one tile = one CSR entry and one
//   mask kind.
// - Shared memory tiles (Q, and per stage K and V) are (rows, kHeadDim) bf16/f16 stored as
//   kHeadDim / 64 column panels of (rows, 64): each row of a panel is 128 bytes, 8 rows form a
//   1024-byte atom, and 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the 128-byte swizzle
//   wgmma decodes from address bits [4,7) ^ [7,10); tile bases are 1024-byte aligned).
//   * Q (A of S = Q K^T) and K (B, N = keys) are K-major: descriptor SBO = 1024 (8-row groups),
//     a 16-wide k-step advances the start address by 32 bytes inside the 128-byte row, and by a
//     panel (rows * 128 bytes) every 4 k-steps.
//   * V (B of O = P V, N = head dim, K = keys) is the same bytes read MN-major (imm-trans-b = 1):
//     LBO = panel stride (next 64 head-dim columns), SBO = 1024 (next 8 keys); a 16-key k-step
//     advances by 16 * 128 = 2048 bytes.
// - S: (64, kBlock) f32 per warpgroup = kBlock / 2 registers per thread, wgmma m64n{kBlock}k16 SS.
//   P = exp2(...) packed in registers to the m64k16 A fragments; O += P V with wgmma
//   m64n{kHeadDim}k16 RS. O: kHeadDim / 2 f32 registers per thread.
// - The per-tile math (S GEMM, mask, online softmax, P packing, P V GEMM) and the epilogue are
//   written once for both Hopper forward kernels (this one and the persistent warp-specialized
//   one, flash_fwd_sm90_persistent_kernel.cuh): flash_fwd_sm90_mainloop.cuh, _mask.cuh,
//   _softmax.cuh, _epilogue.cuh; work decomposition in _tile_scheduler.cuh, PTX wrappers in
//   _utils.cuh.
// - K/V: kStages-deep cp.async ring (16-byte copies into the swizzled layout, zero-fill past the
//   key end), gathered by col_idx; the load of tile t + kStages - 1 is issued before tile t's
//   math, so kStages - 1 kept blocks are in flight behind the MMAs.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_epilogue.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_mainloop.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_softmax.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_tile_scheduler.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {
namespace flash_sm90 {

template <int kHeadDim_, int kBlock_, typename Elem_>
struct Sm90Traits {
  using Elem = Elem_;
  static constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlock = kBlock_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlock == 64 || kBlock == 128, "layout block 64 or 128");
  static constexpr int kWarpgroups = kBlock / 64;
  static constexpr int kNThreads = kWarpgroups * 128;
  static constexpr int kPanels = kHeadDim / 64;             // 128-byte column panels per tile row
  static constexpr int kChunks = kHeadDim / 8;              // 16-byte chunks per tile row
  static constexpr int kTileBytes = kBlock * kHeadDim * 2;  // Q, K or V tile
  static constexpr int kPanelBytes = kBlock * 128;
  // Three stages: 2 kept blocks in flight behind the math (a CSR gather has no locality to hide
  // latency otherwise). D=128, block 128: Q 32 KB + 3 x (K + V) 64 KB = 224 KB (+1 KB alignment)
  // of the 227 KB a CTA may have; smaller tiles fit two CTAs per SM.
  static constexpr int kStages = 3;
  static constexpr int kSmemBytes = kTileBytes * (1 + 2 * kStages) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
};

#if ATTNSERVE_FLASH_SM90_DEVICE

// Loads rows [row0, row0 + kRows) of a (., kHeadDim) matrix with element row stride `stride`
// into a swizzled tile; rows at or past `limit` are zero-filled (never read from global).
template <typename Traits>
__device__ __forceinline__ void LoadTile(uint32_t smem, const typename Traits::Elem* gbase,
                                         int64_t stride, int64_t row0, int64_t limit) {
  constexpr int kRows = Traits::kBlock;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % Traits::kNThreads == 0, "tile chunks divide the CTA");
#pragma unroll
  for (int i = 0; i < kTotal / Traits::kNThreads; ++i) {
    const int idx = i * Traits::kNThreads + static_cast<int>(threadIdx.x);
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int64_t token = row0 + r;
    const bool in = token < limit;
    const typename Traits::Elem* src = gbase + (in ? token : 0) * stride + c * 8;
    CpAsync16(smem + TileOffset<kRows>(r, c), src, in ? 16 : 0);
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) FlashFwdSm90Kernel(const FlashFwdParams p) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  using Elem = typename Traits::Elem;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlock = Traits::kBlock;
  constexpr int kStages = Traits::kStages;
  constexpr int kTileBytes = Traits::kTileBytes;

  extern __shared__ unsigned char smem_raw[];
  // 1024-byte alignment of every tile (the 128-byte swizzle atom); kSmemBytes reserves the slack.
  const uint32_t smem_base = (SmemAddr(smem_raw) + 1023u) & ~1023u;
  const uint32_t smem_q = smem_base;                // (kBlock, kHeadDim)
  const uint32_t smem_kv = smem_base + kTileBytes;  // stage s: K at 2s tiles, V at 2s + 1
  constexpr uint32_t kStageBytes = 2u * kTileBytes;

  const int tid = static_cast<int>(threadIdx.x);
  // Warp-uniform by construction (a shuffle from lane 0): with a plain tid / 128 ptxas cannot prove
  // the ping-pong branch below warp-uniform and serializes every wgmma (warning C7518).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // consumer warpgroup: rows [64 wg, +64)
  const int warp_in_wg = (tid % 128) / 32;
  const int lane = tid % 32;

  const int64_t row =
      p.row_order != nullptr ? static_cast<int64_t>(p.row_order[blockIdx.x]) : blockIdx.x;
  const int y = static_cast<int>(blockIdx.y);
  const int z = static_cast<int>(blockIdx.z);
  const Elem* q_base = QBase<Elem>(p, y, z);
  const Elem* k_base;
  const Elem* v_base;
  KvBase<Elem>(p, y, z, k_base, v_base);
  const OutputBase out = MakeOutputBase(p, y, z);

  const int64_t q0 = row * kBlock;
  const int64_t n = p.seqlen;
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;

  // The row's kept tiles, as the persistent kernel's items walk them (tile scheduler header).
  int64_t begin = 0;
  int count = 0;
  ItemRange(p, static_cast<int>(row), begin, count);
  auto block_of = [&](int e, int& mask) -> int64_t {
    return TileKeyBlock(p, static_cast<int>(row), begin, e, mask);
  };
  auto load_kv = [&](int e, int stage) {
    int mask;
    const int64_t k0 = block_of(e, mask) * kBlock;
    const uint32_t base = smem_kv + stage * kStageBytes;
    LoadTile<Traits>(base, k_base, p.k_row_stride, k0, nk);
    LoadTile<Traits>(base + kTileBytes, v_base, p.v_row_stride, k0, nk);
  };

  // Prologue: Q rides with the first K/V group.
  LoadTile<Traits>(smem_q, q_base, p.q_row_stride, q0, n);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) load_kv(s, s);
    CpAsyncCommit();
  }

  float acc_o[kHeadDim / 2];  // (64, kHeadDim) O of this warpgroup, wgmma accumulator layout
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
  OnlineSoftmax<kBlock, kHeadDim> softmax;
  softmax.Reset();

  const int64_t wg_row0 = q0 + wg * 64;
  const ThreadRows rows{wg_row0 + warp_in_wg * 16 + lane / 4, p.q_pos_offset - p.k_pos_offset,
                        lane % 4};
  const bool wg_active = wg_row0 < n;  // warpgroup-uniform: all its rows past the end -> idle
  const uint32_t q_wg = smem_q + wg * 64 * 128;  // this warpgroup's (64, kHeadDim) Q rows

  for (int e = 0; e < count; ++e) {
    CpAsyncWait<kStages - 2>();
    FenceProxyAsyncShared();
    __syncthreads();  // tile e visible to every warpgroup; all done with tile e - 1's stage
    {
      const int next = e + kStages - 1;
      if (next < count) load_kv(next, next % kStages);
      CpAsyncCommit();
    }

    int mask;
    const int64_t k0 = block_of(e, mask) * kBlock;
    // Warpgroup-uniform: rows past the end, or a causal diagonal whose keys all follow this
    // warpgroup's last row (nothing admissible) -> no math for this tile.
    const bool work = wg_active && k0 < nk && !(mask == 1 && k0 > wg_row0 + 63 + rows.delta);

    const int stage = static_cast<int>(e % kStages);
    const uint32_t k_tile = smem_kv + stage * kStageBytes;
    const uint32_t v_tile = k_tile + kTileBytes;

    // Ping-pong (two warpgroups): warpgroup 1 issues its S GEMM only after warpgroup 0 issued
    // its own, so the tensor cores run S0, S1, then P0 V, P1 V while the other warpgroup does its
    // softmax, instead of both GEMMs together and then both softmaxes with the tensor cores idle.
    // Executed every tile by both warpgroups (also when `work` is false): one arrive per sync.
    if constexpr (Traits::kWarpgroups == 2) {
      if (wg == 1) NamedBarSync(1, 256);
    }
    float s[kBlock / 2];  // (64, kBlock) S of this warpgroup
    if (work) IssueScores<Traits>(s, q_wg, k_tile);
    if constexpr (Traits::kWarpgroups == 2) {
      if (wg == 0) NamedBarArrive(1, 256);
    }
    if (!work) continue;
    WaitScores(s);
    ConsumeScores<Traits>(p, s, acc_o, softmax, rows, mask, k0, nk, v_tile);
  }
  CpAsyncWait<0>();

  if (!wg_active) return;  // no barrier below
  StoreOutput<Elem>(p, acc_o, softmax, out, rows.my_row0, rows.t);
#else
  // Built for an architecture without wgmma: never launched (the dispatch checks the device).
  __trap();
#endif  // ATTNSERVE_FLASH_SM90_DEVICE
}

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_KERNEL_CUH_
