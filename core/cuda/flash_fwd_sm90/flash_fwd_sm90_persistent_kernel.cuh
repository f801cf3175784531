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
// ConsumeItemOverlapped (flash_fwd_sm90_consumer.cuh), for TMA and cp.async loads alike. The
// variants are type combinations of Sm90PersistentTraits (consumer warpgroups x key rows per
// tile): layout block 128 with two consumers (every layout), block 64 with one (two CTAs per SM),
// 192-row items with three at D = 64 and 176-key tiles at D = 128 (implicit layouts);
// flash_fwd_sm90.cc picks one.
// (A one-CTA-per-tile kernel, which every thread loaded for, ran layout block 64 until the
// persistent kernel took it over 18-22% faster: bench/results/h200x2-2026-11-27-kernel4/ab-b64.)
// What the persistent grid adds:
// - Grid = min(#SMs x CTAs per SM, #work items), one CTA per SM (two at block 64). A work item
//   is (query-block row, head, batch * seg); CTA b runs one item of each round of gridDim.x
//   items, dealt back and forth (CtaItem). On the CSR layouts with TMA loads (kDynamic; the
//   launcher's choice, Sm90ItemDeal) only rounds 0 and 1 are dealt so: later items are drawn
//   from a counter as the CTAs go (ItemQueue, DealItems in the tile scheduler), so that SMs that
//   ran slower items take fewer (SMs busy 97.9% of a block-sparse launch instead of 96.2-96.6%,
//   99% skipped 0.7-1.5% faster; h200-2026-11-28-kernel13).
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
//   earlier items of this CTA + e); its K goes to K slot G % kKStages, its V to V slot
//   G % kVStages, full/empty parities from G / kKStages and G / kVStages (RingSlots), and
//   producer warp G % kProducerWarps loads it. No barrier is ever re-initialised. The uniform
//   ring has kStages stages of K and V; the split ring (D = 128, 128-key tiles, two consumer
//   warpgroups: the CSR layouts at D = 128) has two K slots, three V slots and two Q buffers in
//   the same 224 KB (Sm90WarpSpecializedTraits::kSplitRing).
// - Q buffers (kQBufs: two in the split ring, one otherwise) per consumer warpgroup: Q has its
//   own producer warp (warp 2 of the producer warpgroup; warps 0 and 1 load K/V only and never
//   wait for Q), and each consumer warpgroup h has its own 64 Q rows, metadata slot and pair of
//   barriers in each buffer b: q_full[b][h] (count 1 with TMA: the Q warp's arrive.expect_tx;
//   32 with cp.async) and q_empty[b][h] (count 4: one lane per warp of warpgroup h). Item j of
//   the CTA uses buffer j % kQBufs. A consumer warp arrives on its q_empty as soon as its S
//   wgmma of the item's LAST tile completed (wgmma.wait_group after the S GEMM; or at once for
//   an item with no tile). The Q warp waits on q_empty[b][h] of item j - kQBufs, publishes h's
//   metadata, loads h's rows of item j (one TMA box per panel) and arms q_full[b][h], for
//   h = 0, 1, ...; with one buffer it then prefetches item j + 1's Q rows into L2
//   (cp.async.bulk.prefetch.L2), so that a warpgroup's next Q loads from L2 while it runs its
//   last softmax; with two, item j + 1's rows load during the whole of item j (at 99% skipped the
//   item start's Q wait, 3.2% of the samples, is gone: 1-2% fewer cycles, 0.8-1.6% faster at the
//   power cap, h200-2026-11-28-kernel12/c). Either way a warpgroup starts the next item without
//   waiting for the other warpgroup to finish the current one. (Measured on an H200,
//   h200x2-2026-11-28-kernel5/ab-qwg, medians of seven interleaved reps against one Q barrier pair
//   for the whole tile: random 90% skipped 0.962x, local_window 90% 0.986x, 99% and dense level.
//   The 90% cases run at the power cap and land in two groups ~10% apart, so the gain is inside
//   their spread; it stays as the simpler protocol for the warpgroups, not as a proven speed-up.
//   Before Q had its own warp, with Q loaded by K/V warp 0, the consumers spent ~18% of their stall
//   samples waiting for Q at 99% skipped.)
//   The cp.async fallback loads the whole tile once every warpgroup released it and arrives on
//   every q_full[b][h].
//   Consumers wait on q_full[b][h] (parity = (local item count / kQBufs) & 1) for EVERY item,
//   also an empty one, so a phase is never skipped (a parity wait on a skipped phase would
//   return at once).
// - Clusters (Sm90PersistentTraits' kClusterM = 2; the 176-key variant on the implicit dense and
//   causal layouts): the cluster is the grid's unit (CtaItem deals clusters), its two CTAs run
//   adjacent 128-row items of one (head, batch * seg) and walk the same tiles (causal: those of
//   the later row; DecodeWorkItem), and each K/V tile is loaded once for both: the TMA lane of
//   CTA r issues rows [88 r, 88 r + 88) of K and V as multicast boxes into both CTAs' stage, each
//   CTA arming its own full barrier with the whole tile's bytes; the consumers release a stage on
//   both CTAs' empty barriers, so neither producer overwrites a stage the other CTA still reads.
//   Before it exits, each producer waits for the last releases of its stages (the other CTA's
//   arrives must not land in an exited CTA). L2 serves 41% fewer bytes; measured on an H200
//   (h200x2-2026-11-28-kernel9): 1% more cycles, but under sustained load at the power cap the
//   clock settles ~4% higher, dense 2-4% and causal 2% faster.
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

