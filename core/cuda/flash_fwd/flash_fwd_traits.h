// Compile-time tile sizes of the flash_fwd family, each with the reason it was chosen.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_TRAITS_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_TRAITS_H_

namespace attnserve {

template <int kHeadDim_, int kBlockM_, typename Elem_, int kRowsPerWarp_ = 16, int kSubN_ = 64,
          bool kQInRegs_ = true, int kMinBlocksPerSm_ = 1>
struct FlashFwdTraits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with a swizzle of 8 16-byte chunks");

  // Query tile = the layout's block size (64 or 128), so one CTA owns exactly one CSR row and
  // walks its kept key blocks with no cross-CTA reduction.
  static constexpr int kBlockM = kBlockM_;
  static_assert(kBlockM == 64 || kBlockM == 128, "layout block sizes are 64 or 128");

  // A warp owns kRowsPerWarp query rows as 1 or 2 MMA row fragments of 16: its softmax
  // statistics stay in its own registers (2 rows per fragment per thread, reduced over a quad with
  // two shuffles), so no inter-warp reduction is needed. Two fragments share every K/V ldmatrix
  // (half the shared-memory traffic per MMA) at twice the O accumulator registers; which wins
  // depends on the head dim and tile (FlashFwdConfig below records the measurements).
  static constexpr int kRowsPerWarp = kRowsPerWarp_;
  static_assert(kRowsPerWarp == 16 || kRowsPerWarp == 32, "one or two MMA row fragments");
  static constexpr int kMFrags = kRowsPerWarp / 16;
  static constexpr int kNWarps = kBlockM / kRowsPerWarp;
  static constexpr int kNThreads = kNWarps * 32;

  // Key tile of 64: a 128-token layout block is walked as two 64-key tiles with the same mask
  // kind. 64 keys keep the score tile at 32 f32 registers per thread (8 n-tiles x 4); 128 would
  // double that and push D=128 into spills.
  static constexpr int kBlockN = 64;

  // K/V pipeline depth (cp.async stages). D=128: Q (32 KB at kBlockM=128) + 2 x (K+V 32 KB) =
  // 96 KB, so two CTAs fit on an SM (227 KB); a third stage would cost 32 KB and that second CTA,
  // whose MMAs are what hide one CTA's softmax and barrier gaps. D=64 tiles are half the bytes,
  // so three stages fit in 64 KB.
  static constexpr int kStages = kHeadDim == 64 ? 3 : 2;

  // Shared memory rows are kHeadDim elements = kHeadDim / 8 chunks of 16 bytes; chunk c of row r
  // is stored at c ^ (r & 7) (an XOR swizzle), so the 8 row addresses of each ldmatrix phase and
  // the 16-byte cp.async stores of a warp land in 8 distinct 4-bank groups: no bank conflicts
  // without padding.
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kQTileElems = kBlockM * kHeadDim;   // (kBlockM, kHeadDim)
  static constexpr int kKVTileElems = kBlockN * kHeadDim;  // (kBlockN, kHeadDim)
  static constexpr int kSmemBytes =
      static_cast<int>(sizeof(Elem)) * (kQTileElems + 2 * kStages * kKVTileElems);

  // Score sub-tile: the 64-key tile is multiplied, masked and soft-maxed kSubN keys at a time
  // (kSubN / 2 f32 score registers per thread).
  static constexpr int kSubN = kSubN_;
  static_assert(kSubN == 32 || kSubN == 64, "score sub-tile of 32 or 64 keys");
  // Q fragments kept in registers for the whole key loop (kHeadDim / 4 registers), or re-read
  // from shared memory with ldmatrix at every k-step (fewer registers, more shared traffic).
  static constexpr bool kQInRegs = kQInRegs_;
  // __launch_bounds__ minimum CTAs per SM: 2 caps registers at 65536 / (2 * kNThreads).
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
};

// The configuration each (head dim, layout block) runs with. Chosen by timing every candidate on
// an H200 (dense bf16, N = 16384, Hq = 16, one CTA per (query block, head); 2026-11-22):
//   D=128 M=128: 32 rows/warp (4 warps), Q from smem, 2 CTAs/SM  298 TFLOP/s (causal 267); the
//                16-rows/warp, Q-in-registers layout ran 276 (262): two row fragments per warp
//                halve the K/V ldmatrix traffic per MMA, which outweighs the ~160 B of spills.
//   D=128 M=64:  16 rows/warp (4 warps), Q in registers          278 (266); 32 rows/warp with
//                2 warps ran 180.
//   D=64  M=128: 32 rows/warp (4 warps), Q from smem, 2 CTAs/SM  293 (257); 16 rows/warp 220.
//   D=64  M=64:  16 rows/warp (4 warps), Q in registers, 3/SM    240 (226).
template <int kHeadDim, int kBlockM, typename Elem>
struct FlashFwdConfig;
template <typename Elem>
struct FlashFwdConfig<128, 128, Elem> {
  using Traits = FlashFwdTraits<128, 128, Elem, /*rows/warp*/ 32, /*subN*/ 64, /*QInRegs*/ false,
                                /*min CTAs/SM*/ 2>;
};
template <typename Elem>
struct FlashFwdConfig<128, 64, Elem> {
  using Traits = FlashFwdTraits<128, 64, Elem, 16, 64, true, 1>;
};
template <typename Elem>
struct FlashFwdConfig<64, 128, Elem> {
  using Traits = FlashFwdTraits<64, 128, Elem, 32, 64, false, 2>;
};
template <typename Elem>
struct FlashFwdConfig<64, 64, Elem> {
  using Traits = FlashFwdTraits<64, 64, Elem, 16, 64, true, 3>;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_TRAITS_H_
