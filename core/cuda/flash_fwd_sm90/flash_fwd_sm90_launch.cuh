// flash_fwd_sm90 launch: grid, shared memory and stream for one kernel variant (head dim, dtype,
// consumer warpgroups, key rows per tile). Included by the per-dtype .cu files, which instantiate
// RunFlashFwdSm90PersistentImpl for each variant flash_fwd_sm90.cc may pick.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_LAUNCH_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/cuda/flash_fwd/flash_fwd_params.h"

namespace attnserve {

// The Hopper kernel (flash_fwd_sm90_persistent_kernel.cuh): grid = min(num_sms x CTAs per SM,
// work items); kConsumerWarpgroups 1 with kBlockN 64 is layout block 64, the others block 128.
// head_group: (head, batch * segment) pairs per group of work items, position-major inside a
// group (DecodeItem in flash_fwd_sm90_tile_scheduler.cuh).
// tma: Q, K and V arrive by TMA where MakeSm90TmaMaps can describe them (else by cp.async).
// kConsumerWarpgroups 3: work items of 192 query rows (D = 64, implicit dense / causal layouts,
// TMA loads only); kBlockN 176: K/V tiles of 176 keys (D = 128, implicit layouts, TMA only).
// cudaErrorNotSupported where these do not apply (a CSR layout, no TMA), and the caller runs the
// default kernel (two consumers, 128-key tiles) instead.
// kClusterM 2: clusters of two CTAs on adjacent item rows, each K/V tile loaded once for both
// (TMA multicast; Sm90PersistentTraits): the implicit dense and causal layouts, else
// cudaErrorNotSupported. The grid is as many clusters as the device holds at once
// (cudaOccupancyMaxActiveClusters), at most num_sms / 2.
// kFullTiles: the variant without a mask path (Sm90FullTiles: a CSR of kFull entries or the dense
// non-causal layout, whole key blocks) loaded by TMA, else cudaErrorNotSupported.
// item_counter: two int32 in device memory, 0 before the first launch on `stream` and left 0 by
// every launch (flash_fwd_sm90.cc keeps one pair per stream); non-null: a CSR layout loaded by
// TMA with more than two rounds of items deals them dynamically (ItemQueue in
// flash_fwd_sm90_tile_scheduler.cuh). Null, or any other case: statically.
template <int kHeadDim, typename Elem, int kConsumerWarpgroups = 2, int kBlockN = 128,
          int kClusterM = 1, bool kFullTiles = false>
cudaError_t RunFlashFwdSm90PersistentImpl(const FlashFwdParams& params, int num_sms,
                                          int head_group, bool tma, cudaStream_t stream,
                                          int* item_counter = nullptr);

// The persistent kernel's Q, K and V tensor maps (flash_fwd_sm90.cc): 5-D (head dim, row, head,
// segment, batch) over params' pointers and element strides, 128-byte swizzle, boxes of 64
// columns x `box_rows` rows (Q: `q_box_rows`, 0 = box_rows), rows past the query / key end
// zero-filled. Returns
// cudaErrorNotSupported when TMA cannot address the tensors (a pointer not 16-byte aligned, a
// stride that is not a multiple of 16 bytes, sizes out of range); the caller then loads by
// cp.async. Maps are opaque 128-byte blobs, passed to the kernel by value.
struct Sm90TmaMaps {
  alignas(64) unsigned char q[128];
  alignas(64) unsigned char k[128];
  alignas(64) unsigned char v[128];
};
cudaError_t MakeSm90TmaMaps(const FlashFwdParams& params, int box_rows, Sm90TmaMaps* maps,
                            int q_box_rows = 0);

}  // namespace attnserve

#ifdef __CUDACC__
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_persistent_kernel.cuh"

