// flash_fwd_sm90: block-sparse attention forward for Hopper (sm_90a) with warpgroup MMA (wgmma),
// the one Hopper prefill kernel (reported as "sm90v3").
//
// Same contract and semantics as flash_fwd/flash_fwd_kernel.cuh (FlashFwdParams): a work item =
// one query block row of the layout (64 or 128 query rows; 192 at D = 64 on the implicit
// layouts) for one (batch * segment, head); it walks the row's kept key tiles (CSR col_idx or the
// implicit dense / causal row), applies each tile's mask kind (0 full, 1 causal diagonal, 2
// partial = TokenRule on global positions) and the ragged-end bounds, keeps an exp2 online
// softmax in f32, and writes O (input dtype) + LSE (natural log), or LSE-merges into an f32 O in
// accumulate mode. Rows with no admissible key: O = 0, LSE = -inf (accumulate: untouched).
//
// Warp-specialized (producer and consumer warpgroups: roles, register split and the per-stage
// protocol are in flash_fwd_sm90_warp_specialized.cuh) on a persistent grid; one consumer body,
// ConsumeItemOverlapped below, for TMA and cp.async loads alike. The variants are type
// combinations of Sm90PersistentTraits (consumer warpgroups x key rows per tile): layout block
// 128 with two consumers (every layout), block 64 with one (two CTAs per SM), 192-row items with
// three at D = 64 and 176-key tiles at D = 128 (implicit layouts); flash_fwd_sm90.cc picks one.
// (A one-CTA-per-tile kernel, which every thread loaded for, ran layout block 64 until the
// persistent kernel took it over 18-22% faster: bench/results/h200x2-2026-11-27-kernel4/ab-b64.)
// What the persistent grid adds:
// - Grid = min(#SMs x CTAs per SM, #work items), one CTA per SM (two at block 64). A work item
//   is (query-block row, head, batch * seg); CTA b runs one item of each round of gridDim.x
//   items, dealt back and forth (CtaItem).
//   Item order (kernel argument `head_group`, chosen by the launcher; DecodeItem): the (head,
//   batch * seg) pairs are cut into groups of head_group; a group's items come before the next
//   group's, position slowest inside a group, so the heavy-first walk (the implicit causal layout
//   from its last row down, or row_order) orders each group's items, and the CTAs running at one
//   time read the K/V of one group's heads, which the launcher sizes to stay in L2. head_group =
//   all pairs is position-major, 1 is head-major. (Measured on an H200, dense D = 128, 16 heads:
//   head-major against position-major +5% at N = 16384 and +14% at N = 65536 non-causal, +9% at
//   65536 causal, but -29% at 16384 causal, where one head's 128 rows heavy-first over 132 CTAs
//   leave a tail, and groups of 3 heads still -10% there; bench/results/h200-2026-11-25-kernel/
//   order/.)
// - The K/V ring continues across items: every tile of the CTA has a global index G (tiles of
//   earlier items of this CTA + e); stage = G % kStages, full/empty parity from G / kStages, and
//   producer warp G % kProducerWarps loads it. No barrier is ever re-initialised.
// - Q is single-buffered (smem: Q + 3 K/V stages = 7 x 32 KB at D = 128 already fills the
//   227 KB; a second Q tile would cost a K/V stage, and at 99% sparsity a row has ~5 tiles, so a
//   2-stage ring would expose the load latency on every tile), but per consumer warpgroup: Q has
//   its own producer warp (warp 2 of the producer warpgroup; warps 0 and 1 load K/V only and
//   never wait for Q), and each consumer warpgroup h has its own 64 Q rows, metadata slot and
//   pair of barriers: q_full[h] (count 1 with TMA: the Q warp's arrive.expect_tx; 32 with
//   cp.async) and q_empty[h] (count 4: one lane per warp of warpgroup h). A consumer warp arrives
//   on its q_empty as soon as its S wgmma of the item's LAST tile completed (wgmma.wait_group
//   after the S GEMM; or at once for an item with no tile). The Q warp waits on q_empty[h] of
//   item j - 1, publishes h's metadata, loads h's rows of item j (one TMA box per panel) and
//   arms q_full[h], for h = 0, 1, ...; then prefetches item j + 1's Q rows into L2
//   (cp.async.bulk.prefetch.L2): a warpgroup's next Q loads from L2 while it runs its last
//   softmax, and it starts the next item without waiting for the other warpgroup to finish the
//   current one. (Measured on an H200, h200x2-2026-11-28-kernel5/
//   ab-qwg, medians of seven interleaved reps against one Q barrier pair for the whole tile:
//   random 90% skipped 0.962x, local_window 90% 0.986x, 99% and dense level. The 90% cases run
//   at the power cap and land in two groups ~10% apart, so the gain is inside their spread; it
//   stays as the simpler protocol for the warpgroups, not as a proven speed-up. Before Q had its
//   own warp, with Q loaded by K/V warp 0, the consumers spent ~18% of their stall samples
//   waiting for Q at 99% skipped.)
//   The cp.async fallback loads the whole tile once every warpgroup released it and arrives on
//   every q_full[h].
//   Consumers wait on q_full[h] (parity = local item count & 1) for EVERY item, also an empty
//   one, so a phase is never skipped (a parity wait on a skipped phase would return at once).
// - Ping-pong named barriers (PingPong) run on across items, as one sequence over the CTA's
//   tiles: warpgroup 0 syncs barrier kWgs before every S GEMM (the last warpgroup arrives on it
//   once at the start, then after every S GEMM; its last arrive stays unmatched at exit). So
//   warpgroup 0 starts item j + 1 right after the last warpgroup issued its last S GEMM of item j,
//   and no warpgroup can arrive twice on a barrier before its partner synced (which would
//   complete a generation without the partner).
// - Item metadata (query-block row, kept-tile count, head index, z) is published by the Q warp
//   (lane 0) in warpgroup h's smem slot with h's Q rows (written after q_empty[h] of the previous
//   item, released by the q_full[h] arrive): the consumers read it right after the q_full wait,
//   so they do no dependent global loads (row_order, row_ptr) on their critical path between
//   items.
// - The consumers' software pipeline runs on across items: an item's last P V GEMM is issued with
//   the next item's first S GEMM, and its epilogue (flash_fwd_sm90_epilogue.cuh, straight from
//   registers to global memory) runs after that tile's softmax (ConsumerCarry). Softmax
//   statistics are per item; O is zeroed once its item is written.
// The former one-CTA-per-tile schedule with these roles (no item walk) was removed: on an H200
// this kernel was equal to it dense, 2-3% faster at 90% of block pairs skipped and 19-20% faster
// at 99% (bench/results/h200-2026-11-22c; core/cuda/NOTES.md).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_PERSISTENT_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_PERSISTENT_KERNEL_CUH_

