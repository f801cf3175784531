// flash_fwd_sm90 work decomposition shared by the Hopper kernels: which query-block row, head and
// (batch, segment) a CTA or persistent work item runs, the row's kept key blocks (CSR range or
// the implicit dense / causal row), and the per-(head, batch, segment) base pointers.
//
// (y, z) name the (head, batch * segment) pair the way the single-tile grid does: y = grid.y
// = head index (head = head_start + y * head_step), z = grid.z = batch * num_segs + seg.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_TILE_SCHEDULER_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_TILE_SCHEDULER_CUH_

#include <climits>
#include <cstdint>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"

namespace attnserve {
namespace flash_sm90 {

// Entries of the dynamic deal's item queue in shared memory (ItemQueue).
inline constexpr int kItemQueue = 2;

#if ATTNSERVE_FLASH_SM90_DEVICE

// The persistent grid's r-th work item of this CTA (r = 0, 1, ...): round r covers items
// [r * gridDim.x, (r + 1) * gridDim.x), dealt forward in even rounds and backward in odd ones
// ("snake"). Items come heaviest first (DecodeItem), so a plain stride (CTA b takes item
// r * gridDim.x + b every round) gives CTA 0 the heaviest item of every round: for the implicit
// causal layout at N = 16384 and 16 heads on 132 SMs the busiest CTA then carries 6% more tiles
// than the mean; dealing back and forth cancels that to 0.2%. A value >= the item count means
// the CTA is done (only the last round is partial). What the deal cannot balance is the time the
// same tile count takes on different SMs: the CSR layouts draw their items after round 1
// (ItemQueue).
// kClusterM > 1: the CTAs of a cluster (kClusterM consecutive blockIdx.x) run the same item
// sequence, each its own query rows of it (DecodeItem), so the rounds deal clusters.
template <int kClusterM = 1>
__device__ __forceinline__ int CtaItem(int r) {
  const int ctas = static_cast<int>(gridDim.x) / kClusterM;
  const int b = static_cast<int>(blockIdx.x) / kClusterM;
  return r * ctas + ((r & 1) ? ctas - 1 - b : b);
}

// The dynamic deal (Sm90ItemDeal::kDynamic; CSR layouts, no cluster, TMA loads): rounds 0 and 1
// as CtaItem deals them, then each CTA draws its next item from a counter in device memory: item
// 2 * gridDim.x + (the counter's old value). A warp of its own draws (DealItems: otherwise idle
// producer warp 1), so that the atomic's round trip to L2 stands on no loader's path, and hands
// the CTA's item r >= 2 to the K/V producer and the Q warp through entry r - 2 of a queue in
// shared memory (kItemQueue entries, reused in turn); the consumers learn their items from the
// Q warp as before, and the end from a negative row in their metadata. With two entries the CTA
// holds at most about three items beyond the one its K/V producer loads, so items stay in the
// counter until a CTA is nearly ready for them.
// counter[0]: items drawn, counter[1]: CTAs that drew past the last item; the last of those
// resets both to 0 for the next launch on the stream (flash_fwd_sm90.cc hands out one pair per
// stream: launches on one stream never overlap, and a kernel that faults leaves no context to
// launch in).
struct ItemQueue {
  int* counter = nullptr;  // global: [0] draws, [1] CTAs done drawing
  // Shared-window address of full[kItemQueue] (entry s written: count 1, the dealer's arrive),
  // then empty[kItemQueue] (entry s read: count 2, the K/V producer's lane and the Q warp), then
  // the entries (int32: the item, >= the item count when none is left).
  uint32_t bars = 0;
  static constexpr uint32_t kReaders = 2;

