// flash_fwd_sm90 v2: the v1 kernel (flash_fwd_sm90_kernel.cuh) with warp specialization.
//
// Same contract, math, shared-memory tile layout, wgmma descriptors and epilogue as v1 (the
// consumer body is v1's loop body); what changes is who loads and how the stages are handed over:
// - CTA = 3 warpgroups (384 threads), layout block 128 only (block 64 keeps v1):
//   warpgroup 0 = producer (setmaxnreg.dec to kProducerRegs; its warps 0 and 1 load K/V, warp 2
//   loads Q, warp 3 exits), warpgroups 1 and 2 = consumers (setmaxnreg.inc to kConsumerRegs), query rows
//   [0, 64) and [64, 128) of the tile, exactly as v1's warpgroups 0 and 1.
// - Producer warps: cp.async (16 B, same swizzled layout and zero-fill past the key end as v1)
//   of Q (warp 2, published on its own barrier as soon as it landed) and of each kept K/V block
//   into the kStages ring, tile e by warp e % 2. A warp
//   issues its tile, waits for its own copies (cp.async.wait_group 0), runs
//   fence.proxy.async.shared::cta in every writing lane (the writes are generic-proxy, wgmma
//   reads through the async proxy; the fence is in the writing thread, before the release) and
//   arrives on full[stage] (count 32: every lane of that warp). Two warps = two tiles loading at
//   once, each published as soon as it landed. Lane 0 also stores (key block, mask kind) of the
//   tile in a per-stage smem slot before the arrive, so consumers read no CSR from global memory.
// - Consumers wait on full[stage] (parity = use count & 1), and after their last wgmma reading
//   the stage completed (wgmma.wait_group 0 after P V), one lane per warp arrives on
//   empty[stage] (count 8 = all consumer warps). The producer waits on empty[stage] before
//   overwriting it. No __syncthreads in the loop; the warpgroup ping-pong is v1's (named
//   barrier 1: warpgroup 1's S GEMM after warpgroup 0's) plus its mirror (named barrier 2:
//   warpgroup 0's S GEMM of tile e after warpgroup 1's of tile e - 1), which bounds the
//   warpgroups' skew to one tile now that no CTA barrier does.
// - Every consumer warp waits on full and arrives on empty for every tile, also when it has no
//   work for the tile (rows past the end, causal diagonal after its rows): this keeps each
//   barrier phase = one tile (an idle warp cannot run ahead into the next phase).
// Register budget: 384 threads x 168 at launch (__launch_bounds__(384, 1)) = 64512; the
// producer's setmaxnreg.dec to 64 frees 128 x 104 = 13312, the consumers' inc to 216 takes
// 256 x 48 = 12288 of them (an inc that asks for more than the pool holds never returns). 56 made
// v3's Q warp spill; the consumer code needs no more than 168 without spilling, so 216 is
// headroom for ptxas.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_V2_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_V2_KERNEL_CUH_

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_kernel.cuh"

namespace attnserve {
namespace flash_sm90 {

template <int kHeadDim_, typename Elem_>
struct Sm90V2Traits {
  using Base = Sm90Traits<kHeadDim_, 128, Elem_>;
  using Elem = Elem_;
  static constexpr bool kBF16 = Base::kBF16;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlock = 128;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
  // Warps of the producer warpgroup that load (the others exit at once): tile e is loaded and
  // published by warp e % kProducerWarps.
  static constexpr int kProducerWarps = 2;
  static constexpr int kProducerRegs = 64;
  static constexpr int kConsumerRegs = 216;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWarpgroups <= 65536,
                "register file");
  static_assert((168 - kProducerRegs) * 128 >= (kConsumerRegs - 168) * 128 * kConsumerWarpgroups,
                "the consumers' setmaxnreg.inc needs what the producer's dec freed");
  static constexpr int kChunks = Base::kChunks;
  static constexpr int kTileBytes = Base::kTileBytes;
  static constexpr int kPanelBytes = Base::kPanelBytes;
  static constexpr int kStages = Base::kStages;
  // Tiles, then the barriers: full[kStages], empty[kStages], q_full (8 B each), then per stage
  // (key block, mask kind) as two int32.
  static constexpr int kBarOffset = kTileBytes * (1 + 2 * kStages);
  static constexpr int kMetaOffset = kBarOffset + 8 * (2 * kStages + 1);
  static constexpr int kSmemBytes = kMetaOffset + 8 * kStages + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
};

#if ATTNSERVE_FLASH_SM90_DEVICE

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Release (CTA scope) arrive: orders this thread's earlier generic-proxy accesses before it.
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile(
      "{\n.reg .b64 st;\n"
      "mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
      : "memory");
}
// The same arrive by lane 0 of the warp only, predicated inside the asm (no divergent branch in
// the consumer loop for ptxas to see around the wgmma pipeline). Callers are converged.
__device__ __forceinline__ void MbarArriveLane0(uint32_t bar, int lane) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 st;\n"
      "setp.eq.s32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}