#include <climits>
#include <type_traits>

#include <cuda.h>  // CUtensorMap (a plain struct; nothing of the driver library is linked)

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_warp_specialized.cuh"

namespace attnserve {
namespace flash_sm90 {

template <int kHeadDim_, typename Elem_, int kConsumerWarpgroups_ = 2, int kBlockN_ = 128>
struct Sm90PersistentTraits
    : Sm90WarpSpecializedTraits<kHeadDim_, Elem_, kConsumerWarpgroups_, kBlockN_> {
  using Roles = Sm90WarpSpecializedTraits<kHeadDim_, Elem_, kConsumerWarpgroups_, kBlockN_>;
  // Tiles, then the barriers: full[kStages], empty[kStages], q_full[kConsumerWarpgroups],
  // q_empty[kConsumerWarpgroups] (8 B each), then per stage (key block, mask kind) as two int32,
  // then per consumer warpgroup the item's (row, count, y, z).
  static constexpr int kBarOffset = Roles::kQTileBytes + Roles::kTileBytes * 2 * Roles::kStages;
  static constexpr int kMetaOffset =
      kBarOffset + 8 * (2 * Roles::kStages + 2 * Roles::kConsumerWarpgroups);
  static constexpr int kItemMetaOffset = kMetaOffset + 8 * Roles::kStages;
  // The V halves' barriers: full_v[kStages], empty_v[kStages] (full and empty above guard the K
  // halves of the stages only).
  static constexpr int kVBarOffset = kItemMetaOffset + 16 * Roles::kConsumerWarpgroups;
  static constexpr int kSmemBytes = kVBarOffset + 16 * Roles::kStages + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
};

#if ATTNSERVE_FLASH_SM90_DEVICE

// Consumer warpgroup h's Q barriers: q_full[h] (its rows landed) and q_empty[h] (released), after
// the K/V stages' full and empty barriers.
template <typename Traits>
__device__ __forceinline__ uint32_t QFullBar(const WarpSpecializedSmem& sm, int h) {
  return sm.bar_q + 8 * h;
}
template <typename Traits>
__device__ __forceinline__ uint32_t QEmptyBar(const WarpSpecializedSmem& sm, int h) {
  return sm.bar_q + 8 * (Traits::kConsumerWarpgroups + h);
}

// K/V warp `warp` (< kProducerWarps): the kept tiles of the CTA's items into the ring; it never
// waits for Q. Tile G of the CTA's tile sequence (tiles of its earlier items + e) goes to stage
// G % kStages, use G / kStages of that stage, loaded by warp G % kProducerWarps.
template <typename Traits>
__device__ __forceinline__ void ProducePersistentKv(const FlashFwdParams& p,
                                                    const WarpSpecializedSmem& sm,
                                                    uint32_t bar_full_v, uint32_t bar_empty_v,
                                                    int num_items, int head_group, int64_t nk,
                                                    int warp, int lane) {
  using Elem = typename Traits::Elem;
  constexpr int kProducerWarps = Traits::kProducerWarps;
  const int hz = p.num_heads * (p.batch * p.num_segs);
  uint32_t g = 0;  // global index of the item's first tile in this CTA's tile sequence
  for (int r = 0, item = CtaItem(0); item < num_items; item = CtaItem(++r)) {
    const WorkItem w =
        DecodeWorkItem<Traits::kItemRows, Traits::kTileKeys>(p, item, hz, head_group);
    const Elem* k_base;
    const Elem* v_base;
    KvBase<Elem>(p, w.y, w.z, k_base, v_base);
    // This warp's tiles of the item: global index G = g + e with G % kProducerWarps == warp.
    const int e0 = static_cast<int>(
        (static_cast<uint32_t>(warp) + kProducerWarps - g % kProducerWarps) % kProducerWarps);
    for (int e = e0; e < w.count; e += kProducerWarps) {
      const uint32_t gi = g + static_cast<uint32_t>(e);
      ProduceKvTile<Traits>(p, sm, bar_full_v, bar_empty_v, w.row, w.begin, e,
                            static_cast<int>(gi % Traits::kStages), gi / Traits::kStages, k_base,
                            v_base, nk, lane);
    }
    g += static_cast<uint32_t>(w.count);
  }
}

// K/V by TMA (one lane of producer warp 0 for every tile of the CTA's items): per tile, wait
// for the stage to be free, publish (key block, mask kind) in the stage slot, arm full[stage]
// with the tile's bytes (one arrival: full counts 1 in this mode) and issue one box per 64-column
// panel of K and of V. The copies complete on the barrier themselves: the producer neither waits
// for them nor fences, so every free stage has a tile in flight (cp.async producers wait for
// their own copies before they publish, one tile per warp). Rows past the key end are
// zero-filled by the TMA unit (the map's row extent is the key count).
// K and V of a stage have their own barriers (K: full/empty, V: full_v/empty_v), since the
// consumer is done with K(e) after S(e) but reads V(e) a tile later; K of a stage can then
// reload while its V is still being read.
template <typename Traits>
__device__ __forceinline__ void ProducePersistentKvTma(const FlashFwdParams& p,
                                                       const WarpSpecializedSmem& sm,
                                                       uint32_t bar_full_v, uint32_t bar_empty_v,
                                                       int num_items, int head_group,
                                                       const CUtensorMap* tma_k,
                                                       const CUtensorMap* tma_v, int lane) {
  constexpr int kBlock = Traits::kBlock;
  constexpr int kPanels = Traits::kHeadDim / 64;
  const int hz = p.num_heads * (p.batch * p.num_segs);
  if (lane == 0) {
    PrefetchTensorMap(tma_k);
    PrefetchTensorMap(tma_v);
  }
  uint32_t g = 0;  // global index of the item's first tile in this CTA's tile sequence
  for (int r = 0, item = CtaItem(0); item < num_items; item = CtaItem(++r)) {
    const WorkItem w =
        DecodeWorkItem<Traits::kItemRows, Traits::kTileKeys>(p, item, hz, head_group);
    const int kv_head = (p.head_start + w.y * p.head_step) / p.kv_group;
    const int batch = w.z / p.num_segs;
    const int seg = w.z % p.num_segs;
    if (lane == 0) {
      for (int e = 0; e < w.count; ++e) {
        const uint32_t gi = g + static_cast<uint32_t>(e);
        const int stage = static_cast<int>(gi % Traits::kStages);
        const uint32_t use = gi / Traits::kStages;
        int mask;
        const int blk =
            TileKeyBlock<Traits::kItemRows, Traits::kTileKeys>(p, w.row, w.begin, e, mask);
        if (use > 0) MbarWait(sm.bar_empty + 8 * stage, (use + 1) & 1u);
        sm.meta[2 * stage] = blk;
        sm.meta[2 * stage + 1] = mask;
        const uint32_t bar = sm.bar_full + 8 * stage;
        const uint32_t k_tile = sm.kv + stage * 2u * Traits::kTileBytes;
        const int k0 = blk * kBlock;
        MbarArriveExpectTx(bar, Traits::kTileBytes);
#pragma unroll
        for (int panel = 0; panel < kPanels; ++panel) {
          TmaLoad5d(k_tile + panel * Traits::kPanelBytes, tma_k, bar, panel * 64, k0, kv_head, seg,
                    batch);
        }
        if (use > 0) MbarWait(bar_empty_v + 8 * stage, (use + 1) & 1u);
        const uint32_t bar_v = bar_full_v + 8 * stage;
        MbarArriveExpectTx(bar_v, Traits::kTileBytes);
#pragma unroll
        for (int panel = 0; panel < kPanels; ++panel) {
          TmaLoad5d(k_tile + Traits::kTileBytes + panel * Traits::kPanelBytes, tma_v, bar_v,
                    panel * 64, k0, kv_head, seg, batch);
        }
      }
    }
    g += static_cast<uint32_t>(w.count);
  }
  __syncwarp();
}

// Q warp: each item's Q and its metadata (row, count, y, z; released with Q by the q_full
// arrive, so the consumers do no dependent global loads between items), per consumer warpgroup:
// warpgroup h's 64 rows and metadata slot are reloaded as soon as h released the previous item's
// (q_empty[h]), so a warpgroup that finished its item starts the next one while the other still
// runs its last tiles; then the next item's Q rows are prefetched into L2, a whole item ahead of
// their load.
// kTma: lane 0 arms q_full[h] with the rows' bytes (q_full counts 1 then) and issues one TMA box
// (64 rows) per 64-column panel (rows past the query end zero-filled); otherwise every lane loads
// the whole tile by cp.async once every warpgroup released it, waits, fences and arrives on every
// q_full[h] (count 32).
template <typename Traits, bool kTma>
__device__ __forceinline__ void ProducePersistentQ(const FlashFwdParams& p,
                                                   const WarpSpecializedSmem& sm, int* item_meta,
                                                   int num_items, int head_group,
                                                   const CUtensorMap* tma_q, int lane) {
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM;  // query rows of an item
  constexpr int kWgs = Traits::kConsumerWarpgroups;
  const int64_t n = p.seqlen;
  const int hz = p.num_heads * (p.batch * p.num_segs);
  uint32_t local = 0;  // items of this CTA so far (the round of CtaItem)
  for (int item = CtaItem(0); item < num_items; item = CtaItem(static_cast<int>(++local))) {
    const WorkItem w =
        DecodeWorkItem<Traits::kItemRows, Traits::kTileKeys>(p, item, hz, head_group);
    auto publish = [&](int h) {  // warpgroup h's metadata slot
      item_meta[4 * h + 0] = w.row;
      item_meta[4 * h + 1] = w.count;
      item_meta[4 * h + 2] = w.y;
      item_meta[4 * h + 3] = w.z;
    };
    if constexpr (kTma) {
      if (lane == 0) {  // the metadata is released to warpgroup h by this lane's arrive
        const int head = p.head_start + w.y * p.head_step;
#pragma unroll
        for (int h = 0; h < kWgs; ++h) {
          // Warpgroup h's rows of the previous item: its every warp issued and completed its
          // last S GEMM.
          if (local > 0) MbarWait(QEmptyBar<Traits>(sm, h), (local - 1) & 1u);
          publish(h);
          MbarArriveExpectTx(QFullBar<Traits>(sm, h), Traits::kQTileBytes / kWgs);
#pragma unroll
          for (int panel = 0; panel < Traits::kHeadDim / 64; ++panel) {
            TmaLoad5d(sm.q + panel * Traits::kQPanelBytes + h * 64 * 128, tma_q,
                      QFullBar<Traits>(sm, h), panel * 64, w.row * kBlockM + h * 64, head,
                      w.z % p.num_segs, w.z / p.num_segs);
          }
        }
      }
      __syncwarp();
    } else {
      if (local > 0) {
#pragma unroll
        for (int h = 0; h < kWgs; ++h) MbarWait(QEmptyBar<Traits>(sm, h), (local - 1) & 1u);
      }
      const Elem* q_base = QBase<Elem>(p, w.y, w.z);
      WarpLoadTile<kBlockM, Traits::kChunks>(sm.q, q_base, p.q_row_stride,
                                             static_cast<int64_t>(w.row) * kBlockM, n, lane);
      CpAsyncCommit();
      if (lane == 0) {  // released to the consumers by this lane's q_full arrives
#pragma unroll
        for (int h = 0; h < kWgs; ++h) publish(h);
      }
      CpAsyncWait<0>();
      FenceProxyAsyncShared();
#pragma unroll
      for (int h = 0; h < kWgs; ++h) MbarArrive(QFullBar<Traits>(sm, h));
    }
    const int next = CtaItem(static_cast<int>(local) + 1);
    if (next < num_items) {
      int row, y, z;  // the next item's (its tile range is not needed for the prefetch)
      DecodeItem<Traits::kItemRows>(p, next, hz, head_group, row, y, z);
      const Elem* qn = QBase<Elem>(p, y, z);
      const int64_t r0 = static_cast<int64_t>(row) * kBlockM + lane;
      const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), n - r0));
      const Elem* qp = qn + r0 * p.q_row_stride;
#pragma unroll 1
      for (int r = 0; r < rows; r += 32, qp += 32 * p.q_row_stride) {
        PrefetchL2Bulk(qp, Traits::kHeadDim * sizeof(Elem));
      }
    }
  }
}