  __device__ __forceinline__ uint32_t Full(uint32_t s) const { return bars + 8 * s; }
  __device__ __forceinline__ uint32_t Empty(uint32_t s) const {
    return bars + 8 * (kItemQueue + s);
  }
  __device__ __forceinline__ uint32_t Entry(uint32_t s) const {
    return bars + 16 * kItemQueue + 4 * s;
  }
  // Entry q (the CTA's item q + 2) is slot s = q % kItemQueue in its use u = q / kItemQueue.
  // Both readers take every entry up to the first item past the last one, and no further.
  // The dealer: publishes entry q once the slot's use u - 1 was read.
  __device__ __forceinline__ void Publish(uint32_t q, int item) const {
    const uint32_t s = q % kItemQueue;
    if (q >= kItemQueue) MbarWait(Empty(s), (q / kItemQueue - 1) & 1u);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(Entry(s)), "r"(item) : "memory");
    MbarArrive(Full(s));  // release: the entry before the arrive
  }
  // A reader: wait for entry q and read it (Peek: without releasing it).
  __device__ __forceinline__ int Peek(uint32_t q) const {
    const uint32_t s = q % kItemQueue;
    MbarWait(Full(s), (q / kItemQueue) & 1u);
    int item;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(item) : "r"(Entry(s)) : "memory");
    return item;
  }
  // Every lane of the Q warp.
  __device__ __forceinline__ int Take(uint32_t q, int lane) const {
    const int item = Peek(q);
    __syncwarp();
    MbarArriveLane0(Empty(q % kItemQueue), lane);
    return item;
  }
  // The K/V producer's issuing lane alone.
  __device__ __forceinline__ int TakeOne(uint32_t q) const {
    const int item = Peek(q);
    MbarArrive(Empty(q % kItemQueue));
    return item;
  }
};

