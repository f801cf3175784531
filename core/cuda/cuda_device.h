// CudaDevice: the Device the server's worker threads run on a GPU. One per GPU; only its worker
// thread calls Run (which binds the thread to the GPU); Stats() may be called from any thread.
//
// Engine choice (Run): dense and window specs (causal or not) in f16/bf16, and f32 after the
// on-device f32 -> bf16 conversion, run on cuDNN's fused attention (core/cuda/cudnn_sdpa) when
// the build has it, libcudnn loads on this host and cuDNN has an engine for the case; otherwise,
// and always for block_sparse and dilated specs, on core/cuda's own flash_fwd kernels
// (CudaAttentionPlan). A case cuDNN refuses is remembered per (spec, shape, dtype) so it is not
// retried on every request. RunInfo::engine says which ran ("cudnn" or "flash_fwd").
#ifndef ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_
#define ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/engine/device.h"

namespace attnserve {

class CachingAllocator;  // core/cuda/caching_allocator.h

// Which attention engine a CudaDevice runs dense/window specs on.
//   kAuto:  cuDNN where it can run the case and our kernels could too (so a cuDNN refusal always
//           has a fallback, and what the service accepts does not depend on the host's libcudnn);
//           our kernels otherwise.
//   kOwn:   our flash_fwd kernels only (cuDNN is never loaded).
//   kCudnn: cuDNN for every dense/window case it is meant for (CudnnSdpaSupports); no fallback:
//           Run answers UNAVAILABLE (no libcudnn, or a build without cudnn_frontend) or
//           UNIMPLEMENTED (no cuDNN engine for the case). block_sparse/dilated still run on ours.
enum class AttentionEngine { kAuto, kOwn, kCudnn };

// "auto", "own", "cudnn".
std::string_view AttentionEngineName(AttentionEngine engine);
// Parses the names above; INVALID_ARGUMENT naming `what` (e.g. the env var) otherwise.
absl::StatusOr<AttentionEngine> ParseAttentionEngine(std::string_view name,
                                                     std::string_view what = "engine");

// RunInfo::engine values of a CudaDevice.
inline constexpr std::string_view kEngineCudnn = "cudnn";
inline constexpr std::string_view kEngineFlashFwd = "flash_fwd";

// The environment variable read when CudaDeviceOptions::engine is unset (auto|own|cudnn; unset or
// empty means auto).
inline constexpr char kAttentionEngineEnv[] = "ATTNSERVE_ATTENTION_ENGINE";

struct CudaDeviceOptions {
  // Unset: $ATTNSERVE_ATTENTION_ENGINE, else kAuto.
  std::optional<AttentionEngine> engine;
};

// GPUs visible to this process; 0 when there is no driver, no GPU or any CUDA error (never
// crashes, never throws).
int CudaDeviceCount();

// One Device per ordinal (empty = every visible GPU). Each owns a stream and a caching allocator
// (and, created on first use on its worker thread, a cuDNN handle). UNAVAILABLE when there is no
// GPU; INVALID_ARGUMENT for an ordinal out of range or a bad $ATTNSERVE_ATTENTION_ENGINE.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCudaDevices(
    std::vector<int> ordinals, const CudaDeviceOptions& options = {});

// What a task run on a CudaDevice's worker thread may use (RunCudaDeviceTask).
struct CudaTaskContext {
  int ordinal = 0;  // the GPU; the calling thread is bound to it for the task
  // The device's caching allocator: what the task allocates through it shows in the device's
  // Stats() (memory in use / peak), so in the metrics, exactly like Run's own buffers.
  CachingAllocator* allocator = nullptr;
  // The device's stream (non-blocking), the one Run enqueues on.
  cudaStream_t stream = nullptr;
};

// Runs `task` on the calling thread, which must be `device`'s worker thread (the only thread that
// calls its Run), bound to the GPU, with the device's allocator and stream: the server runs one
// rank of a GPU ring this way (one rank per device, each on its own worker). Whatever the task
// returns, the stream is synchronized afterwards and the CUDA error state cleared, so memory the
// task freed is safe to reuse and the next request starts clean. The bytes the task allocates are
// counted by the allocator itself (no separate charge). INVALID_ARGUMENT when `device` is not one
// of MakeCudaDevices's.
absl::Status RunCudaDeviceTask(Device& device,
                               const std::function<absl::Status(CudaTaskContext&)>& task);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_