#include <cuda.h>  // CUtensorMap (a plain struct; nothing of the driver library is linked)

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_consumer.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_warp_specialized.cuh"

namespace attnserve {
namespace flash_sm90 {

// kClusterM_: CTAs per cluster. 2: the CTAs of a cluster run adjacent item rows of one (head,
// batch, segment) of the implicit dense or causal layout over the same K/V tiles, and load each
// tile once for both: CTA r issues rows [r, r + 1) x kBlock / 2 of K and V with TMA multicast into
// both CTAs' stage (same offset, same barrier offset), so L2 serves every K/V byte once per
// cluster instead of once per CTA. A stage is then free only when the consumers of both CTAs
// released it (empty barriers count both CTAs' consumer warps; MbarArriveClusterLanes).
// kFullTiles_: for layouts of whole full blocks (a CSR of kFull entries, FlashFwdParams::
// csr_all_full, or the dense non-causal layout, over whole key blocks; Sm90FullTiles): the
// tile loop has no mask path (ApplyMask, the mask-kind and ragged-tile tests): 501 instead of
// 945 instructions per tile at D = 128, 1.2-1.8% fewer cycles at 90% and 99% skipped
// (h200x2-2026-11-28-kernel10/d).
template <int kHeadDim_, typename Elem_, int kConsumerWarpgroups_ = 2, int kBlockN_ = 128,
          int kClusterM_ = 1, bool kFullTiles_ = false>
struct Sm90PersistentTraits
    : Sm90WarpSpecializedTraits<kHeadDim_, Elem_, kConsumerWarpgroups_, kBlockN_> {
  using Roles = Sm90WarpSpecializedTraits<kHeadDim_, Elem_, kConsumerWarpgroups_, kBlockN_>;
  static constexpr int kClusterM = kClusterM_;
  static_assert(kClusterM == 1 || (kClusterM == 2 && Roles::kImplicitOnly),
                "clusters of two, on the implicit-only variants (the layout's rows share tiles)");
  static constexpr bool kFullTiles = kFullTiles_;
  static_assert(!kFullTiles || !Roles::kImplicitOnly, "full tiles: a 128-row, 128-key variant");
  static_assert(Roles::kBlock % (8 * kClusterM) == 0,
                "a CTA's share of a tile is whole 8-row swizzle atoms");
  // Consumer warps that release a stage (a lane each): those of every CTA of the cluster.
  static constexpr int kStageReleases = 4 * Roles::kConsumerWarpgroups * kClusterM;
  // Tiles (Q buffers, then the ring), then the barriers: full[kKStages], empty[kKStages],
  // q_full[kQBufs][kConsumerWarpgroups], q_empty[kQBufs][kConsumerWarpgroups] (8 B each), then
  // per K slot (key block, mask kind) as two int32, then per Q buffer and consumer warpgroup the
  // item's (row, count, y, z).
  static constexpr int kQSlots = Roles::kQBufs * Roles::kConsumerWarpgroups;
  static constexpr int kBarOffset = Roles::kQBufs * Roles::kQTileBytes + Roles::kRingBytes;
  static constexpr int kMetaOffset = kBarOffset + 8 * (2 * Roles::kKStages + 2 * kQSlots);
  static constexpr int kItemMetaOffset = kMetaOffset + 8 * Roles::kKStages;
  // The V slots' barriers: full_v[kVStages], empty_v[kVStages] (full and empty above guard the
  // K slots).
  static constexpr int kVBarOffset = kItemMetaOffset + 16 * kQSlots;
  // The dynamic deal's item queue (the CSR variants without a cluster; ItemQueue): full[n],
  // empty[n], then n int32 items (kQueueOffset).
  static constexpr bool kDynamicDeal = !Roles::kImplicitOnly && kClusterM == 1;
  static constexpr int kQueueEntries = kDynamicDeal ? flash_sm90::kItemQueue : 0;
  static constexpr int kQueueBarOffset = kVBarOffset + 16 * Roles::kVStages;
  static constexpr int kQueueOffset = kQueueBarOffset + 16 * kQueueEntries;
  static constexpr int kSmemBytes = kQueueOffset + 4 * kQueueEntries + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
};

#if ATTNSERVE_FLASH_SM90_DEVICE

// K/V warp `warp` (< kProducerWarps): the kept tiles of the CTA's items into the ring; it never
// waits for Q. Tile G of the CTA's tile sequence (tiles of its earlier items + e) goes to the
// ring slots of RingSlots(G), loaded by warp G % kProducerWarps.
template <typename Traits>
__device__ __forceinline__ void ProducePersistentKv(const FlashFwdParams& p,
                                                    const WarpSpecializedSmem& sm,
                                                    uint32_t bar_full_v, uint32_t bar_empty_v,
                                                    int num_items, int head_group, int64_t nk,
                                                    int warp, int lane) {
  using Elem = typename Traits::Elem;
  constexpr int kProducerWarps = Traits::kProducerWarps;
  static_assert(Traits::kClusterM == 1, "clusters load by TMA multicast");
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
      ProduceKvTile<Traits>(p, sm, bar_full_v, bar_empty_v, w.row, w.begin, e, gi, k_base,
                            v_base, nk, lane);
    }
    g += static_cast<uint32_t>(w.count);
  }
}

