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

// The kernel of the most recent successful RunAttentionForward launch in this process
// ("sm80" / "sm90"; "none" before the first): lets benches report what ran.
const char* LastFlashKernelName();
void SetLastFlashKernelName(const char* name);

// Launches the sm90 kernel (params validated, FlashFwdSm90Supports true). Returns the launch error.
cudaError_t RunFlashFwdSm90(const FlashFwdParams& params, cudaStream_t stream);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_H_
