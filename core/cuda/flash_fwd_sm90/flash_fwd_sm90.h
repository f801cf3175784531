// Hopper (sm_90a) block-sparse forward: host API, and the choice between it and the sm_80 kernel.
// The kernels (flash_fwd_sm90_*kernel.cuh) run the same FlashFwdParams contract as the FA2 kernel
// (flash_fwd/); RunAttentionForward (core/cuda/cuda_attention.cc) asks FlashKernelFor which one a
// launch runs, from the params and the typed FlashKernelOptions (core/cuda/cuda_options.h).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/flash_fwd/flash_fwd_params.h"

namespace attnserve {

// The kernel one launch runs. FlashKernelName gives the names bench scripts, result files and
// RunInfo::kernel use (kept from the first measurements so that figures stay comparable):
//   kSm80                 "sm80"    flash_fwd (mma.sync, cp.async), any sm_80+
//   kSm90Persistent       "sm90v3"  wgmma, warp-specialized (producer warps + consumer
//                                   warpgroups over a ring of shared-memory stages) on a
//                                   persistent grid
//   kSplitKvDecode        "decode"  flash_decode: a few query rows against many keys, split over
//                                   the keys and merged by LSE (core/cuda/flash_decode), mma.sync
//   kSplitKvDecodeSm90    "decode_sm90"  the same with a wgmma consumer (sm_90a)
// ("sm90" and "sm90v2", in older results, named one-CTA-per-tile Hopper kernels, since removed:
// core/cuda/NOTES.md.)
enum class FlashKernel {
  kSm80,
  kSm90Persistent,
  kSplitKvDecode,
  kSplitKvDecodeSm90
};
std::string_view FlashKernelName(FlashKernel kernel);

// True when this build compiled the sm_90a kernels (CMAKE_CUDA_ARCHITECTURES lists 90a).
bool FlashFwdSm90Built();

// Whether the sm90 kernels implement `params` (already validated by RunAttentionForward: head dim,
// block, dtype, strides, grid) in this build. On false, `why` (if given) says what is missing.
// Scope: the flash_fwd head dims (kFlashFwdHeadDims), block 64/128, bf16/f16, every layout kind,
// GQA, strides, segments, ragged lengths, position offsets, accumulate mode; it needs only this
// build to contain sm_90a.
bool FlashFwdSm90Supports(const FlashFwdParams& params, std::string* why = nullptr);

// Compute capability major of the current device is 9 (cached per device).
bool CurrentDeviceIsSm90();

// Which kernel RunAttentionForward runs for `params` under `options`:
//   arch kAuto: an sm90 kernel where FlashFwdSm90Supports and the current device is 9.x, else sm80;
//   arch kSm80: kSm80;
//   arch kSm90: an sm90 kernel, or UNIMPLEMENTED naming why it cannot run (never a silent
//               fallback).
// The sm90 kernel is kSm90Persistent (options.sm90_schedule's one schedule) at either layout
// block.
absl::StatusOr<FlashKernel> FlashKernelFor(const FlashFwdParams& params,
                                           const FlashKernelOptions& options);

// The persistent schedule's work-item groups (the heuristic; DecodeItem in
// flash_fwd_sm90_tile_scheduler.cuh walks them): (head, batch, segment) pairs per group, the
// items of a group position-major. kPosition: all pairs in one group; kHead: one pair per group;
// kAuto: as many pairs as keep their K and V within half of `l2_bytes` (the CTAs running together
// then re-read K/V from L2, not HBM), at least 1; the implicit causal layout, whose heavy-first
// walk balances the CTAs only over many items, gets one group unless a single pair's K/V fills
// that share (then one pair per group). `ctas` is the persistent grid (kept for the heuristic's
// inputs; the measured rules do not need it yet).
int Sm90HeadGroup(const FlashFwdParams& params, int ctas, int64_t l2_bytes, Sm90ItemOrder order);

// Whether block-128 `params` take the persistent kernel's mask-free variant: a CSR of kFull
// entries (FlashFwdParams::csr_all_full) or the implicit dense non-causal layout, over a key
// length that is a multiple of the block, so that no tile needs a mask.
bool Sm90FullTiles(const FlashFwdParams& params);

// Launches `kernel` (kSm90Persistent, as FlashKernelFor chose it for params) with the variant
// the options and the params' layout pick (flash_fwd_sm90.cc: block 64, 192-row items at D = 64,
// 176-key tiles at D = 128, the mask-free CSR variant (Sm90FullTiles), else two consumers over
// 128-key tiles). Reads
// options.persistent_max_ctas, item_order, persistent_head_group, sm90_query_tile,
// sm90_key_tile and sm90_tma. Returns the launch error.
cudaError_t RunFlashFwdSm90(const FlashFwdParams& params, FlashKernel kernel,
                            const FlashKernelOptions& options, cudaStream_t stream);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_
