// CudaDevice: the Device the server's worker threads run on a GPU. One per GPU; only its worker
// thread calls Run (which binds the thread to the GPU); Stats() may be called from any thread.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_
#define ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/device.h"

namespace attnserve {

// GPUs visible to this process; 0 when there is no driver, no GPU or any CUDA error (never
// crashes, never throws).
int CudaDeviceCount();

// One Device per ordinal (empty = every visible GPU). Each owns a stream and a caching allocator.
// UNAVAILABLE when there is no GPU; INVALID_ARGUMENT for an ordinal out of range.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCudaDevices(std::vector<int> ordinals);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_DEVICE_H_