// K/V by TMA (one lane of producer warp 0 for every tile of the CTA's items): per tile, wait
// for its K slot to be free, publish (key block, mask kind) in the slot's metadata, arm
// full[K slot] with the tile's bytes (one arrival: full counts 1 in this mode) and issue one box
// per 64-column panel of K; then the same for V with its V slot and full_v. The copies complete
// on the barriers themselves: the producer neither waits for them nor fences, so every free
// slot has a tile in flight (cp.async producers wait for their own copies before they publish,
// one tile per warp). Rows past the key end are zero-filled by the TMA unit (the map's row
// extent is the key count). K and V have their own barriers (K: full/empty, V: full_v/empty_v),
// since the consumer is done with K(e) after S(e) but reads V(e) a tile later; a K slot can then
// reload while the V of its tile is still being read.
// kDynamic: the items come from the dynamic deal (ItemQueue).
template <typename Traits, bool kDynamic = false>
__device__ __forceinline__ void ProducePersistentKvTma(const FlashFwdParams& p,
                                                       const WarpSpecializedSmem& sm,
                                                       uint32_t bar_full_v, uint32_t bar_empty_v,
                                                       int num_items, int head_group,
                                                       const CUtensorMap* tma_k,
                                                       const CUtensorMap* tma_v,
                                                       const ItemQueue& queue, int lane) {
  constexpr int kBlock = Traits::kBlock;
  constexpr int kPanels = Traits::kHeadDim / 64;
  constexpr int kClusterM = Traits::kClusterM;
  // This CTA's share of each tile (all of it without a cluster): rows [rank, rank + 1) x kShare.
  constexpr int kShare = kBlock / kClusterM;
  const int rank = static_cast<int>(blockIdx.x % kClusterM);
  const int hz = p.num_heads * (p.batch * p.num_segs);
  if (lane == 0) {
    PrefetchTensorMap(tma_k);
    PrefetchTensorMap(tma_v);
  }
  // One box per 64-column panel of the CTA's share, into this CTA (or every CTA of the cluster).
  // The CSR variants load K/V with L2 evict_last, so that the streamed Q rows (evict_first) and
  // O (streaming stores) do not push out of L2 the tiles that the head group's other items read
  // again: at 99% skipped, random, 10% fewer DRAM bytes read (h200-2026-11-28-kernel12/h3). Not
  // in the implicit-only variants, whose head groups are sized to keep K/V in L2 and whose
  // producers, at 32-40 registers, spilled around every load for the 64-bit policy operand.
  auto load = [&](uint32_t tile, const CUtensorMap* map, uint32_t bar, int k0, int kv_head,
                  int seg, int batch) {
#pragma unroll
    for (int panel = 0; panel < kPanels; ++panel) {
      const uint32_t dst = tile + panel * Traits::kPanelBytes + rank * kShare * 128;
      if constexpr (kClusterM > 1) {
        TmaLoad5dMulticast(dst, map, bar, (1u << kClusterM) - 1, panel * 64,
                           k0 + rank * kShare, kv_head, seg, batch);
      } else if constexpr (Traits::kImplicitOnly) {
        TmaLoad5d(dst, map, bar, panel * 64, k0, kv_head, seg, batch);
      } else {
        TmaLoad5d(dst, map, bar, kL2EvictLast, panel * 64, k0, kv_head, seg, batch);
      }
    }
  };
  uint32_t g = 0;  // global index of the item's first tile in this CTA's tile sequence
  // The CSR variants decode ahead (ItemWalk), on the issuing lane alone (with every lane
  // walking, ptxas spilled the look-ahead at the block-64 variants' producer registers); the
  // implicit-only ones have no loads to hide and decode on every lane as before.
  constexpr bool kAhead = !Traits::kImplicitOnly;
  if (!kAhead || lane == 0) {
    ItemWalk<Traits::kItemRows, Traits::kTileKeys, kClusterM, kAhead, kDynamic> walk(
        p, hz, head_group, num_items, queue);
    for (; walk.Valid(); walk.NextItem()) {
      walk.BeginItem();
      const WorkItem& w = walk.cur;
      const int kv_head = (p.head_start + w.y * p.head_step) / p.kv_group;
      const auto [batch, seg] = SplitZ(w.z, p.num_segs);
      if (lane == 0) {
        for (int e = 0; e < w.count; ++e) {
          const RingSlots<Traits> r(g + static_cast<uint32_t>(e));
          int mask;
          const int blk = walk.Tile(e, mask);
          r.WaitKFree(sm.bar_empty);
          sm.meta[2 * r.k_slot] = blk;
          sm.meta[2 * r.k_slot + 1] = mask;
          const uint32_t bar = sm.bar_full + 8 * r.k_slot;
          const int k0 = blk * kBlock;
          // The whole tile lands in this CTA (with a cluster, half of it from the other CTA).
          MbarArriveExpectTx(bar, Traits::kTileBytes);
          load(sm.kv + r.k_slot * Traits::kKStride, tma_k, bar, k0, kv_head, seg, batch);
          r.WaitVFree(bar_empty_v);
          const uint32_t bar_v = bar_full_v + 8 * r.v_slot;
          MbarArriveExpectTx(bar_v, Traits::kTileBytes);
          load(sm.kv + Traits::kVOffset + r.v_slot * Traits::kVStride, tma_v, bar_v, k0, kv_head,
               seg, batch);
        }
      }
      g += static_cast<uint32_t>(w.count);
    }
  }
  if constexpr (kClusterM > 1) {
    // The other CTA's consumers release this CTA's stages through to its last tile: wait for
    // those releases (the last use of every stage, K and V), so that this CTA does not exit
    // while their arrives may still be on the way to its barriers.
    if (lane == 0) {
      static_assert(Traits::kKStages == Traits::kVStages, "clusters run the uniform ring");
      for (uint32_t s = 0; s < Traits::kKStages && s < g; ++s) {
        const uint32_t last_use = (g - 1 - s) / Traits::kKStages;
        MbarWait(sm.bar_empty + 8 * s, last_use & 1u);
        MbarWait(bar_empty_v + 8 * s, last_use & 1u);
      }
    }
  }
  __syncwarp();
}

