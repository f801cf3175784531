// flash_fwd_sm90 v3: the v2 kernel (flash_fwd_sm90_v2_kernel.cuh) made persistent.
//
// Same roles, math, tile layout, register split and per-stage protocol as v2; what changes:
// - Grid = min(#SMs, #work items), one CTA per SM. A work item is (query-block row, head,
//   batch * seg) of the space v2's grid enumerates; CTA b runs items b, b + gridDim.x, ...
//   Two item orders (kernel argument `pos_major`, chosen by the launcher):
//   - position-major (implicit dense / causal layouts): item -> (position, head, z) with the
//     position slowest, so the heavy-first walk (the implicit causal layout from its last row
//     down, or row_order) orders the whole item list, not each head's share of it;
//   - head-major (CSR layouts): item -> (head, z) slowest, position fastest (row_order within a
//     head), as v2's grid enumerates its CTAs. The CTAs running at one time then read the K/V
//     of one head (32 MB at N = 65536, D = 128), which stays in L2, and not of every head
//     (position-major: 16 heads' K/V, 512 MB, is streamed from HBM again by each of the ~5 rows
//     that keep a block when the layout is random).
// - The K/V ring continues across items: every tile of the CTA has a global index G (tiles of
//   earlier items of this CTA + e); stage = G % kStages, full/empty parity from G / kStages, and
//   producer warp G % kProducerWarps loads it. No barrier is ever re-initialised.
// - Q is single-buffered (smem: Q + 3 K/V stages = 7 x 32 KB at D = 128 already fills the
//   227 KB; a second Q tile would cost a K/V stage, and at 99% sparsity a row has ~5 tiles, so a
//   2-stage ring would expose the load latency on every tile). Q has its own producer warp
//   (warp 2 of the producer warpgroup; warps 0 and 1 load K/V only and never wait for Q). Two Q
//   barriers: q_full (count 32, the Q warp per item) and q_empty (count 8: one lane per consumer
//   warp per item). A consumer warp arrives on q_empty as soon as its S wgmma of the item's LAST
//   tile completed (wgmma.wait_group 0 after the S GEMM; or at once for an item with no tile).
//   The Q warp waits on q_empty of item j - 1, loads Q of item j, waits for it and arrives on
//   q_full, then prefetches item j + 1's Q rows into L2 (cp.async.bulk.prefetch.L2): the next Q
//   loads from L2 while the consumers run the last softmax, the last P V and the epilogue of
//   item j - 1. (Measured on an H200 before this split: with Q loaded by K/V warp 0, whose
//   q_full arrive waited for its first tile's free stage, the consumers spent ~18% of their
//   stall samples waiting for Q at 99% skipped.)
//   Consumers wait on q_full (parity = local item count & 1) for EVERY item, also an empty one,
//   so a phase is never skipped (a parity wait on a skipped phase would return at once).
// - Ping-pong named barriers: v2's per-item protocol, unchanged (warpgroup 0 syncs barrier 2 for
//   e > 0, warpgroup 1 arrives on it for e + 1 < count). Across items it stays balanced: warpgroup
//   0's first arrive on barrier 1 in item j + 1 needs q_full(j + 1), hence q_empty(j), hence every
//   warp of warpgroup 1 past its last barrier-1 sync of item j (its q_empty arrive follows it).
// - Item metadata (query-block row, kept-tile count, head index, z) is published by the Q warp
//   (lane 0) in an smem slot with Q (written after q_empty of the previous item, released
//   by the q_full arrive): the consumers read it right after the q_full wait, so they do no
//   dependent global loads (row_order, row_ptr) on their critical path between items.
// - Every item's state (accumulators, max, sum) is reset per item; the epilogue is v2's (writes
//   go straight from registers to global memory, so it overlaps the producer's smem writes).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_V3_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_V3_KERNEL_CUH_

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_v2_kernel.cuh"

