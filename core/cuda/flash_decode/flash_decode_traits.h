// Compile-time tile sizes of the flash_decode family, each with the reason it was chosen.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_TRAITS_H_
#define ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_TRAITS_H_

namespace attnserve {

// kMTiles: 16-row MMA tiles of packed query rows (1, 2 or 4: up to 16, 32 or 64 rows).
template <int kHeadDim_, typename Elem_, int kMTiles_>
struct FlashDecodeTraits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with a swizzle of 8 16-byte chunks");
  static constexpr int kMTiles = kMTiles_;
  static_assert(kMTiles == 1 || kMTiles == 2 || kMTiles == 4, "16, 32 or 64 packed rows");
  static constexpr int kRows = kMTiles * 16;

  // Four warps. They split the CTA's rows into kWarpsM tiles of kRowsPerWarp and each K/V tile's
  // keys into kWarpsN slices: with 16 rows (decode of one token, GQA 4) every warp still has keys
  // to multiply. The slices merge by LSE in shared memory after the key loop. One 16-row MMA
  // fragment per warp (kMFrags = 1): two per warp for 64 rows (2 x 2 warps, every K/V fragment read
  // from shared memory feeding both, Q then re-read from shared memory for lack of registers) was
  // measured slower on an H200 (128K keys, 16 tokens x GQA 4: 0.179 vs 0.170 ms; 1M: 1.20-1.22 vs
  // 1.05-1.11 ms; bench/results/h200-2026-11-25-decode/tuning.md), so the code keeps kMFrags
  // general but uses 1.
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kMFrags = 1;
  static constexpr int kRowsPerWarp = 16 * kMFrags;
  static constexpr int kWarpsM = kMTiles / kMFrags;
  static constexpr int kWarpsN = kNWarps / kWarpsM;

  // Key tile of 64 rows per pipeline stage (K and V: 32 KB at D=128); a warp's slice is kSubN keys.
  static constexpr int kBlockN = 64;
  static constexpr int kSubN = kBlockN / kWarpsN;  // 16, 32 or 64

  // The kernel is a stream over K and V: it is fast when enough bytes are in flight per SM to
  // cover the memory latency (~4.4 TB/s x ~1 us over 132 SMs: ~33 KB). D=128: Q (up to 16 KB) and
  // three stages of 32 KB are 112 KB, two CTAs per SM, four tiles (128 KB) in flight per SM.
  // D=64: four stages of 16 KB and Q (8 KB), three CTAs per SM.
  static constexpr int kStages = kHeadDim == 64 ? 4 : 3;

  // The flash_fwd helpers this family reuses (ComputeScores, SoftmaxStep, AccumulatePV,
  // LoadTile) also read kMFrags and kRowsPerWarp above, and whether Q stays in registers: with one
  // fragment (32 registers at D=128) it does; with two, the O accumulators (128 registers) would
  // leave no room for 64 more.
  static constexpr bool kQInRegs = kMFrags == 1;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of a row (XOR swizzle)

  static constexpr int kQTileElems = kRows * kHeadDim;     // (kRows, kHeadDim)
  static constexpr int kKVTileElems = kBlockN * kHeadDim;  // (kBlockN, kHeadDim)
  static constexpr int kSmemBytes =
      static_cast<int>(sizeof(Elem)) * (kQTileElems + 2 * kStages * kKVTileElems);
  // The epilogue reuses the K/V stages: every warp's (16, kHeadDim) f32 O slab, plus per-row max
  // and sum of every slice.
  static constexpr int kEpilogueBytes = kNWarps * 16 * kHeadDim * 4 + 2 * kWarpsN * kRows * 4;
  static_assert(kEpilogueBytes <= static_cast<int>(sizeof(Elem)) * 2 * kStages * kKVTileElems,
                "the epilogue fits in the K/V stages");
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_TRAITS_H_
