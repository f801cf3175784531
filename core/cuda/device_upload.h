// Host vectors (layout metadata: O(blocks)) into fresh device buffers, through a page-locked
// staging block so that no request path copies from pageable memory. Internal to core/cuda.
#ifndef ATTNSERVE_CORE_CUDA_DEVICE_UPLOAD_H_
#define ATTNSERVE_CORE_CUDA_DEVICE_UPLOAD_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/util/status_macros.h"

namespace attnserve {

// Synchronous w.r.t. the staging block, which goes back to the pool when the copy is done.
template <typename T>
absl::StatusOr<DeviceBuffer> UploadVector(CachingAllocator& alloc, const std::vector<T>& host,
                                          cudaStream_t stream) {
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer buf,
                        DeviceBuffer::Create(alloc, std::max<size_t>(1, host.size()) * sizeof(T)));
  if (!host.empty()) {
    const size_t bytes = host.size() * sizeof(T);
    PinnedHostPool& pinned = ProcessPinnedHostPool();
    void* staging = pinned.Allocate(bytes);
    if (staging == nullptr) return absl::ResourceExhaustedError("layout upload: no host memory");
    std::memcpy(staging, host.data(), bytes);
    const cudaError_t copy = cudaMemcpyAsync(buf.get(), staging, bytes, cudaMemcpyHostToDevice,
                                             stream);
    const cudaError_t sync = copy == cudaSuccess ? cudaStreamSynchronize(stream) : copy;
    pinned.Free(staging, bytes);
    CUDA_RETURN_IF_ERROR(sync);
  }
  return buf;
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_DEVICE_UPLOAD_H_