namespace attnserve {
namespace flash_sm90 {

template <int kHeadDim_, typename Elem_>
struct Sm90V3Traits : Sm90V2Traits<kHeadDim_, Elem_> {
  using V2 = Sm90V2Traits<kHeadDim_, Elem_>;
  // Tiles, then the barriers: full[kStages], empty[kStages], q_full, q_empty (8 B each), then
  // per stage (key block, mask kind) as two int32, then the item's (row, count, y, z).
  static constexpr int kBarOffset = V2::kTileBytes * (1 + 2 * V2::kStages);
  static constexpr int kMetaOffset = kBarOffset + 8 * (2 * V2::kStages + 2);
  static constexpr int kItemMetaOffset = kMetaOffset + 8 * V2::kStages;
  static constexpr int kSmemBytes = kItemMetaOffset + 16 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
};

#if ATTNSERVE_FLASH_SM90_DEVICE
// Work item -> (query-block row, head index (grid.y of v2), z = batch * num_segs + seg).
__device__ __forceinline__ void DecodeItem(const FlashFwdParams& p, int item, int hz,
                                           bool pos_major, int& row, int& y, int& z) {
  int pos, rem;
  if (pos_major) {
    pos = item / hz;
    rem = item - pos * hz;
  } else {
    const int nq = static_cast<int>(p.num_q_blocks);
    rem = item / nq;
    pos = item - rem * nq;
  }
  y = rem % p.num_heads;
  z = rem / p.num_heads;
  if (p.row_order != nullptr) {
    row = p.row_order[pos];
  } else if (p.col_idx == nullptr && p.dense_causal) {
    row = static_cast<int>(p.num_q_blocks) - 1 - pos;
  } else {
    row = pos;
  }
}
// The kept-tile range [begin, begin + count) of query-block row `row`.
__device__ __forceinline__ void ItemRange(const FlashFwdParams& p, int row, int64_t& begin,
                                          int& count) {
  if (p.col_idx != nullptr) {
    begin = p.row_ptr[row];
    count = static_cast<int>(p.row_ptr[row + 1] - begin);
  } else {
    begin = 0;
    count = static_cast<int>(
        p.dense_causal ? min(static_cast<int64_t>(row) + 1, p.num_k_blocks) : p.num_k_blocks);
  }
}
// Q of head index y (grid.y of v2) and z = batch * num_segs + seg.
template <typename Elem>
__device__ __forceinline__ const Elem* QBase(const FlashFwdParams& p, int y, int z) {
  const int head = p.head_start + y * p.head_step;
  return static_cast<const Elem*>(p.q) + (z / p.num_segs) * p.q_batch_stride +
         (z % p.num_segs) * p.q_seg_stride + head * p.q_head_stride;
}
#endif  // ATTNSERVE_FLASH_SM90_DEVICE

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    FlashFwdSm90V3Kernel(const FlashFwdParams p, const int num_items, const bool pos_major) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  using Elem = typename Traits::Elem;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlock = Traits::kBlock;
  constexpr int kStages = Traits::kStages;
  constexpr int kTileBytes = Traits::kTileBytes;
  constexpr int kPanelBytes = Traits::kPanelBytes;
  constexpr int kSRegs = kBlock / 2;
  constexpr int kORegs = kHeadDim / 2;
  constexpr int kNTilesS = kBlock / 8;
  constexpr int kNTilesO = kHeadDim / 8;
  constexpr int kProducerWarps = Traits::kProducerWarps;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_raw_addr = SmemAddr(smem_raw);
  const uint32_t smem_base = (smem_raw_addr + 1023u) & ~1023u;
  unsigned char* const smem_ptr = smem_raw + (smem_base - smem_raw_addr);
  const uint32_t smem_q = smem_base;
  const uint32_t smem_kv = smem_base + kTileBytes;  // stage s: K at 2s tiles, V at 2s + 1
  constexpr uint32_t kStageBytes = 2u * kTileBytes;
  const uint32_t bar_full = smem_base + Traits::kBarOffset;   // + 8 s
  const uint32_t bar_empty = bar_full + 8 * kStages;          // + 8 s
  const uint32_t bar_q_full = bar_full + 16 * kStages;
  const uint32_t bar_q_empty = bar_q_full + 8;
  int* const meta = reinterpret_cast<int*>(smem_ptr + Traits::kMetaOffset);  // [2 s], [2 s + 1]
  int* const item_meta = reinterpret_cast<int*>(smem_ptr + Traits::kItemMetaOffset);