// What a consumer warpgroup carries from one work item into the next: the P V GEMM of the item's
// last tile (its P, and the stage of its V) is issued with the next item's first S GEMM, and the
// item's epilogue runs once that GEMM completed, after the first tile's softmax, under the other
// warpgroups' GEMMs, instead of between the items with this warpgroup's GEMMs stopped. (Measured
// on an H200, seven interleaved reps, bench/results/h200x2-2026-11-28-kernel6/ab-xitem: 99% of
// block pairs skipped, ~5 tiles per item, 1.9% (random) and 3.8% (local_window) faster; dense,
// causal, D = 64 and 90% level within their spread.)
template <typename Traits>
struct ConsumerCarry {
  uint32_t pa[Traits::kBlock / 16][4];  // P of the pending tile, m64k16 A fragments
  bool pending = false;   // a P V GEMM is owed for stage `stage` (warpgroup-uniform)
  int stage = 0;
  uint32_t parity = 0;
  bool owed = false;      // the previous item's epilogue is owed (warpgroup-uniform)
  int row = 0, y = 0, z = 0;  // the previous item: its query-block row, head and z
  OnlineSoftmax<Traits::kBlock, Traits::kHeadDim> softmax;  // and its statistics
};

// The item's tiles with the softmax of tile e overlapped with the P V GEMM of tile e - 1 inside
// the warpgroup. Per tile: S(e) and P(e-1) V(e-1) are issued back to back inside the ping-pong
// window (IssueScoresAndPV); S(e) is waited for first (the older group), K(e) goes back to the
// producer, S(e) is masked and turned into P(e) while the P V GEMM still runs; then that GEMM is
// waited for, V(e-1) goes back, and O is rescaled by tile e's factor (O_e = alpha_e (O_(e-1) +
// P_(e-1) V_(e-1)): the rescale must follow the GEMM that accumulates into O). At tile 0 the
// pending GEMM is the previous item's last (ConsumerCarry): once it completed, `finish_prev`
// writes that item's output and zeroes O for this item. The item's own last P V stays pending
// for the next item (or for the end of ConsumePersistent). Tile 0 is a compile-time variant of
// the tile (consume_tile's kFirst) outside the loop, so the loop holds no epilogue. K and V have
// separate barriers (full / empty for K, full_v / empty_v for V): V(e) is read a tile after
// K(e), and a shared stage barrier would hold K's half idle for that tile (measured: with one
// barrier per stage the overlap was 4-30% slower, bench/results/h200-2026-11-25-kernel/). P(e-1)
// (kBlock / 4 registers) is live next to S(e) and O.
// on_scores(arrive_lane) runs after every S wait with the lane that should arrive (the
// persistent kernel's q_empty release on the item's last tile, lane 1 = no arrive otherwise: a
// C++ branch on "last" in the loop would make ptxas serialize the wgmma).
template <typename Traits, typename OnScores, typename FinishPrev>
__device__ __forceinline__ void ConsumeItemOverlapped(
    const FlashFwdParams& p, const WarpSpecializedSmem& sm, uint32_t bar_full_v,
    uint32_t bar_empty_v, uint32_t gbase, int count,
    const PingPong<Traits::kConsumerWarpgroups>& pp, int lane, const ConsumerRow& cr,
    const ThreadRows& rows, int64_t nk, float (&acc_o)[Traits::kHeadDim / 2],
    OnlineSoftmax<Traits::kBlock, Traits::kHeadDim>& softmax, ConsumerCarry<Traits>& c,
    OnScores on_scores, FinishPrev finish_prev) {
  constexpr int kBlock = Traits::kBlock;
  constexpr int kStages = Traits::kStages;
  const RingDescs<Traits> descs(cr.q_wg, sm.kv);
  // The per-tile tests in 32-bit key-block numbers (blk = key block of the tile, k0 = blk *
  // kBlock), set up once per item instead of 64-bit position compares per tile:
  //   k0 < nk                          <=> blk < blk_end (0 for a warpgroup past the query end)
  //   k0 + kBlock <= nk (not ragged)   <=> blk < blk_full
  //   causal tile with no admissible key (k0 > last query row + delta) <=> blk > causal_last
  const int64_t blocks_k = (nk + kBlock - 1) / kBlock;
  int blk_end = cr.active ? static_cast<int>(min(blocks_k, int64_t{INT_MAX})) : 0;
  int blk_full = static_cast<int>(min(nk / kBlock, int64_t{INT_MAX}));
  const int64_t last_row = cr.wg_row0 + 63 + rows.delta;
  int causal_last = last_row < 0 ? -1 : static_cast<int>(min(last_row / kBlock, int64_t{INT_MAX}));
  // Pinned (an empty asm that "changes" them), so that ptxas keeps the three words rather than
  // recomputing them from the 64-bit positions inside the loop.
  asm volatile("" : "+r"(blk_end), "+r"(blk_full), "+r"(causal_last));
  // Tile e; kFirst (tile 0, a compile-time variant outside the loop) finishes the previous item
  // instead of rescaling O, so that the loop body holds no epilogue.
  auto consume_tile = [&](auto first, int e) {
    constexpr bool kFirst = decltype(first)::value;
    const uint32_t gi = gbase + static_cast<uint32_t>(e);
    const int stage = static_cast<int>(gi % kStages);
    const uint32_t parity = (gi / kStages) & 1u;
    MbarWait(sm.bar_full + 8 * stage, parity);
    // The tile's metadata (key block, mask kind) and whether this warpgroup has work in it. With
    // one or two consumer warpgroups it is read under the GEMMs, after the issue; with three
    // (160 registers) before the barrier. (Measured on an H200, interleaved reps, bench/results/
    // h200x2-2026-11-27-kernel3/ab-meta-order: after the issue dense D = 128 6%, causal 1%, 99%
    // skipped 1% faster; at D = 64 with three warpgroups 3.5% slower.) The slot is rewritten only
    // after this warpgroup's K release below.
    int mask = 0;
    int blk = 0;
    bool work = false;
    auto read_meta = [&] {
      mask = sm.meta[2 * stage + 1];
      blk = sm.meta[2 * stage];
      work = blk < blk_end && !(mask == 1 && blk > causal_last);
    };
    constexpr bool kMetaUnderGemms = Traits::kConsumerWarpgroups <= 2;
    if constexpr (!kMetaUnderGemms) read_meta();
    if (c.pending) MbarWait(bar_full_v + 8 * c.stage, c.parity);  // V(e-1) landed

    float s[kBlock / 2];
    pp.BeforeScores();
    // S(e) is issued also for a tile without work (its result is not read): a conditional S
    // block ends in an empty commit group, which ptxas closes with a dummy wgmma that the
    // profile showed warps stalling on (2% of the dense kernel's samples; the P V group, which
    // must stay conditional since without a pending tile there is no landed V to multiply, now
    // commits inside its branch: IssueScoresAndPV). Rows past the query end and keys past the
    // key end are zeros in smem (TMA zero-fill), so the GEMM reads only landed data.
    IssueScoresAndPV<Traits>(s, descs.Q(), descs.K(stage), /*scores=*/true, acc_o, c.pa,
                             descs.V(c.stage), c.pending);
    pp.AfterScores();
    if constexpr (kMetaUnderGemms) read_meta();
    WaitScoresOf<1>(s);
    on_scores(e + 1 == count ? lane : 1);
    MbarArriveLane0(sm.bar_empty + 8 * stage, lane);  // K(e) read (or not needed)
    float alpha[2] = {1.f, 1.f};
    if (work) {
      if (mask != 0 || blk >= blk_full) {  // warpgroup-uniform: a full tile skips the mask
        ApplyMask<kBlock>(s, p, mask, static_cast<int64_t>(blk) * kBlock, nk, rows.my_row0,
                          rows.delta, rows.t);
      }
      softmax.StepScores(s, alpha, p.scale_log2);
    }
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < Traits::kHeadDim / 2; ++i) FenceReg(acc_o[i]);
    MbarArriveLane0(bar_empty_v + 8 * c.stage, c.pending ? lane : 1);  // V(e-1) read
    if constexpr (!kFirst) {
      if (work) {
        // O is rescaled only where a row max of the warp grew (alpha = exp2(0) = 1 exactly
        // otherwise): a warp vote, so the branch is warp-uniform.
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
          softmax.RescaleO(acc_o, alpha);
        }
      }
    }
    if (work) {
      PackP<typename Traits::Elem, kBlock>(s, c.pa);
    } else {
      // Nothing reads V(e): hand it back once it landed (the producer re-arms its barrier only
      // after the release, so the release must not overtake the copy).
      MbarWait(bar_full_v + 8 * stage, parity);
      MbarArriveLane0(bar_empty_v + 8 * stage, lane);
    }
    if constexpr (kFirst) {
      // O is the previous item's, complete now: written out and zeroed for this item (whose
      // first tile needs no rescale). After PackP, so that S is no longer live.
      finish_prev();
    }
    c.pending = work;
    c.stage = work ? stage : c.stage;
    c.parity = work ? parity : c.parity;
  };
  consume_tile(std::true_type{}, 0);
  for (int e = 1; e < count; ++e) consume_tile(std::false_type{}, e);
}