// Q warp: each item's Q and its metadata (row, count, y, z; released with Q by the q_full
// arrive, so the consumers do no dependent global loads between items), per consumer warpgroup:
// warpgroup h's 64 rows and metadata slot are reloaded as soon as h released the previous item's
// (q_empty[h]), so a warpgroup that finished its item starts the next one while the other still
// runs its last tiles; then the next item's Q rows are prefetched into L2, a whole item ahead of
// their load (kTma: TMA prefetches of the same boxes; otherwise a bulk prefetch per row).
// kTma: lane 0 arms q_full[h] with the rows' bytes (q_full counts 1 then) and issues one TMA box
// (64 rows) per 64-column panel (rows past the query end zero-filled); otherwise every lane loads
// the whole tile by cp.async once every warpgroup released it, waits, fences and arrives on every
// q_full[h] (count 32).
// kDynamic: items from round 2 on come from the dealer's draws (ItemQueue), and once none
// is left every consumer warpgroup gets a row of -1 in its metadata (with a q_full arrive) as
// the end.
template <typename Traits, bool kTma, bool kDynamic = false>
__device__ __forceinline__ void ProducePersistentQ(const FlashFwdParams& p,
                                                   const WarpSpecializedSmem& sm, int* item_meta,
                                                   int num_items, int head_group,
                                                   const CUtensorMap* tma_q,
                                                   const ItemQueue& queue, int lane) {
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM;  // query rows of an item
  constexpr int kWgs = Traits::kConsumerWarpgroups;
  const int64_t n = p.seqlen;
  const int hz = p.num_heads * (p.batch * p.num_segs);
  uint32_t local = 0;  // items of this CTA so far (the round of CtaItem)
  constexpr int kClusterM = Traits::kClusterM;
  // Each Q row is read once: evict_first, so that it does not push K/V out of L2.
  constexpr uint64_t policy = kL2EvictFirst;
  static_assert(!kDynamic || (kTma && kClusterM == 1), "the dynamic deal: TMA, no cluster");
  // The CTA's item j: the first two rounds dealt, the later ones drawn.
  auto item_at = [&](uint32_t j) {
    if (!kDynamic || j < 2) return CtaItem<kClusterM>(static_cast<int>(j));
    return queue.Take(j - 2, lane);
  };
  for (int item = item_at(0); item < num_items; item = item_at(++local)) {
    const WorkItem w = DecodeWorkItem<Traits::kItemRows, Traits::kTileKeys, kClusterM>(
        p, item, hz, head_group);
    // The item's Q buffer; it held item local - kQBufs, whose release (q_empty of that use,
    // parity `freed`) the loads below wait for.
    constexpr uint32_t kQBufs = Traits::kQBufs;
    const int buf = static_cast<int>(local % kQBufs);
    const bool reuse = local >= kQBufs;
    const uint32_t freed = ((local - kQBufs) / kQBufs) & 1u;
    const uint32_t q_tile = sm.q + buf * Traits::kQTileBytes;
    auto publish = [&](int h) {  // warpgroup h's metadata slot of this buffer
      int* const m = item_meta + 4 * (buf * kWgs + h);
      m[0] = w.row;
      m[1] = w.count;
      m[2] = w.y;
      m[3] = w.z;
    };
    if constexpr (kTma) {
      if (lane == 0) {  // the metadata is released to warpgroup h by this lane's arrive
        const int head = p.head_start + w.y * p.head_step;
        const auto [batch, seg] = SplitZ(w.z, p.num_segs);
#pragma unroll
        for (int h = 0; h < kWgs; ++h) {
          // Warpgroup h's rows of the buffer's previous item: its every warp issued and
          // completed its last S GEMM.
          if (reuse) MbarWait(QEmptyBar<Traits>(sm, buf, h), freed);
          publish(h);
          const uint32_t full = QFullBar<Traits>(sm, buf, h);
          MbarArriveExpectTx(full, Traits::kQTileBytes / kWgs);
#pragma unroll
          for (int panel = 0; panel < Traits::kHeadDim / 64; ++panel) {
            TmaLoad5d(q_tile + panel * Traits::kQPanelBytes + h * 64 * 128, tma_q, full, policy,
                      panel * 64, w.row * kBlockM + h * 64, head, seg, batch);
          }
        }
      }
      __syncwarp();
    } else {
      if (reuse) {
#pragma unroll
        for (int h = 0; h < kWgs; ++h) MbarWait(QEmptyBar<Traits>(sm, buf, h), freed);
      }
      const Elem* q_base = QBase<Elem>(p, w.y, w.z);
      WarpLoadTile<kBlockM, Traits::kChunks>(q_tile, q_base, p.q_row_stride,
                                             static_cast<int64_t>(w.row) * kBlockM, n, lane);
      CpAsyncCommit();
      if (lane == 0) {  // released to the consumers by this lane's q_full arrives
#pragma unroll
        for (int h = 0; h < kWgs; ++h) publish(h);
      }
      CpAsyncWait<0>();
      FenceProxyAsyncShared();
#pragma unroll
      for (int h = 0; h < kWgs; ++h) MbarArrive(QFullBar<Traits>(sm, buf, h));
    }
    // With one Q buffer, the next item's rows are prefetched into L2 now, a whole item ahead of
    // their load. With two, their load follows within about an item anyway, and the prefetch
    // only cost (99% skipped 0.3-1.0% slower with it, h200-2026-11-28-kernel12/c).
    int next = INT_MAX;
    if constexpr (Traits::kQBufs == 1) {
      next = !kDynamic || local + 1 < 2 ? CtaItem<kClusterM>(static_cast<int>(local) + 1)
                                        : queue.Peek(local - 1);
    }
    if (Traits::kQBufs == 1 && next < num_items) {
      int row, y, z;  // the next item's (its tile range is not needed for the prefetch)
      DecodeItem<Traits::kItemRows, kClusterM>(p, next, hz, head_group, row, y, z);
      if constexpr (kTma) {
        // The boxes the loads above take, one instruction each. (A bulk prefetch per row,
        // 256 bytes from each lane, compiled to a loop over the lanes, 32 rounds per 32 rows:
        // 3.7% of all warp samples at 99% skipped, kernel9/profiles.)
        if (lane == 0) {
          const int head = p.head_start + y * p.head_step;
          const auto [batch, seg] = SplitZ(z, p.num_segs);
#pragma unroll
          for (int h = 0; h < kWgs; ++h) {
#pragma unroll
            for (int panel = 0; panel < Traits::kHeadDim / 64; ++panel) {
              TmaPrefetch5d(tma_q, panel * 64, row * kBlockM + h * 64, head, seg, batch);
            }
          }
        }
        __syncwarp();
      } else {
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
  if constexpr (kDynamic) {
    // The end, in the buffer of the CTA's item `local`, once its previous use was released.
    const uint32_t kQBufs = Traits::kQBufs;
    const int buf = static_cast<int>(local % kQBufs);
    if (lane == 0) {
#pragma unroll
      for (int h = 0; h < kWgs; ++h) {
        if (local >= kQBufs) {
          MbarWait(QEmptyBar<Traits>(sm, buf, h), ((local - kQBufs) / kQBufs) & 1u);
        }
        item_meta[4 * (buf * kWgs + h)] = -1;
        MbarArrive(QFullBar<Traits>(sm, buf, h));
      }
    }
    __syncwarp();
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

// The consumers overlap a tile's softmax with the previous tile's P V GEMM
// (ConsumeItemOverlapped). kTma: Q, K and V arrive by TMA through tma_q / tma_k / tma_v (5-D
// maps: head dim, row, head, segment, batch; 128-byte swizzle; boxes of 64 columns x kBlock rows,
// kBlockM for Q); otherwise by cp.async (K/V from kProducerWarps warps, Q from the next one; the
// maps are then not read).
// kDynamic: the dynamic deal (ItemQueue) with the counter pair `item_counter` (TMA loads, a CSR
// variant without a cluster); otherwise the items are dealt statically (CtaItem) and
// item_counter is not read.
template <typename Traits, bool kTma, bool kDynamic = false>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm)
    FlashFwdSm90PersistentKernel(const FlashFwdParams p, const int num_items, const int head_group,
                         const __grid_constant__ CUtensorMap tma_q,
                         const __grid_constant__ CUtensorMap tma_k,
                         const __grid_constant__ CUtensorMap tma_v, int* const item_counter) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  static_assert(!kDynamic || (kTma && Traits::kDynamicDeal), "the dynamic deal: TMA, CSR");
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
  // The V slots' barriers (full_v[kVStages], then empty_v[kVStages]).
  const uint32_t bar_full_v = sm.bar_full + (Traits::kVBarOffset - Traits::kBarOffset);
  const uint32_t bar_empty_v = bar_full_v + 8 * Traits::kVStages;
  ItemQueue queue;
  if constexpr (kDynamic) {
    queue.counter = item_counter;
    queue.bars = sm.bar_full + (Traits::kQueueBarOffset - Traits::kBarOffset);
  }

  if (tid == 0) {
    // full, full_v: TMA: the one arrive.expect_tx of the issuing lane; cp.async: every lane of
    // the producer warp that loads the tile. empty, empty_v: a lane per consumer warp (of every
    // CTA of the cluster).
#pragma unroll
    for (int s = 0; s < Traits::kKStages || s < Traits::kVStages; ++s) {
      if (s < Traits::kKStages) MbarInit(sm.bar_full + 8 * s, kTma ? 1 : 32);
      if (s < Traits::kVStages) {
        MbarInit(bar_full_v + 8 * s, kTma ? 1 : 32);
        MbarInit(bar_empty_v + 8 * s, Traits::kStageReleases);
      }
      if (s < Traits::kKStages) MbarInit(sm.bar_empty + 8 * s, Traits::kStageReleases);
    }
#pragma unroll
    for (int b = 0; b < Traits::kQBufs; ++b) {
#pragma unroll
      for (int h = 0; h < Traits::kConsumerWarpgroups; ++h) {
        // q_full[b][h]: the TMA lane's arrive, or every lane of the Q warp (producer warp
        // kProducerWarps); q_empty[b][h]: a lane per warp of consumer warpgroup h.
        MbarInit(QFullBar<Traits>(sm, b, h), kTma ? 1 : 32);
        MbarInit(QEmptyBar<Traits>(sm, b, h), 4);
      }
    }
    if constexpr (kDynamic) {
#pragma unroll
      for (int s = 0; s < kItemQueue; ++s) {
        MbarInit(queue.Full(s), 1);                     // the dealer's arrive
        MbarInit(queue.Empty(s), ItemQueue::kReaders);  // the K/V lane's and the Q warp's
      }
    }
    if constexpr (kTma) FenceMbarrierInit();
  }
  __syncthreads();  // the last CTA-wide barrier: idle producer warps exit below
  // The cluster's barriers are initialised before any CTA multicasts into or releases another.
  if constexpr (Traits::kClusterM > 1) ClusterSync();

  if (warpgroup == 0) {
    // Producer warpgroup: warps [0, kProducerWarps) load K/V (warp 0 alone with TMA; warp 1 then
    // draws the items of the dynamic deal), the next one Q, the last exits.
    SetMaxNregDec<Traits::kProducerRegs>();
    if (warp < Traits::kProducerWarps) {
      if constexpr (kTma) {
        if (warp == 0) {
          ProducePersistentKvTma<Traits, kDynamic>(p, sm, bar_full_v, bar_empty_v, num_items,
                                                   head_group, &tma_k, &tma_v, queue, lane);
        } else if (kDynamic && lane == 0) {
          DealItems(queue, num_items);  // warp 1, idle with TMA loads otherwise
        }
      } else {
        ProducePersistentKv<Traits>(p, sm, bar_full_v, bar_empty_v, num_items, head_group, nk,
                                    warp, lane);
      }
    } else if (warp == Traits::kProducerWarps) {
      ProducePersistentQ<Traits, kTma, kDynamic>(p, sm, item_meta, num_items, head_group, &tma_q,
                                                 queue, lane);
    }
  } else {
    SetMaxNregInc<Traits::kConsumerRegs>();
    ConsumePersistent<Traits, kDynamic>(p, sm, bar_full_v, bar_empty_v, item_meta, num_items,
                                        nk, warpgroup - 1, warp, lane);
  }
#else
  __trap();
#endif  // ATTNSERVE_FLASH_SM90_DEVICE
}

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_PERSISTENT_KERNEL_CUH_