  const int tid = static_cast<int>(threadIdx.x);
  // Warp-uniform warpgroup index (see v2: keeps ptxas from serializing the consumers' wgmma).
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int64_t n = p.seqlen;
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  const int hz = p.num_heads * (p.batch * p.num_segs);
  const int item0 = static_cast<int>(blockIdx.x);
  const int item_step = static_cast<int>(gridDim.x);

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(bar_full + 8 * s, 32);  // every lane of the producer warp that loads the tile
      MbarInit(bar_empty + 8 * s, 4 * Traits::kConsumerWarpgroups);  // one lane per consumer warp
    }
    MbarInit(bar_q_full, 32);  // every lane of the Q warp (producer warp kProducerWarps)
    MbarInit(bar_q_empty, 4 * Traits::kConsumerWarpgroups);  // one lane per consumer warp
  }
  __syncthreads();  // the last CTA-wide barrier: idle producer warps exit below

  if (warpgroup == 0) {
    // ================================ producer warpgroup ================================
    SetMaxNregDec<Traits::kProducerRegs>();
    if (warp < kProducerWarps) {
      // K/V warps: the item's kept tiles into the ring; they never wait for Q.
      uint32_t g = 0;  // global index of the item's first tile in this CTA's tile sequence
      for (int item = item0; item < num_items; item += item_step) {
        int row, y, z;
        DecodeItem(p, item, hz, pos_major, row, y, z);
        int64_t begin = 0;
        int count;
        ItemRange(p, row, begin, count);
        const int head = p.head_start + y * p.head_step;
        const int kv_head = head / p.kv_group;
        const int batch = z / p.num_segs;
        const int seg = z % p.num_segs;
        const Elem* k_base = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride +
                             seg * p.k_seg_stride + kv_head * p.k_head_stride;
        const Elem* v_base = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride +
                             seg * p.v_seg_stride + kv_head * p.v_head_stride;
        // This warp's tiles of the item: global index G = g + e with G % kProducerWarps == warp.
        const int e0 = static_cast<int>((static_cast<uint32_t>(warp) + kProducerWarps -
                                         g % kProducerWarps) % kProducerWarps);
        for (int e = e0; e < count; e += kProducerWarps) {
          const uint32_t gi = g + static_cast<uint32_t>(e);
          const int stage = static_cast<int>(gi % kStages);
          // The tile's CSR entry is read before the stage wait, so its latency overlaps it.
          int blk, mask;
          if (p.col_idx != nullptr) {
            blk = p.col_idx[begin + e];
            mask = p.block_mask[begin + e];
          } else {
            blk = e;
            mask = (p.dense_causal && e == row) ? 1 : 0;
          }
          // Reuse: the consumers released this stage's previous tile (gi - kStages).
          if (gi >= static_cast<uint32_t>(kStages)) {
            MbarWait(bar_empty + 8 * stage, (gi / kStages + 1) & 1u);
          }
          if (lane == 0) {
            meta[2 * stage] = blk;
            meta[2 * stage + 1] = mask;
          }
          const int64_t k0 = static_cast<int64_t>(blk) * kBlock;
          const uint32_t base = smem_kv + stage * kStageBytes;
          WarpLoadTile<kBlock, Traits::kChunks>(base, k_base, p.k_row_stride, k0, nk, lane);
          WarpLoadTile<kBlock, Traits::kChunks>(base + kTileBytes, v_base, p.v_row_stride, k0,
                                                nk, lane);
          CpAsyncCommit();
          CpAsyncWait<0>();
          FenceProxyAsyncShared();
          MbarArrive(bar_full + 8 * stage);
        }
        g += static_cast<uint32_t>(count);
      }
    } else if (warp == kProducerWarps) {
      // Q warp: each item's Q (after the consumers released the previous one) and its metadata;
      // then the next item's Q rows are prefetched into L2, a whole item ahead of their load.
      uint32_t local = 0;  // items of this CTA so far
      for (int item = item0; item < num_items; item += item_step, ++local) {
        int row, y, z;
        DecodeItem(p, item, hz, pos_major, row, y, z);
        int64_t begin = 0;
        int count;
        ItemRange(p, row, begin, count);
        const Elem* q_base = QBase<Elem>(p, y, z);
        // Q of the previous item: every consumer warp issued and completed its last S GEMM.
        if (local > 0) MbarWait(bar_q_empty, (local - 1) & 1u);
        WarpLoadTile<kBlock, Traits::kChunks>(smem_q, q_base, p.q_row_stride,
                                              static_cast<int64_t>(row) * kBlock, n, lane);
        CpAsyncCommit();
        if (lane == 0) {  // released to the consumers by this lane's q_full arrive
          item_meta[0] = row;
          item_meta[1] = count;
          item_meta[2] = y;
          item_meta[3] = z;
        }
        CpAsyncWait<0>();
        FenceProxyAsyncShared();
        MbarArrive(bar_q_full);
        const int next = item + item_step;
        if (next < num_items) {
          DecodeItem(p, next, hz, pos_major, row, y, z);
          const Elem* qn = QBase<Elem>(p, y, z);
          const int64_t r0 = static_cast<int64_t>(row) * kBlock + lane;
          const int rows = static_cast<int>(min(static_cast<int64_t>(kBlock), n - r0));
          const Elem* qp = qn + r0 * p.q_row_stride;
#pragma unroll 1
          for (int r = 0; r < rows; r += 32, qp += 32 * p.q_row_stride) {
            PrefetchL2Bulk(qp, kHeadDim * sizeof(Elem));
          }
        }
      }
    }
  } else {
    // ================================ consumer warpgroups ===============================
    SetMaxNregInc<Traits::kConsumerRegs>();
    const int wg = warpgroup - 1;  // query rows [64 wg, 64 wg + 64) of the tile
    const int warp_in_wg = warp % 4;
    const int gq = lane / 4;
    const int t = lane % 4;
    const int64_t delta = p.q_pos_offset - p.k_pos_offset;
    const uint32_t q_wg = smem_q + wg * 64 * 128;

    uint32_t gbase = 0;  // global tile index of the item's first tile
    uint32_t local = 0;  // items of this CTA so far
    for (int item = item0; item < num_items; item += item_step, ++local) {
      // Q and the item's metadata of this item (producer warp 0).
      MbarWait(bar_q_full, local & 1u);
      const int row = item_meta[0];
      const int count = item_meta[1];
      const int y = item_meta[2];
      const int z = item_meta[3];
      const int head = p.head_start + y * p.head_step;
      const int batch = z / p.num_segs;
      const int seg = z % p.num_segs;
      const int64_t q0 = static_cast<int64_t>(row) * kBlock;

      float acc_o[kORegs];
#pragma unroll
      for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.f;
      float row_max[2] = {-INFINITY, -INFINITY};
      float row_sum[2] = {0.f, 0.f};

      const int64_t wg_row0 = q0 + wg * 64;
      const int64_t my_row0 = wg_row0 + warp_in_wg * 16 + gq;  // + 8 h
      const bool wg_active = wg_row0 < n;

      for (int e = 0; e < count; ++e) {
        const uint32_t gi = gbase + static_cast<uint32_t>(e);
        const int stage = static_cast<int>(gi % kStages);
        MbarWait(bar_full + 8 * stage, (gi / kStages) & 1u);
        const int mask = meta[2 * stage + 1];
        const int64_t k0 = static_cast<int64_t>(meta[2 * stage]) * kBlock;
        const bool work = wg_active && k0 < nk && !(mask == 1 && k0 > wg_row0 + 63 + delta);
        // Lane 0 of each warp arrives on q_empty after this item's last S GEMM (lane argument 1:
        // no arrive).
        const int q_release_lane = e + 1 == count ? lane : 1;

        const uint32_t k_tile = smem_kv + stage * kStageBytes;
        const uint32_t v_tile = k_tile + kTileBytes;

        // Ping-pong: v2's, per item (see the header comment for why it holds across items).
        const bool sync2 = e > 0;
        const bool arrive2 = e + 1 < count;
        if (wg == 1) {
          NamedBarSync(1, 256);
        } else if (sync2) {
          NamedBarSync(2, 256);
        }
        if (!work) {
          if (wg == 0) {
            NamedBarArrive(1, 256);
          } else if (arrive2) {
            NamedBarArrive(2, 256);
          }
          MbarArriveLane0(bar_q_empty, q_release_lane);
        } else {
          float s[kSRegs];
#pragma unroll
          for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
#pragma unroll
          for (int i = 0; i < kSRegs; ++i) FenceReg(s[i]);
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const uint32_t koff = (kk / 4) * kPanelBytes + (kk % 4) * 32;
            const uint64_t db = MakeDesc(k_tile + koff, 16, 1024);
            const uint64_t da = MakeDesc(q_wg + koff, 16, 1024);
            Wgmma<kBlock, Traits::kBF16>::Ss(s, da, db, kk > 0 ? 1 : 0);
          }
          WgmmaCommit();
          if (wg == 0) {
            NamedBarArrive(1, 256);
          } else if (arrive2) {
            NamedBarArrive(2, 256);
          }
          WgmmaWait<0>();
#pragma unroll
          for (int i = 0; i < kSRegs; ++i) FenceReg(s[i]);
          // The S GEMM completed: on the last tile this warp is done with Q.
          MbarArriveLane0(bar_q_empty, q_release_lane);

          const bool ragged = k0 + kBlock > nk;
          if (mask != 0 || ragged) {
#pragma unroll
            for (int i = 0; i < kNTilesS; ++i) {
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const int64_t key = k0 + i * 8 + 2 * t + (j & 1);
                const int64_t qr = my_row0 + 8 * (j >> 1) + delta;
                bool ok = key < nk;
                if (mask == 1) {
                  ok = ok && key <= qr;
                } else if (mask == 2) {
                  if (p.rule_causal) ok = ok && key <= qr;
                  if (p.rule_window >= 0) {
                    const int64_t d = qr - key;
                    ok = ok && d <= p.rule_window && -d <= p.rule_window;
                  }
                }
                if (!ok) s[4 * i + j] = -INFINITY;
              }
            }
          }

          float scaled_max[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float mx = row_max[h];
#pragma unroll
            for (int i = 0; i < kNTilesS; ++i) {
              mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            scaled_max[h] = mx == -INFINITY ? 0.f : mx * p.scale_log2;
            const float alpha = Exp2(row_max[h] * p.scale_log2 - scaled_max[h]);
            row_max[h] = mx;
            row_sum[h] *= alpha;
#pragma unroll
            for (int i = 0; i < kNTilesO; ++i) {
              acc_o[4 * i + 2 * h] *= alpha;
              acc_o[4 * i + 2 * h + 1] *= alpha;
            }
          }
#pragma unroll
          for (int i = 0; i < kNTilesS; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              s[4 * i + j] = Exp2(fmaf(s[4 * i + j], p.scale_log2, -scaled_max[j >> 1]));
              row_sum[j >> 1] += s[4 * i + j];
            }
          }

          uint32_t pa[kBlock / 16][4];
#pragma unroll
          for (int kk = 0; kk < kBlock / 16; ++kk) {
            pa[kk][0] = Pack<Elem>(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = Pack<Elem>(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = Pack<Elem>(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = Pack<Elem>(s[8 * kk + 6], s[8 * kk + 7]);
          }
#pragma unroll
          for (int kk = 0; kk < kBlock / 16; ++kk) {
#pragma unroll
            for (int j = 0; j < 4; ++j) FenceReg(pa[kk][j]);
          }
#pragma unroll
          for (int i = 0; i < kORegs; ++i) FenceReg(acc_o[i]);
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < kBlock / 16; ++kk) {
            const uint64_t db = MakeDesc(v_tile + kk * 16 * 128, kPanelBytes, 1024);
            Wgmma<kHeadDim, Traits::kBF16>::Rs(acc_o, pa[kk], db, 1);
          }
          WgmmaCommit();
          WgmmaWait<0>();
#pragma unroll
          for (int i = 0; i < kORegs; ++i) FenceReg(acc_o[i]);
        }
        // This warp's wgmma reads of the stage are complete (wgmma.wait_group 0 above, executed
        // by the converged warp): hand the stage back to the producer.
        MbarArriveLane0(bar_empty + 8 * stage, lane);
      }
      if (count == 0) MbarArriveLane0(bar_q_empty, lane);  // no S GEMM read this Q
      gbase += static_cast<uint32_t>(count);

      if (wg_active) {
        const int64_t o_offset =
            batch * p.o_batch_stride + seg * p.o_seg_stride + head * p.o_head_stride;
        float* lse_base = p.lse + batch * p.lse_batch_stride + seg * p.lse_seg_stride +
                          head * p.lse_head_stride;
        // ---- epilogue: v1's ----
        float row_l[2];
        float lse_prev[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float l = row_sum[h];
          l += __shfl_xor_sync(0xffffffffu, l, 1);
          l += __shfl_xor_sync(0xffffffffu, l, 2);
          row_l[h] = l;
          const int64_t r = my_row0 + 8 * h;
          lse_prev[h] = (p.accumulate && r < n) ? lse_base[r * p.lse_row_stride] : -INFINITY;
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float l = row_l[h];
          const bool empty = !(l > 0.f);
          const float inv = empty ? 0.f : 1.f / l;
          const int64_t r = my_row0 + 8 * h;
          if (r >= n) continue;
          const float lse_new = empty ? -INFINITY : row_max[h] * p.scale + logf(l);
          if (!p.accumulate) {
            Elem* orow = static_cast<Elem*>(p.o) + o_offset + r * p.o_row_stride;
#pragma unroll
            for (int i = 0; i < kNTilesO; ++i) {
              *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) =
                  Pack<Elem>(acc_o[4 * i + 2 * h] * inv, acc_o[4 * i + 2 * h + 1] * inv);
            }
            if (t == 0) lse_base[r * p.lse_row_stride] = lse_new;
          } else if (!empty) {
            const float l_acc = lse_prev[h];
            const float l_max = fmaxf(l_acc, lse_new);
            const float l_out = l_max + log1pf(__expf(fminf(l_acc, lse_new) - l_max));
            const float w_acc = l_acc == -INFINITY ? 0.f : __expf(l_acc - l_out);
            const float w_new = __expf(lse_new - l_out) * inv;
            float* orow = static_cast<float*>(p.o) + o_offset + r * p.o_row_stride;
#pragma unroll
            for (int i = 0; i < kNTilesO; ++i) {
              float2* dst = reinterpret_cast<float2*>(orow + i * 8 + 2 * t);
              float2 cur = w_acc == 0.f ? make_float2(0.f, 0.f) : *dst;
              cur.x = fmaf(w_acc, cur.x, w_new * acc_o[4 * i + 2 * h]);
              cur.y = fmaf(w_acc, cur.y, w_new * acc_o[4 * i + 2 * h + 1]);
              *dst = cur;
            }
            if (t == 0) lse_base[r * p.lse_row_stride] = l_out;
          }
        }
      }
    }
  }
#else
  __trap();
#endif  // ATTNSERVE_FLASH_SM90_DEVICE
}

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_V3_KERNEL_CUH_