// The dealer (lane 0 of its warp): draws the CTA's items from round 2 on into the queue, up to
// and including the first one past the last item; then, as the last CTA to get there, resets the
// counter pair.
__device__ __forceinline__ void DealItems(const ItemQueue& queue, int num_items) {
  for (uint32_t q = 0;; ++q) {
    const int item = 2 * static_cast<int>(gridDim.x) + atomicAdd(queue.counter, 1);
    queue.Publish(q, item);
    if (item >= num_items) break;
  }
  __threadfence();
  if (atomicAdd(queue.counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
    atomicExch(queue.counter, 0);
    atomicExch(queue.counter + 1, 0);
  }
}

// Query rows of a work item (kItemRows). 0: the layout block (p.block_size), which every CSR
// layout needs (a row of the CSR is one item). The implicit dense and causal layouts (col_idx
// null, square and aligned when causal) may cut their queries into items of other heights: 192
// rows = three consumer warpgroups at D = 64 (Sm90QueryTile); `row` then counts such items.
template <int kItemRows>
__device__ __forceinline__ int NumItemRows(const FlashFwdParams& p) {
  if constexpr (kItemRows == 0) {
    return static_cast<int>(p.num_q_blocks);
  } else {
    return static_cast<int>((p.seqlen + kItemRows - 1) / kItemRows);
  }
}

// Persistent work item -> (item row, y, z). The (y, z) pairs (hz of them) are cut into
// groups of `group`; the items of a group come before those of the next, and inside a group the
// position is the slowest index (the heavy-first walk: row_order, or the implicit causal layout
// from its last row down). group = hz: position-major over everything; group = 1: head-major
// (one (head, batch, segment) after another). The launcher sizes groups so that the K/V the
// CTAs running together read stays in L2 (flash_fwd_sm90.cc: Sm90HeadGroup).
// kClusterM > 1: an item is kClusterM consecutive item rows of one (y, z), CTA `rank` of the
// cluster (blockIdx.x % kClusterM) taking row kClusterM * row + rank; a row past the last one
// (an odd row count) has no query rows and writes nothing. The rows of a cluster share their
// K/V tiles, which its CTAs load once for both (TMA multicast): on the implicit dense layout
// every row has the same tiles, on the causal one the cluster's last row has the most, and every
// CTA of the cluster walks those (DecodeWorkItem; the tiles past a row's diagonal have no work
// for it).
template <int kItemRows = 0, int kClusterM = 1>
__device__ __forceinline__ void DecodeItem(const FlashFwdParams& p, int item, int hz, int group,
                                           int& row, int& y, int& z) {
  const int nq = (NumItemRows<kItemRows>(p) + kClusterM - 1) / kClusterM;
  const int per_group = group * nq;  // every group but the last is full
  const int g = item / per_group;
  const int r = item - g * per_group;
  const int size = min(group, hz - g * group);
  const int pos = r / size;
  const int rem = g * group + (r - pos * size);
  y = rem % p.num_heads;
  z = rem / p.num_heads;
  // row_order counts layout-block rows: items of another height walk the implicit causal
  // layout from its last item down themselves (the plan uploads that order for block rows).
  // (Clusters walk the implicit layouts in their own order, the causal one from its last row
  // down, which is the row order the plan uploads for it; the launcher refuses any other.)
  if (kItemRows == 0 && kClusterM == 1 && p.row_order != nullptr) {
    row = p.row_order[pos];
  } else if (p.col_idx == nullptr && p.dense_causal) {
    row = nq - 1 - pos;
  } else {
    row = pos;
  }
  if constexpr (kClusterM > 1) {
    row = row * kClusterM + static_cast<int>(blockIdx.x % kClusterM);
  }
}

// Key rows of a K / V tile (kTileKeys). 0: the layout block, which every CSR layout needs (a
// tile is one CSR entry). The implicit layouts may take wider tiles: 176 keys at D = 128
// (Sm90KeyTile); tile e then holds keys [176 e, 176 e + 176), the last one ragged.
// The kept-tile range [begin, begin + count) of item row `row`: its CSR entries, or for the
// implicit layout every key tile (causal: up to the tile of the item's last query row; with items
// and tiles of one layout block that is [0, row]).
template <int kItemRows = 0, int kTileKeys = 0>
__device__ __forceinline__ void ItemRange(const FlashFwdParams& p, int row, int64_t& begin,
                                          int& count) {
  if (p.col_idx != nullptr) {
    begin = p.row_ptr[row];
    count = static_cast<int>(p.row_ptr[row + 1] - begin);
    return;
  }
  begin = 0;
  int64_t tiles = p.num_k_blocks;
  int64_t last_tile = row;  // holding the key of the item's last query row
  if constexpr (kItemRows != 0 || kTileKeys != 0) {
    const int64_t item_rows = kItemRows != 0 ? kItemRows : p.block_size;
    const int64_t tile_keys = kTileKeys != 0 ? kTileKeys : p.block_size;
    if constexpr (kTileKeys != 0) {
      const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
      tiles = (nk + tile_keys - 1) / tile_keys;
    }
    last_tile = (static_cast<int64_t>(row) * item_rows + item_rows - 1) / tile_keys;
  }
  count = static_cast<int>(p.dense_causal ? min(last_tile + 1, tiles) : tiles);
}

// A persistent work item as every role of the kernel needs it: its item row, its (y, z)
// pair and its kept-tile range (DecodeItem, then ItemRange). Split in two steps for a caller
// that decodes ahead (the K/V producer): DecodeWorkItemRow (the row order's load) and
// WorkItemRange (the CSR row pointers', which need the row).
struct WorkItem {
  int row = 0, y = 0, z = 0;
  int64_t begin = 0;
  int count = 0;
};
template <int kItemRows = 0, int kClusterM = 1>
__device__ __forceinline__ WorkItem DecodeWorkItemRow(const FlashFwdParams& p, int item, int hz,
                                                      int group) {
  WorkItem w;
  DecodeItem<kItemRows, kClusterM>(p, item, hz, group, w.row, w.y, w.z);
  return w;
}
template <int kItemRows = 0, int kTileKeys = 0, int kClusterM = 1>
__device__ __forceinline__ void WorkItemRange(const FlashFwdParams& p, WorkItem& w) {
  int range_row = w.row;
  if constexpr (kClusterM > 1) {
    // The cluster's last row (before the query end), whose range every CTA of the cluster walks.
    range_row = min(w.row - w.row % kClusterM + kClusterM - 1, NumItemRows<kItemRows>(p) - 1);
  }
  ItemRange<kItemRows, kTileKeys>(p, range_row, w.begin, w.count);
}
template <int kItemRows = 0, int kTileKeys = 0, int kClusterM = 1>
__device__ __forceinline__ WorkItem DecodeWorkItem(const FlashFwdParams& p, int item, int hz,
                                                   int group) {
  WorkItem w = DecodeWorkItemRow<kItemRows, kClusterM>(p, item, hz, group);
  WorkItemRange<kItemRows, kTileKeys, kClusterM>(p, w);
  return w;
}

// The implicit layouts' tile e of item row `row` is key tile e; in the causal one, mask kind 1
// (causal diagonal) from the first tile whose keys reach past the item's first query row on:
// (e + 1) * tile keys > row * item rows + 1, i.e. e >= (row * item rows + 1) / tile keys (with
// items and tiles of one layout block: e >= row, the diagonal block, the row's last tile).
// INT_MAX (no tile masked) for the dense layout. Per item, so that the consumers of the
// implicit-only variants derive each tile's kind from e instead of reading it from shared
// memory.
template <int kItemRows = 0, int kTileKeys = 0>
__device__ __forceinline__ int ImplicitFirstMaskedTile(const FlashFwdParams& p, int row) {
  if (!p.dense_causal) return INT_MAX;
  if constexpr (kItemRows == 0 && kTileKeys == 0) {
    return row;
  } else {
    const int64_t item_rows = kItemRows != 0 ? kItemRows : p.block_size;
    const int64_t tile_keys = kTileKeys != 0 ? kTileKeys : p.block_size;
    return static_cast<int>((static_cast<int64_t>(row) * item_rows + 1) / tile_keys);
  }
}

// Key tile (in units of the tile's key rows: its first key is tile * key rows) and mask kind (0
// full, 1 causal diagonal, 2 partial) of tile e of item row `row`: the CSR entry, or on the
// implicit layouts tile e with ImplicitFirstMaskedTile's kind.
template <int kItemRows = 0, int kTileKeys = 0>
__device__ __forceinline__ int TileKeyBlock(const FlashFwdParams& p, int row, int64_t begin, int e,
                                            int& mask) {
  if (p.col_idx != nullptr) {
    const int blk = p.col_idx[begin + e];
    mask = p.block_mask[begin + e];
    return blk;
  }
  mask = e >= ImplicitFirstMaskedTile<kItemRows, kTileKeys>(p, row) ? 1 : 0;
  return e;
}

// The K/V producer's walk over its CTA's work items and their tiles (tile e of the current item:
// Tile(e, mask)). kAhead: decoded ahead of the loads, for the layouts whose decode reads global
// memory (CSR): the row of the item after next (the row order's load) while the current item's
// tiles are issued, the next item's tile range (the CSR row pointers, which need that row) at the
// current item's start, and each tile's key block and mask kind (its CSR entry) a tile ahead, the
// next item's first with the current item's last. So no chain of dependent global loads (row
// order, row pointers, entry: three L2 round trips) stands between an item's last tile and the
// next item's first, where the K/V ring would run dry at ~5 tiles per item (99% skipped).
// Without kAhead (the implicit-only variants: no loads to hide, and their producers run at
// 32-40 registers) an item is decoded where it starts.
// kDynamic (with kAhead): items from round 2 on come from the dealer (ItemQueue): the item after
// next is taken from the queue at the current item's start (while the next one is a real item:
// the queue ends at the first item past the last).
template <int kItemRows, int kTileKeys, int kClusterM, bool kAhead, bool kDynamic = false>
struct ItemWalk {
  static_assert(!kDynamic || (kAhead && kClusterM == 1), "the dynamic deal: CSR, no cluster");
  const FlashFwdParams& p;
  const int hz, group, num_items;
  const ItemQueue queue;
  int r = 0;  // the round of the current item (CtaItem)
  int item, item_next = INT_MAX, item_after = INT_MAX;
  WorkItem cur, next, after;
  int ahead_blk = 0;  // kAhead: the next tile's key block and mask kind
  int ahead_mask = 0;
  bool ahead = false;  // (ahead_blk, ahead_mask) hold the current item's tile 0

  __device__ __forceinline__ ItemWalk(const FlashFwdParams& params, int hz_, int group_,
                                      int num_items_, ItemQueue queue_ = {})
      : p(params), hz(hz_), group(group_), num_items(num_items_), queue(queue_) {
    item = CtaItem<kClusterM>(0);
    if constexpr (kAhead) {
      if (item < num_items) {
        cur = DecodeWorkItem<kItemRows, kTileKeys, kClusterM>(p, item, hz, group);
      }
      item_next = CtaItem<kClusterM>(1);
      if (item_next < num_items) {
        next = DecodeWorkItemRow<kItemRows, kClusterM>(p, item_next, hz, group);
      }
    }
  }
  __device__ __forceinline__ bool Valid() const { return item < num_items; }
  // At the current item's start (Valid): the current item decoded, or the next steps of the
  // items ahead.
  __device__ __forceinline__ void BeginItem() {
    if constexpr (!kAhead) {
      cur = DecodeWorkItem<kItemRows, kTileKeys, kClusterM>(p, item, hz, group);
    } else {
      if (item_next < num_items) WorkItemRange<kItemRows, kTileKeys, kClusterM>(p, next);
      if constexpr (kDynamic) {
        item_after = item_next < num_items ? queue.TakeOne(static_cast<uint32_t>(r)) : INT_MAX;
      } else {
        item_after = CtaItem<kClusterM>(r + 2);
      }
      if (item_after < num_items) {
        after = DecodeWorkItemRow<kItemRows, kClusterM>(p, item_after, hz, group);
      }
      if (!ahead && cur.count > 0) {
        ahead_blk = TileKeyBlock<kItemRows, kTileKeys>(p, cur.row, cur.begin, 0, ahead_mask);
      }
    }
  }
  // Tile e of the current item (called for e = 0, 1, ... in order).
  __device__ __forceinline__ int Tile(int e, int& mask) {
    if constexpr (!kAhead) {
      return TileKeyBlock<kItemRows, kTileKeys>(p, cur.row, cur.begin, e, mask);
    } else {
      const int blk = ahead_blk;
      mask = ahead_mask;
      ahead = false;
      if (e + 1 < cur.count) {
        ahead_blk = TileKeyBlock<kItemRows, kTileKeys>(p, cur.row, cur.begin, e + 1, ahead_mask);
      } else if (item_next < num_items && next.count > 0) {
        ahead_blk = TileKeyBlock<kItemRows, kTileKeys>(p, next.row, next.begin, 0, ahead_mask);
        ahead = true;
      }
      return blk;
    }
  }
  __device__ __forceinline__ void NextItem() {
    ++r;
    if constexpr (kAhead) {
      cur = next;
      next = after;
      item = item_next;
      item_next = item_after;
    } else {
      item = CtaItem<kClusterM>(r);
    }
  }
};

// Q of (y, z).
template <typename Elem>
__device__ __forceinline__ const Elem* QBase(const FlashFwdParams& p, int y, int z) {
  const int head = p.head_start + y * p.head_step;
  const auto [batch, seg] = SplitZ(z, p.num_segs);
  return static_cast<const Elem*>(p.q) + batch * p.q_batch_stride + seg * p.q_seg_stride +
         head * p.q_head_stride;
}

// K and V of (y, z): the KV head of query head `head` under grouped-query attention.
template <typename Elem>
__device__ __forceinline__ void KvBase(const FlashFwdParams& p, int y, int z, const Elem*& k,
                                       const Elem*& v) {
  const int head = p.head_start + y * p.head_step;
  const int kv_head = head / p.kv_group;
  const auto [batch, seg] = SplitZ(z, p.num_segs);
  k = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + seg * p.k_seg_stride +
      kv_head * p.k_head_stride;
  v = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + seg * p.v_seg_stride +
      kv_head * p.v_head_stride;
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_TILE_SCHEDULER_CUH_