// Acquire (CTA scope) wait for the phase with the given parity to complete. The retry loop is
// inside the asm (labels local to its braces): to the compiler the wait is one straight-line
// instruction, so no divergence is seen around the wgmma code that follows.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "MBAR_WAIT_RETRY:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MBAR_WAIT_RETRY;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNregInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNregDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Asks L2 to fetch `bytes` (a multiple of 16) at a 16-byte aligned global address; no data
// reaches the issuing thread and nothing waits for it.
__device__ __forceinline__ void PrefetchL2Bulk(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// One warp loads rows [row0, row0 + kRows) of a (., kHeadDim) matrix into a swizzled tile
// (rows at or past `limit` zero-filled, never read): lane = (row within a group, 16-byte chunk).
template <int kRows, int kChunks, typename Elem>
__device__ __forceinline__ void WarpLoadTile(uint32_t smem, const Elem* gbase, int64_t stride,
                                             int64_t row0, int64_t limit, int lane) {
  constexpr int kRowsPerStep = 32 / kChunks;
  const int c = lane % kChunks;
  const int r0 = lane / kChunks;
  // Few live registers (the producer runs at kProducerRegs): one running source pointer, the
  // in-bounds row count from r0; rows past it read nothing (src-size 0 zero-fills 16 bytes).
  const int64_t in_rows = limit - row0 - r0;
  const int64_t step = stride * kRowsPerStep;
  const Elem* src = gbase + (row0 + r0) * stride + c * 8;
#pragma unroll 2
  for (int r = r0; r < kRows; r += kRowsPerStep, src += step) {
    const bool in = r - r0 < in_rows;
    CpAsync16(smem + TileOffset<kRows>(r, c), in ? src : gbase, in ? 16 : 0);
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    FlashFwdSm90V2Kernel(const FlashFwdParams p) {
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
  const uint32_t bar_q = bar_full + 16 * kStages;
  int* const meta = reinterpret_cast<int*>(smem_ptr + Traits::kMetaOffset);  // [2 s], [2 s + 1]

  const int tid = static_cast<int>(threadIdx.x);
  // Warpgroup index made visibly warp-uniform (a shuffle from lane 0), so that ptxas sees the
  // role branch below as non-divergent (otherwise it serializes the consumers' wgmma: C7518).
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int64_t row =
      p.row_order != nullptr ? static_cast<int64_t>(p.row_order[blockIdx.x]) : blockIdx.x;
  const int64_t q0 = row * kBlock;
  const int64_t n = p.seqlen;
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;

  int64_t begin = 0;
  int count = 0;
  if (p.col_idx != nullptr) {
    begin = p.row_ptr[row];
    count = static_cast<int>(p.row_ptr[row + 1] - begin);
  } else {
    count = static_cast<int>(p.dense_causal ? min(row + 1, p.num_k_blocks) : p.num_k_blocks);
  }

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(bar_full + 8 * s, 32);  // every lane of the producer warp that loads the tile
      MbarInit(bar_empty + 8 * s, 4 * Traits::kConsumerWarpgroups);  // one lane per consumer warp
    }
    MbarInit(bar_q, 32);  // every lane of the Q warp (producer warp kProducerWarps)
  }
  __syncthreads();  // the last CTA-wide barrier: idle producer warps exit below

  if (warpgroup == 0) {
    // ================================ producer warpgroup ================================
    SetMaxNregDec<Traits::kProducerRegs>();
    if (warp < kProducerWarps) {
      const int head = p.head_start + static_cast<int>(blockIdx.y) * p.head_step;
      const int kv_head = head / p.kv_group;
      const int batch = static_cast<int>(blockIdx.z) / p.num_segs;
      const int seg = static_cast<int>(blockIdx.z) % p.num_segs;
      const Elem* k_base = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride +
                           seg * p.k_seg_stride + kv_head * p.k_head_stride;
      const Elem* v_base = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride +
                           seg * p.v_seg_stride + kv_head * p.v_head_stride;
      // Producer warp w loads tiles w, w + kProducerWarps, ...: each warp has one tile in
      // flight and publishes it as soon as it landed, so kProducerWarps tiles load at once and
      // no tile's publication waits for a later tile's issue or for a stage release.
      for (int e = warp; e < count; e += kProducerWarps) {
        const int stage = e % kStages;
        // The tile's CSR entry is read before the stage wait, so its latency overlaps it.
        int blk, mask;
        if (p.col_idx != nullptr) {
          blk = p.col_idx[begin + e];
          mask = p.block_mask[begin + e];
        } else {
          blk = e;
          mask = (p.dense_causal && e == row) ? 1 : 0;
        }
        // Reuse: the consumers released this stage's previous tile (e - kStages).
        if (e >= kStages) {
          MbarWait(bar_empty + 8 * stage, static_cast<uint32_t>((e / kStages + 1) & 1));
        }
        if (lane == 0) {
          meta[2 * stage] = blk;
          meta[2 * stage + 1] = mask;
        }
        const int64_t k0 = static_cast<int64_t>(blk) * kBlock;
        const uint32_t base = smem_kv + stage * kStageBytes;
        WarpLoadTile<kBlock, Traits::kChunks>(base, k_base, p.k_row_stride, k0, nk, lane);
        WarpLoadTile<kBlock, Traits::kChunks>(base + kTileBytes, v_base, p.v_row_stride, k0, nk,
                                              lane);
        CpAsyncCommit();
        // The tile landed: make this lane's generic-proxy writes visible to the async proxy
        // (wgmma), then release them (and lane 0's meta) to the consumers.
        CpAsyncWait<0>();
        FenceProxyAsyncShared();
        MbarArrive(bar_full + 8 * stage);
      }
    } else if (warp == kProducerWarps) {
      // Q warp: Q has its own warp, so its arrival does not wait behind a K/V tile's issue.
      const int head = p.head_start + static_cast<int>(blockIdx.y) * p.head_step;
      const int batch = static_cast<int>(blockIdx.z) / p.num_segs;
      const int seg = static_cast<int>(blockIdx.z) % p.num_segs;
      const Elem* q_base = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride +
                           seg * p.q_seg_stride + head * p.q_head_stride;
      WarpLoadTile<kBlock, Traits::kChunks>(smem_q, q_base, p.q_row_stride, q0, n, lane);
      CpAsyncCommit();
      CpAsyncWait<0>();
      FenceProxyAsyncShared();
      MbarArrive(bar_q);
    }
  } else {
    // ================================ consumer warpgroups ===============================
    SetMaxNregInc<Traits::kConsumerRegs>();
    const int wg = warpgroup - 1;  // query rows [64 wg, 64 wg + 64) of the tile
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int t = lane % 4;

    const int head = p.head_start + static_cast<int>(blockIdx.y) * p.head_step;
    const int batch = static_cast<int>(blockIdx.z) / p.num_segs;
    const int seg = static_cast<int>(blockIdx.z) % p.num_segs;
    const int64_t delta = p.q_pos_offset - p.k_pos_offset;

    float acc_o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};

    const int64_t wg_row0 = q0 + wg * 64;
    const int64_t my_row0 = wg_row0 + warp_in_wg * 16 + g;  // + 8 h
    const bool wg_active = wg_row0 < n;
    const uint32_t q_wg = smem_q + wg * 64 * 128;

    MbarWait(bar_q, 0);
    for (int e = 0; e < count; ++e) {
      const int stage = e % kStages;
      MbarWait(bar_full + 8 * stage, static_cast<uint32_t>((e / kStages) & 1));
      const int mask = meta[2 * stage + 1];
      const int64_t k0 = static_cast<int64_t>(meta[2 * stage]) * kBlock;
      const bool work = wg_active && k0 < nk && !(mask == 1 && k0 > wg_row0 + 63 + delta);

      const uint32_t k_tile = smem_kv + stage * kStageBytes;
      const uint32_t v_tile = k_tile + kTileBytes;

      // Ping-pong: the S GEMM issues alternate S0(e), S1(e), S0(e + 1), ... Consumer warpgroup
      // 1 waits on named barrier 1 for warpgroup 0's S issue of this tile (as v1); warpgroup 0
      // waits on named barrier 2 for warpgroup 1's S issue of the previous tile. The second
      // barrier is new in v2: without v1's per-tile __syncthreads nothing else keeps warpgroup 0
      // from running a tile ahead and arriving twice on barrier 1 (hardware barriers count
      // arrivals, not threads: that would complete a generation without warpgroup 1 and
      // deadlock it at the end). Both warpgroups sync and arrive every tile, with or without
      // work; warpgroup 1 skips the arrive of the last tile (warpgroup 0 has no sync left).
      // One `if (work)` block holds the S wgmma and its wait: no path from an issued wgmma to
      // the loop's back edge without a wait (ptxas would otherwise insert one and serialize).
      if (wg == 1) {
        NamedBarSync(1, 256);
      } else if (e > 0) {
        NamedBarSync(2, 256);
      }
      if (!work) {
        if (wg == 0) {
          NamedBarArrive(1, 256);
        } else if (e + 1 < count) {
          NamedBarArrive(2, 256);
        }
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
          const uint64_t da = MakeDesc(q_wg + koff, 16, 1024);
          const uint64_t db = MakeDesc(k_tile + koff, 16, 1024);
          Wgmma<kBlock, Traits::kBF16>::Ss(s, da, db, kk > 0 ? 1 : 0);
        }
        WgmmaCommit();
        if (wg == 0) {
          NamedBarArrive(1, 256);
        } else if (e + 1 < count) {
          NamedBarArrive(2, 256);
        }
        WgmmaWait<0>();
#pragma unroll
        for (int i = 0; i < kSRegs; ++i) FenceReg(s[i]);

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
      // This warp's wgmma reads of the stage are complete (wgmma.wait_group 0 above, executed by
      // the converged warp): hand the stage back to the producer.
      MbarArriveLane0(bar_empty + 8 * stage, lane);
    }

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
#else
  __trap();
#endif  // ATTNSERVE_FLASH_SM90_DEVICE
}

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_V2_KERNEL_CUH_
