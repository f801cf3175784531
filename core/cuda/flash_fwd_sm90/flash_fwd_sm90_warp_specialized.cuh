// flash_fwd_sm90 warp specialization: the producer and consumer pieces of the Hopper kernel
// (flash_fwd_sm90_persistent_kernel.cuh), kept apart from its grid and work-item walk so that the
// per-stage protocol reads in one place. Math, shared-memory tile layout and wgmma descriptors
// are in flash_fwd_sm90_mainloop.cuh, masking, softmax and epilogue in _mask, _softmax and
// _epilogue.cuh; here: who loads and how the stages are handed over.
// - CTA = 1 + kConsumerWarpgroups warpgroups: warpgroup 0 = producer (setmaxnreg.dec to
//   kProducerRegs; its warps 0 and 1 load K/V, warp 2 loads Q, warp 3 exits), the others
//   consumers (setmaxnreg.inc to kConsumerRegs), 64 query rows each: [0, 64) and [64, 128) of a
//   128-row item, three of a 192-row item at D = 64, or the one of a 64-row item at layout block
//   64. K/V tiles hold a layout block's keys (128 or 64), or 176 on the implicit layouts at
//   D = 128.
// - K and V of a stage have their own barriers (full / empty for K, full_v / empty_v for V): the
//   consumer is done with K(e) after S(e) but reads V(e) a tile later, under the next tile's
//   softmax (flash_fwd_sm90_consumer.cuh: ConsumeItemOverlapped).
// - cp.async producer warps (ProduceKvTile, WarpLoadTile), where TMA cannot address the tensors:
//   16-byte copies into the same swizzled layout with the same zero-fill past the key end as
//   TMA's, of each kept K/V block into the ring, tile e by warp e % 2. A
//   warp issues K and V of its tile as two copy groups, and as each lands
//   (cp.async.wait_group), runs fence.proxy.async.shared::cta in every writing lane (the writes
//   are generic-proxy, wgmma reads through the async proxy; the fence is in the writing thread,
//   before the release) and arrives on full[stage], then full_v[stage] (count 32: every lane of
//   that warp). Two warps = two tiles loading at once. Lane 0 also stores (key block, mask kind)
//   of the tile in a per-stage smem slot before the arrive, so consumers read no CSR from global
//   memory. (The TMA producer keeps the slot and the barriers; its copies complete on them.)
// - Consumers wait on full[stage] (parity = use count & 1); one lane per warp arrives on
//   empty[stage] once its S GEMM completed and on empty_v[stage] once its P V GEMM did (count
//   4 x kConsumerWarpgroups: all consumer warps). The producer waits on them before overwriting
//   a half. No __syncthreads in the loop; the warpgroups' GEMM issues go round through named
//   barriers (PingPong), which also bound their skew to one tile now that no CTA barrier does.
// - Every consumer warp waits on full and arrives on empty for every tile, also when it has no
//   work for the tile (rows past the end, causal diagonal after its rows): this keeps each
//   barrier phase = one tile (an idle warp cannot run ahead into the next phase).
// Register budget (two consumer warpgroups, 128-key tiles; the other variants' in their traits
// below): 384 threads x 168 at launch (__launch_bounds__(384, 1)) = 64512; the
// producer's setmaxnreg.dec to 64 frees 128 x 104 = 13312, the consumers' inc to 216 takes
// 256 x 48 = 12288 of them (an inc that asks for more than the pool holds never returns). 56 made
// the persistent kernel's Q warp spill; the consumer code needs no more than 168 without
// spilling, so 216 is headroom for ptxas.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_WARP_SPECIALIZED_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_WARP_SPECIALIZED_CUH_