// Consumer warpgroup `wg`: per item, wait for Q and the item's metadata, run its 64 rows against
// the item's tiles (the ring continues across items), release Q after the last S GEMM. The
// item's last P V GEMM and its epilogue are carried into the next item's first tile
// (ConsumerCarry); after the CTA's last item they run on their own. An item without tiles writes
// its empty output from constants and leaves the carry alone. Softmax statistics are per item
// (the carried item's go with it), O is zeroed once its item is written.
template <typename Traits>
__device__ __forceinline__ void ConsumePersistent(const FlashFwdParams& p,
                                                  const WarpSpecializedSmem& sm,
                                                  uint32_t bar_full_v, uint32_t bar_empty_v,
                                                  const int* item_meta, int num_items, int64_t nk,
                                                  int wg, int warp, int lane) {
  constexpr int kHeadDim = Traits::kHeadDim;
  // This warpgroup's Q rows: landed / released, and its metadata slot.
  const uint32_t bar_q_full = QFullBar<Traits>(sm, wg);
  const uint32_t bar_q_empty = QEmptyBar<Traits>(sm, wg);
  const int* const meta = item_meta + 4 * wg;
  const int64_t delta = p.q_pos_offset - p.k_pos_offset;
  const int64_t row_in_wg = (warp % 4) * 16 + lane / 4;  // the thread's first row in its 64
  const uint32_t q_wg = sm.q + wg * 64 * 128;

  const PingPong<Traits::kConsumerWarpgroups> pp(wg);
  pp.Start();
  float acc_o[kHeadDim / 2];  // (64, kHeadDim) O of this warpgroup, wgmma accumulator layout
  auto zero_o = [&] {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
  };
  zero_o();
  OnlineSoftmax<Traits::kBlock, kHeadDim> softmax;
  softmax.Reset();
  ConsumerCarry<Traits> c;
  // The carried item's output (rows past the query end are skipped inside StoreOutput).
  auto store_prev = [&] {
    const int64_t wg_row0 = static_cast<int64_t>(c.row) * Traits::kBlockM + wg * 64;
    StoreOutput<typename Traits::Elem>(p, acc_o, c.softmax, MakeOutputBase(p, c.y, c.z),
                                       wg_row0 + row_in_wg, lane % 4);
  };
  uint32_t gbase = 0;  // global tile index of the item's first tile
  uint32_t local = 0;  // items of this CTA so far
  for (int item = CtaItem(0); item < num_items; item = CtaItem(static_cast<int>(++local))) {
    // Q rows and the metadata of this item (the Q warp).
    MbarWait(bar_q_full, local & 1u);
    const int row = meta[0];
    const int count = meta[1];
    const int y = meta[2];
    const int z = meta[3];
    const int64_t wg_row0 = static_cast<int64_t>(row) * Traits::kBlockM + wg * 64;
    if (count == 0) {
      // No S GEMM reads this Q; the item's rows have no admissible key: O = 0 and LSE = -inf
      // (accumulate mode: untouched), written from constants, so the carry goes on past it.
      MbarArriveLane0(bar_q_empty, lane);
      float zeros[kHeadDim / 2];
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) zeros[i] = 0.f;
      OnlineSoftmax<Traits::kBlock, kHeadDim> none;
      none.Reset();
      StoreOutput<typename Traits::Elem>(p, zeros, none, MakeOutputBase(p, y, z),
                                         wg_row0 + row_in_wg, lane % 4);
      continue;
    }
    softmax.Reset();
    const ConsumerRow cr{q_wg, wg_row0, wg_row0 < p.seqlen};
    const ThreadRows rows{wg_row0 + row_in_wg, delta, lane % 4};
    ConsumeItemOverlapped<Traits>(
        p, sm, bar_full_v, bar_empty_v, gbase, count, pp, lane, cr, rows, nk, acc_o, softmax, c,
        [&](int arrive_lane) { MbarArriveLane0(bar_q_empty, arrive_lane); },
        [&] {
          if (c.owed) {
            store_prev();
            // O's registers are zeroed only after the stores read them (not moved elsewhere
            // first, which would make ptxas wait for the GEMMs right after their issue).
#pragma unroll
            for (int i = 0; i < kHeadDim / 2; ++i) FenceReg(acc_o[i]);
            zero_o();
          }
        });
    gbase += static_cast<uint32_t>(count);
    // This item's epilogue is owed from here on (after its last P V GEMM, when one is pending).
    c.owed = true;
    c.softmax = softmax;
    c.row = row;
    c.y = y;
    c.z = z;
  }
  // The CTA's last item: its pending GEMM and its epilogue.
  if (c.pending) {
    MbarWait(bar_full_v + 8 * c.stage, c.parity);
    GemmPVDesc<Traits>(acc_o, c.pa, RingDescs<Traits>(q_wg, sm.kv).V(c.stage));
    MbarArriveLane0(bar_empty_v + 8 * c.stage, lane);
  }
  if (c.owed) store_prev();
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

