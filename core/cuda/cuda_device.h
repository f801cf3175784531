// CudaDevice: the Device the server's worker threads run on a GPU. One per GPU, with
// CudaOptions::lanes lanes: up to that many threads call Run at once, each run holding one lane
// (its own non-blocking stream, timing events and cuDNN handle), so one request's host copies
// overlap another's kernels. The lanes share the caching allocator; a run returns its blocks only
// once its stream is idle (a plan keeps its workspaces until it is destroyed, after the run has
// synchronized). RunTask takes every lane and runs on lane 0's stream; RunLaneTask takes one lane
// and runs on its stream, beside the other lanes' runs. Run binds the
// calling thread to the GPU; Stats() may be called from any thread.
//
// Engine choice (Run, per CudaOptions::engine; core/cuda/cuda_options.h describes the modes): dense
// and window specs (causal or not) in f16/bf16, and f32 after the on-device f32 -> bf16
// conversion, run on cuDNN's fused attention (core/cuda/cudnn_sdpa) when the build has it,
// libcudnn loads on this host and cuDNN has an engine for the case; otherwise, and always for
// block_sparse and dilated specs, on core/cuda's own flash_fwd kernels (CudaAttentionPlan). A case cuDNN refuses is remembered per (spec, shape, dtype) so it is not
// retried on every request. RunInfo::engine says which ran ("cudnn" or "flash_fwd"), and
// RunInfo::kernel which flash kernel (FlashKernelName: "sm80", "sm90", "sm90v3", ...) where
// flash_fwd ran. In kCudnn mode a case cuDNN cannot run answers UNAVAILABLE (no libcudnn, or a
// build without cudnn_frontend) or UNIMPLEMENTED (no cuDNN engine for it).
#ifndef ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_
#define ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_options.h"
#include "core/engine/device.h"

namespace attnserve {

// RunInfo::engine values of a CudaDevice.
inline constexpr std::string_view kEngineCudnn = "cudnn";
inline constexpr std::string_view kEngineFlashFwd = "flash_fwd";

// GPUs visible to this process; 0 when there is no driver, no GPU or any CUDA error (never
// crashes, never throws).
int CudaDeviceCount();

// One Device per ordinal (empty = every visible GPU), each running `options` (engine and flash
// kernel; nothing is read from the environment here: callers that honour it pass
// CudaOptionsFromEnv()). Each owns a caching allocator and `options.lanes` streams (and, created on
// first use by each lane, a cuDNN handle per lane). UNAVAILABLE when there is no GPU;
// INVALID_ARGUMENT for an ordinal out of range or lanes < 1.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCudaDevices(
    std::vector<int> ordinals, const CudaOptions& options = {});

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_