namespace attnserve {

template <int kHeadDim, typename Elem, int kConsumerWarpgroups, int kBlockN, int kClusterM,
          bool kFullTiles>
cudaError_t RunFlashFwdSm90PersistentImpl(const FlashFwdParams& params, int num_sms,
                                          int head_group, bool tma, cudaStream_t stream,
                                          int* item_counter) {
  using Traits = flash_sm90::Sm90PersistentTraits<kHeadDim, Elem, kConsumerWarpgroups, kBlockN,
                                                  kClusterM, kFullTiles>;
  if (params.block_size != Traits::kLayoutBlock) return cudaErrorInvalidValue;  // a caller bug
  // Items or tiles other than one layout block: implicit layouts and TMA loads only.
  constexpr bool kImplicitOnly = Traits::kImplicitOnly;
  if (kImplicitOnly && (params.col_idx != nullptr || !tma)) return cudaErrorNotSupported;
  // The mask-free tile loop: whole full blocks only, TMA loads only.
  constexpr bool kTmaOnly = kImplicitOnly || kFullTiles;
  if (kFullTiles && (!FlashFwdTilesAllFull(params) || !tma)) return cudaErrorNotSupported;
  // A row order other than the implicit causal layout's own heavy-first walk (which DecodeItem
  // takes without it) would name rows of the layout block, not of a cluster's pair.
  if (kClusterM > 1 && params.row_order != nullptr &&
      !(params.col_idx == nullptr && params.dense_causal)) {
    return cudaErrorNotSupported;
  }
  Sm90TmaMaps maps{};
  // Q in boxes of one consumer warpgroup's 64 rows: each warpgroup's rows load on their own;
  // K / V in boxes of a CTA's share of a tile.
  if (tma && MakeSm90TmaMaps(params, Traits::kBlock / kClusterM, &maps, 64) != cudaSuccess) {
    if (kTmaOnly) return cudaErrorNotSupported;
    tma = false;
  }
  // Tall items, wide tiles and full tiles are instantiated with TMA loads only.
  decltype(&flash_sm90::FlashFwdSm90PersistentKernel<Traits, true>) kernel = nullptr;
  if constexpr (kTmaOnly) {
    kernel = &flash_sm90::FlashFwdSm90PersistentKernel<Traits, true>;
  } else {
    kernel = tma ? &flash_sm90::FlashFwdSm90PersistentKernel<Traits, true>
                 : &flash_sm90::FlashFwdSm90PersistentKernel<Traits, false>;
  }
  const long long item_rows = Traits::kItemRows != 0
                                  ? (params.seqlen + Traits::kBlockM - 1) / Traits::kBlockM
                                  : params.num_q_blocks;
  // With clusters an item is kClusterM item rows (DecodeItem), a grid slot a cluster.
  const long long items = (item_rows + kClusterM - 1) / kClusterM * params.num_heads *
                          params.batch * params.num_segs;
  if (items <= 0) return cudaSuccess;
  if (items > (1LL << 30)) return cudaErrorInvalidValue;  // int item index (+ grid) in the kernel
  CUtensorMap tma_q, tma_k, tma_v;
  static_assert(sizeof(CUtensorMap) == sizeof(maps.k), "an opaque 128-byte map");
  std::memcpy(&tma_q, maps.q, sizeof(tma_q));
  std::memcpy(&tma_k, maps.k, sizeof(tma_k));
  std::memcpy(&tma_v, maps.v, sizeof(tma_v));
  // Grid slots without a cluster (the persistent grid is min(slots, items)).
  [[maybe_unused]] const long long slots = static_cast<long long>(num_sms) * Traits::kCtasPerSm;
  // The dynamic deal where it has something to balance: items past the two dealt rounds.
  if constexpr (Traits::kDynamicDeal) {
    if (item_counter != nullptr && tma && params.col_idx != nullptr && items > 2 * slots) {
      kernel = &flash_sm90::FlashFwdSm90PersistentKernel<Traits, true, true>;
    } else {
      item_counter = nullptr;
    }
  }
  constexpr int kSmem = Traits::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  if constexpr (kClusterM == 1) {
    const unsigned grid = static_cast<unsigned>(items < slots ? items : slots);
#if ATTNSERVE_SM90_STAMPS
    flash_sm90::StampsBeforeLaunch(stream, items);
#endif
    kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params, static_cast<int>(items),
                                                       head_group, tma_q, tma_k, tma_v,
                                                       item_counter);
#if ATTNSERVE_SM90_STAMPS
    flash_sm90::StampsAfterLaunch(stream, items);
#endif
    return cudaGetLastError();
  } else {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kClusterM;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.blockDim = dim3(Traits::kNThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    // Clusters the device runs at once (a cluster's CTAs share a GPC, so this can be below
    // num_sms / kClusterM): a persistent grid larger than that would run a second wave.
    config.gridDim = dim3(static_cast<unsigned>(num_sms / kClusterM * kClusterM));
    // Asked once per device (per variant: this function's own cache).
    static std::atomic<int> cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = -1;
    int resident = dev >= 0 ? cached[dev].load(std::memory_order_relaxed) : 0;
    if (resident <= 0) {
      err = cudaOccupancyMaxActiveClusters(&resident, kernel, &config);
      if (err != cudaSuccess) return err;
      if (dev >= 0) cached[dev].store(resident, std::memory_order_relaxed);
    }
    long long clusters = std::min<long long>(resident, num_sms / kClusterM);
    clusters = std::min(clusters, items);
    if (clusters < 1) return cudaErrorNotSupported;
    config.gridDim = dim3(static_cast<unsigned>(clusters * kClusterM));
    return cudaLaunchKernelEx(&config, kernel, params, static_cast<int>(items), head_group, tma_q,
                              tma_k, tma_v, static_cast<int*>(nullptr));
  }
}

}  // namespace attnserve
#endif  // __CUDACC__

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_LAUNCH_CUH_