// The consumers overlap a tile's softmax with the previous tile's P V GEMM
// (ConsumeItemOverlapped). kTma: Q, K and V arrive by TMA through tma_q / tma_k / tma_v (5-D
// maps: head dim, row, head, segment, batch; 128-byte swizzle; boxes of 64 columns x kBlock rows,
// kBlockM for Q); otherwise by cp.async (K/V from kProducerWarps warps, Q from the next one; the
// maps are then not read).
template <typename Traits, bool kTma>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm)
    FlashFwdSm90PersistentKernel(const FlashFwdParams p, const int num_items, const int head_group,
                         const __grid_constant__ CUtensorMap tma_q,
                         const __grid_constant__ CUtensorMap tma_k,
                         const __grid_constant__ CUtensorMap tma_v) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  extern __shared__ unsigned char smem_raw[];
  // Traits' offsets; q_full[h] / q_empty[h]: QFullBar / QEmptyBar.
  const WarpSpecializedSmem sm = MakeWarpSpecializedSmem<Traits>(smem_raw);
  int* const item_meta = reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(sm.meta) +
                                                (Traits::kItemMetaOffset - Traits::kMetaOffset));

  const int tid = static_cast<int>(threadIdx.x);
  // Warpgroup index made visibly warp-uniform (a shuffle from lane 0), so that ptxas sees the
  // role branch below as non-divergent (otherwise it serializes the consumers' wgmma: C7518).
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  // The V halves' barriers (full_v[kStages], then empty_v[kStages]).
  const uint32_t bar_full_v = sm.bar_full + (Traits::kVBarOffset - Traits::kBarOffset);
  const uint32_t bar_empty_v = bar_full_v + 8 * Traits::kStages;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      // TMA: the one arrive.expect_tx of the issuing lane; cp.async: every lane of the producer
      // warp that loads the tile.
      MbarInit(sm.bar_full + 8 * s, kTma ? 1 : 32);
      MbarInit(bar_full_v + 8 * s, kTma ? 1 : 32);
      MbarInit(bar_empty_v + 8 * s, 4 * Traits::kConsumerWarpgroups);
      MbarInit(sm.bar_empty + 8 * s, 4 * Traits::kConsumerWarpgroups);  // a lane per consumer warp
    }
