// ResidentMemory on a GPU (core/engine/device.h): a block of the device's caching allocator kept
// until the object is destroyed (so it shows in the device's memory figures), written from host
// memory with counted copies.
#ifndef ATTNSERVE_CORE_CUDA_RESIDENT_MEMORY_H_
#define ATTNSERVE_CORE_CUDA_RESIDENT_MEMORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/host_copy.h"
#include "core/engine/device.h"

namespace attnserve {

// `bytes` of GPU `ordinal` from `alloc`. Writes run on the calling thread's per-thread stream and are synchronised before they
// return; their bytes are counted in `copies`. Every pointer must outlive the result.
absl::StatusOr<std::unique_ptr<ResidentMemory>> MakeCudaResidentMemory(
    int ordinal, CachingAllocator& alloc, HostCopyCounters* copies, int64_t bytes);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_RESIDENT_MEMORY_H_