#include <type_traits>

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_epilogue.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_mainloop.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_softmax.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_tile_scheduler.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {
namespace flash_sm90 {

// Roles, register split and tile sizes of the warp-specialized kernel. The shared-memory layout
// (kBarOffset, kMetaOffset, kSmemBytes: where the barriers and metadata sit after the tiles) is
// the kernel's own traits' (Sm90PersistentTraits), which MakeWarpSpecializedSmem reads.
// kConsumerWarpgroups_: 2 (query items of 128 rows = the layout block: every layout) or 3 (items
// of 192 rows, D = 64 and the implicit dense / causal layouts only: Sm90QueryTile in
// cuda_options.h). With three, the launch holds 512 threads at 128 registers; the producer drops
// to 32 and the consumers rise to 160 (the (64, 128) S, (64, 64) O and the pending P fit).
// kBlockN_: key rows of a K / V tile. 128 = the layout block (every layout: one tile = one CSR
// entry). 176 (D = 128, two consumer warpgroups, the implicit dense and causal layouts only:
// Sm90KeyTile in cuda_options.h): a tile holds 1.375 layout blocks' keys, so the per-tile work
// around the GEMMs (barriers, row max exchange, O rescale) is spread over more GEMM time. Its
// (64, 176) S, the pending P (44 registers) and O (64) need more registers than 216: the
// producer drops to 40 (TMA only, no cp.async warps), the consumers rise to 232; and two K/V
// stages fit (Q 32 KB + 2 x 88 KB).
// kConsumerWarpgroups_ 1 with kBlockN_ 64: layout block 64 (64-row items, 64-key tiles, one
// consumer warpgroup); two CTAs share an SM (256 threads at 128 registers each, producer 64 /
// consumer 192, two stages: Q 16 KB + 2 x 32 KB at D = 128), so that one CTA's softmax runs
// under the other's GEMMs, as the two consumer warpgroups of one CTA do at block 128.
template <int kHeadDim_, typename Elem_, int kConsumerWarpgroups_ = 2, int kBlockN_ = 128>
struct Sm90WarpSpecializedTraits {
  using Elem = Elem_;
  static constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static constexpr int kBlock = kBlockN_;  // key rows of a K / V tile
  static constexpr int kLayoutBlock = kBlock == 64 ? 64 : 128;  // the layouts it runs
  static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
  static_assert((kConsumerWarpgroups == 1) == (kBlock == 64), "one consumer at block 64");
  static_assert(kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 3, "one to three consumers");
  static_assert(kBlock != 176 || (kHeadDim == 128 && kConsumerWarpgroups == 2),
                "176-key tiles at D = 128 with two consumer warpgroups only");
  static constexpr int kBlockM = 64 * kConsumerWarpgroups;  // query rows of a work item
  // Query rows of a work item and key rows of a tile for the tile scheduler (0: the layout
  // block).
  static constexpr int kItemRows = kBlockM == kLayoutBlock ? 0 : kBlockM;
  static constexpr int kTileKeys = kBlock == kLayoutBlock ? 0 : kBlock;
  // Variants that run the implicit dense / causal layouts only (no CSR): 192-row items, 176-key
  // tiles.
  static constexpr bool kImplicitOnly = kItemRows != 0 || kTileKeys != 0;
  static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kCtasPerSm = kConsumerWarpgroups == 1 ? 2 : 1;  // __launch_bounds__
  // Warps of the producer warpgroup that load K/V by cp.async (the next one loads Q, the last
  // exits at once): tile G is loaded and published by warp G % kProducerWarps.
  static constexpr int kProducerWarps = 2;
  static constexpr int kLaunchRegs = (65536 / (kNThreads * kCtasPerSm)) / 8 * 8;
  static constexpr int kProducerRegs = kConsumerWarpgroups == 3 ? 32 : (kBlock == 176 ? 40 : 64);
  static constexpr int kConsumerRegs =
      kConsumerWarpgroups == 3 ? 160 : (kBlock == 128 ? 216 : (kBlock == 176 ? 232 : 192));
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWarpgroups <=
                    65536 / kCtasPerSm,
                "register file");
  static_assert((kLaunchRegs - kProducerRegs) * 128 >=
                    (kConsumerRegs - kLaunchRegs) * 128 * kConsumerWarpgroups,
                "the consumers' setmaxnreg.inc needs what the producer's dec freed");
  static constexpr int kChunks = kHeadDim / 8;              // 16-byte chunks per tile row
  static constexpr int kTileBytes = kBlock * kHeadDim * 2;  // one K or V tile
  static constexpr int kQTileBytes = kBlockM * kHeadDim * 2;
  static constexpr int kPanelBytes = kBlock * 128;    // a 64-column panel of a K / V tile
  static constexpr int kQPanelBytes = kBlockM * 128;  // and of the Q tile
  // Three stages (two tiles in flight behind the math; a CSR gather has no locality to hide
  // latency otherwise): Q 32 KB + 3 x (K + V) 64 KB at D = 128. Two with 176-key tiles, and at
  // block 64 (two CTAs per SM: four tiles in flight per SM; three stages would need 152 bytes
  // more than two CTAs may have).
  static constexpr int kStages = kBlock == 128 ? 3 : 2;
  // The ring as K slots, V slots and Q buffers. Uniform (all but the D = 128 CSR variants): kStages
  // stages of K then V, one Q tile. The split ring (D = 128, 128-key tiles, two consumer
  // warpgroups: every CSR layout at D = 128) trades a K slot for a second Q buffer in the same
  // 224 KB: two K slots, three V slots, two Q tiles, so that an item's Q rows load while the
  // previous item still runs instead of in the gap between them. K(e + 2) then loads once S(e)
  // completed (~1.9 tiles ahead of its use), V keeps three slots: with V limited to two tiles in
  // flight 99% skipped had run 3.7-4.9% slower, with K limited to two 0.3-0.4% (H200,
  // bench/results/h200x2-2026-11-28-kernel11/stages/k3v2 and h200-2026-11-28-kernel12/k2).
  static constexpr bool kSplitRing = kHeadDim == 128 && kBlock == 128 && kConsumerWarpgroups == 2;
  static constexpr int kKStages = kSplitRing ? 2 : kStages;
  static constexpr int kVStages = kStages;
  static constexpr int kQBufs = kSplitRing ? 2 : 1;
  // Tile addresses from the ring base (after the Q buffers): K slot s at s * kKStride, V slot s
  // at kVOffset + s * kVStride (uniform: K and V of a stage side by side).
  static constexpr int kKStride = kSplitRing ? kTileBytes : 2 * kTileBytes;
  static constexpr int kVStride = kKStride;
  static constexpr int kVOffset = kSplitRing ? kKStages * kTileBytes : kTileBytes;
  static constexpr int kRingBytes = (kKStages + kVStages) * kTileBytes;
};

#if ATTNSERVE_FLASH_SM90_DEVICE

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

// Shared memory of the warp-specialized kernel (shared-window addresses, at the offsets of its
// Traits): the tiles, then the mbarriers, then the per-stage tile metadata. The persistent kernel
// finds its Q barriers (QFullBar / QEmptyBar), its item metadata and the split V barriers from
// these.
struct WarpSpecializedSmem {
  uint32_t q;          // Q buffer b: (kBlockM, kHeadDim) tile at q + b kQTileBytes
  uint32_t kv;         // the ring: (kBlock, kHeadDim) K slot s at kv + s kKStride, V slot s at
                       // kv + kVOffset + s kVStride (Traits)
  uint32_t bar_full;   // + 8 s: K slot s landed (count 32: the lanes of the warp that loaded it;
                       // 1 with TMA: the issuing lane's arrive.expect_tx)
  uint32_t bar_empty;  // + 8 s: K slot s released (one lane per consumer warp)
  uint32_t bar_q;      // Q barriers (QFullBar, QEmptyBar)
  int* meta;           // [2 s], [2 s + 1]: key block and mask kind of the tile in K slot s
};
template <typename Traits>
__device__ __forceinline__ WarpSpecializedSmem MakeWarpSpecializedSmem(unsigned char* smem_raw) {
  const uint32_t smem_raw_addr = SmemAddr(smem_raw);
  // 1024-byte alignment of every tile (the 128-byte swizzle atom); kSmemBytes reserves the slack.
  const uint32_t smem_base = (smem_raw_addr + 1023u) & ~1023u;
  // Generic pointer to smem_base: 1024-byte aligned like its shared-window address (the window
  // is aligned beyond that); telling the compiler lets it pair the metadata words into 8-byte
  // accesses.
  unsigned char* const smem_ptr = static_cast<unsigned char*>(
      __builtin_assume_aligned(smem_raw + (smem_base - smem_raw_addr), 1024));
  WarpSpecializedSmem sm;
  sm.q = smem_base;
  sm.kv = smem_base + Traits::kQBufs * Traits::kQTileBytes;
  sm.bar_full = smem_base + Traits::kBarOffset;
  sm.bar_empty = sm.bar_full + 8 * Traits::kKStages;
  sm.bar_q = sm.bar_full + 16 * Traits::kKStages;
  sm.meta = reinterpret_cast<int*>(smem_ptr + Traits::kMetaOffset);
  return sm;
}

// Consumer warpgroup h's Q barriers of Q buffer b: q_full[b][h] (its rows landed) and
// q_empty[b][h] (released), after the K slots' full and empty barriers.
template <typename Traits>
__device__ __forceinline__ uint32_t QFullBar(const WarpSpecializedSmem& sm, int b, int h) {
  return sm.bar_q + 8 * (b * Traits::kConsumerWarpgroups + h);
}
template <typename Traits>
__device__ __forceinline__ uint32_t QEmptyBar(const WarpSpecializedSmem& sm, int b, int h) {
  return sm.bar_q + 8 * ((Traits::kQBufs + b) * Traits::kConsumerWarpgroups + h);
}

// Where tile G of the CTA's tile sequence (tiles of its earlier items + e) goes: K slot
// G % kKStages, use G / kKStages of it (counted from 0), V slot G % kVStages, use G / kVStages.
template <typename Traits>
struct RingSlots {
  int k_slot, v_slot;
  uint32_t k_use, v_use;
  __device__ __forceinline__ explicit RingSlots(uint32_t g)
      : k_slot(static_cast<int>(g % Traits::kKStages)),
        v_slot(static_cast<int>(g % Traits::kVStages)),
        k_use(g / Traits::kKStages),
        v_use(g / Traits::kVStages) {}
  // Wait until the consumers released the slot's previous use (parity (use - 1) & 1; the first
  // use of a slot waits for nothing): bar_empty is empty[0] (K) or empty_v[0] (V).
  __device__ __forceinline__ void WaitKFree(uint32_t bar_empty) const {
    if (k_use > 0) MbarWait(bar_empty + 8 * k_slot, (k_use + 1) & 1u);
  }
  __device__ __forceinline__ void WaitVFree(uint32_t bar_empty_v) const {
    if (v_use > 0) MbarWait(bar_empty_v + 8 * v_slot, (v_use + 1) & 1u);
  }
};

// cp.async producer K/V warp: tile e of row `row` (tile `gi` of the CTA's sequence: RingSlots)
// into the ring. Its CSR entry is read before the slot wait, so its latency overlaps it; the
// consumers released the K slot's previous use before K is overwritten, and the V slot's before
// V is. The warp waits for its own copies, K's group first, makes them visible to the async
// proxy (wgmma) in every writing lane, and releases K and lane 0's metadata with its
// full[K slot] arrive, V with full_v[V slot].
template <typename Traits>
__device__ __forceinline__ void ProduceKvTile(const FlashFwdParams& p,
                                              const WarpSpecializedSmem& sm, uint32_t bar_full_v,
                                              uint32_t bar_empty_v, int row, int64_t begin, int e,
                                              uint32_t gi, const typename Traits::Elem* k_base,
                                              const typename Traits::Elem* v_base, int64_t nk,
                                              int lane) {
  constexpr int kBlock = Traits::kBlock;
  int mask;
  const int blk = TileKeyBlock<Traits::kItemRows, Traits::kTileKeys>(p, row, begin, e, mask);
  const RingSlots<Traits> r(gi);
  r.WaitKFree(sm.bar_empty);
  if (lane == 0) {
    sm.meta[2 * r.k_slot] = blk;
    sm.meta[2 * r.k_slot + 1] = mask;
  }
  const int64_t k0 = static_cast<int64_t>(blk) * kBlock;
  const uint32_t k_tile = sm.kv + r.k_slot * Traits::kKStride;
  const uint32_t v_tile = sm.kv + Traits::kVOffset + r.v_slot * Traits::kVStride;
  WarpLoadTile<kBlock, Traits::kChunks>(k_tile, k_base, p.k_row_stride, k0, nk, lane);
  CpAsyncCommit();
  r.WaitVFree(bar_empty_v);
  WarpLoadTile<kBlock, Traits::kChunks>(v_tile, v_base, p.v_row_stride, k0, nk, lane);
  CpAsyncCommit();
  CpAsyncWait<1>();  // K landed
  FenceProxyAsyncShared();
  MbarArrive(sm.bar_full + 8 * r.k_slot);
  CpAsyncWait<0>();  // V landed
  FenceProxyAsyncShared();
  MbarArrive(bar_full_v + 8 * r.v_slot);
}

// Ping-pong between the kWgs consumer warpgroups of the warp-specialized kernel: the S GEMM
// issues go round, S0(e), S1(e), ..., S(kWgs-1)(e), S0(e + 1), ... Warpgroup w > 0 waits on named
// barrier w for warpgroup w - 1's S issue of this tile; warpgroup 0 waits on named barrier kWgs
// for the last warpgroup's S issue of the previous tile. That last barrier bounds the
// warpgroups' skew (there is no per-tile __syncthreads): without it warpgroup 0 could run a tile
// ahead and arrive twice on barrier 1 (hardware barriers count arrivals, not threads: that
// completes a generation without warpgroup 1 and deadlocks it at the end). Every warpgroup syncs
// and arrives every tile, with or without work, in one sequence over the CTA's tiles (items
// included). The last warpgroup arrives on barrier kWgs once before its first tile (Start), so
// that warpgroup 0's first sync needs no exception, and its arrive after the CTA's last tile is
// left unmatched at exit (as FlashAttention-3's scheduler barriers do): the barrier ids are
// computed once and the per-tile path holds one bar.sync before the GEMM issue and one
// bar.arrive after it, no branch. `wg` is warp-uniform (shuffled).
template <int kWgs>
struct PingPong {
  int sync_id;    // the barrier this warpgroup waits on before its S GEMM
  int arrive_id;  // the barrier it arrives on after its GEMM issue
  __device__ __forceinline__ explicit PingPong(int wg)
      : sync_id(wg > 0 ? wg : kWgs), arrive_id(wg + 1 < kWgs ? wg + 1 : kWgs) {
    asm volatile("" : "+r"(sync_id), "+r"(arrive_id));  // kept, not recomputed per tile
  }
  // The last warpgroup (the one arriving on barrier kWgs) arrives once up front.
  __device__ __forceinline__ void Start() const {
    if constexpr (kWgs > 1) {
      if (arrive_id == kWgs) NamedBarArrive(arrive_id, 256);
    }
  }
  __device__ __forceinline__ void BeforeScores() const {
    if constexpr (kWgs > 1) NamedBarSync(sync_id, 256);
  }
  __device__ __forceinline__ void AfterScores() const {
    if constexpr (kWgs > 1) NamedBarArrive(arrive_id, 256);
  }
};

// Where a consumer warpgroup of the warp-specialized kernel stands in the current row (work
// item).
struct ConsumerRow {
  int64_t wg_row0;     // its first query row
  bool active;         // any of its rows before the query end (warpgroup-uniform)
  int first_masked;    // implicit layouts: ImplicitFirstMaskedTile of the item
};

// Where the consumer stands in the K/V ring: the stage of its next tile and that stage's
// full-barrier parity. Advanced by one per tile, across items (the CTA's tile sequence G: stage
// G % kStages, parity (G / kStages) & 1), so the loop head holds no division by kStages (three
// stages: a multiply-high, shifts and a multiply-subtract before the full-barrier wait).
template <int kStages>
struct RingPos {
  int stage = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void Advance() {
    const bool wrap = stage + 1 == kStages;
    stage = wrap ? 0 : stage + 1;
    parity ^= wrap ? 1u : 0u;
  }
};

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_WARP_SPECIALIZED_CUH_