#pragma unroll
    for (int h = 0; h < Traits::kConsumerWarpgroups; ++h) {
      // q_full[h]: the TMA lane's arrive, or every lane of the Q warp (producer warp
      // kProducerWarps); q_empty[h]: a lane per warp of consumer warpgroup h.
      MbarInit(QFullBar<Traits>(sm, h), kTma ? 1 : 32);
      MbarInit(QEmptyBar<Traits>(sm, h), 4);
    }
    if constexpr (kTma) FenceMbarrierInit();
  }
  __syncthreads();  // the last CTA-wide barrier: idle producer warps exit below

  if (warpgroup == 0) {
    // Producer warpgroup: warps [0, kProducerWarps) load K/V, the next one Q, the last exits.
    SetMaxNregDec<Traits::kProducerRegs>();
    if (warp < Traits::kProducerWarps) {
      if constexpr (kTma) {
        if (warp == 0) {
          ProducePersistentKvTma<Traits>(p, sm, bar_full_v, bar_empty_v, num_items, head_group,
                                         &tma_k, &tma_v, lane);
        }
      } else {
        ProducePersistentKv<Traits>(p, sm, bar_full_v, bar_empty_v, num_items, head_group, nk,
                                    warp, lane);
      }
    } else if (warp == Traits::kProducerWarps) {
      ProducePersistentQ<Traits, kTma>(p, sm, item_meta, num_items, head_group, &tma_q,
                                      lane);
    }
  } else {
    SetMaxNregInc<Traits::kConsumerRegs>();
    ConsumePersistent<Traits>(p, sm, bar_full_v, bar_empty_v, item_meta, num_items, nk,
                              warpgroup - 1, warp, lane);
  }
#else
  __trap();
#endif  // ATTNSERVE_FLASH_SM90_DEVICE
}

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_PERSISTENT_KERNEL_CUH_
