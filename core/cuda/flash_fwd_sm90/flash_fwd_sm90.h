// Hopper (sm_90a) block-sparse forward: host API. The kernel (flash_fwd_sm90_kernel.cuh) runs the
// same FlashFwdParams contract as the FA2 kernel (flash_fwd/); RunAttentionForward
// (core/cuda/cuda_attention.cc) picks one of the two per launch through FlashKernelFor.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/statusor.h"
#include "core/cuda/flash_fwd/flash_fwd_params.h"

namespace attnserve {

inline constexpr const char kFlashKernelSm80[] = "sm80";  // flash_fwd (mma.sync), any sm_80+
inline constexpr const char kFlashKernelSm90[] = "sm90";  // flash_fwd_sm90 (wgmma), sm_90a only
// LastFlashKernelName() of an sm90 launch that ran the v2 (warp-specialized) kernel.
inline constexpr const char kFlashKernelSm90V2[] = "sm90v2";
// LastFlashKernelName() of an sm90 launch that ran the v3 (persistent warp-specialized) kernel.
inline constexpr const char kFlashKernelSm90V3[] = "sm90v3";

// True when this build compiled the sm_90a kernels (CMAKE_CUDA_ARCHITECTURES lists 90a).
bool FlashFwdSm90Built();

// Whether the sm90 kernel implements `params` (already validated by RunAttentionForward: head dim,
// block, dtype, strides, grid) in this build. On false, `why` (if given) says what is missing.
// Scope: head dim 64/128, block 64/128, bf16/f16, every layout kind, GQA, strides, segments,
// ragged lengths, position offsets, accumulate mode; it needs only this build to contain sm_90a.
bool FlashFwdSm90Supports(const FlashFwdParams& params, std::string* why = nullptr);

// Compute capability major of the current device is 9 (cached per device).
bool CurrentDeviceIsSm90();

// Which kernel RunAttentionForward runs for params: kFlashKernelSm90 or kFlashKernelSm80.
// ATTNSERVE_FLASH_KERNEL (read per call) = auto (default: sm90 where supported on a 9.x device),
// sm80 (always the FA2 kernel) or sm90 (UNIMPLEMENTED, naming why, where it cannot run; never a
// silent fallback). INVALID_ARGUMENT for any other value.
absl::StatusOr<const char*> FlashKernelFor(const FlashFwdParams& params);

// Which sm90 kernel variant RunFlashFwdSm90 launches: ATTNSERVE_SM90_VARIANT (read per call) =
// v1 (flash_fwd_sm90_kernel.cuh: all threads load with cp.async, __syncthreads per key tile) or
// v2 (flash_fwd_sm90_v2_kernel.cuh: producer warp + per-stage mbarriers, setmaxnreg) or v3
// (flash_fwd_sm90_v3_kernel.cuh: v2 made persistent, grid = #SMs); unset or empty:
// kSm90DefaultVariant. v2 and v3 exist for layout block 128 only: block 64 runs v1 either way.
// FlashKernelFor returns INVALID_ARGUMENT for any other value. v3's grid is min(#SMs, work
// items); ATTNSERVE_SM90_V3_MAX_CTAS = c > 0 caps it further (a test knob: many items per CTA).
// ATTNSERVE_SM90_V3_ORDER = position | head overrides v3's work-item order (default: head-major
// for CSR layouts, position-major for the implicit dense / causal ones).
enum class Sm90Variant { kV1 = 1, kV2 = 2, kV3 = 3 };
// v3 by measurement (H200, 2026-11-22, bench/results/h200-2026-11-22c): with Q on its own
// producer warp it equals v2 dense (4.915 vs 4.917 ms at N=16384), is 2-3% faster at 90% of block
// pairs skipped and 19-20% faster at 99% (0.937 vs 1.152 ms random); all three pass every test.
inline constexpr Sm90Variant kSm90DefaultVariant = Sm90Variant::kV3;
// The variant named by the environment (nullopt-like: false when the value is invalid).
bool Sm90VariantFromEnv(Sm90Variant* variant, std::string* bad_value = nullptr);

// The kernel of the most recent successful RunAttentionForward launch in this process
// ("sm80" / "sm90" / "sm90v2" / "sm90v3"; "none" before the first): lets benches report what
// ran. SetLastFlashKernelName(kFlashKernelSm90) records the variant that this thread's last
// RunFlashFwdSm90 launched ("sm90" for v1, "sm90v2" for v2, "sm90v3" for v3).
const char* LastFlashKernelName();
void SetLastFlashKernelName(const char* name);

// Launches the sm90 kernel (params validated, FlashFwdSm90Supports true). Returns the launch error.
cudaError_t RunFlashFwdSm90(const FlashFwdParams& params, cudaStream_t stream);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_
