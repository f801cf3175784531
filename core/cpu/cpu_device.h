// The CPU Device: CpuAttention on a thread pool of its own, every buffer charged to its own
// MemoryTracker, which is what the server reports as this device's memory.
#ifndef ATTNSERVE_CORE_CPU_CPU_DEVICE_H_
#define ATTNSERVE_CORE_CPU_CPU_DEVICE_H_

#include <memory>

#include "core/engine/device.h"

namespace attnserve {

// A CPU device: `threads` threads of its own; buffers charged to its own MemoryTracker.
std::unique_ptr<Device> MakeCpuDevice(int index, int threads);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CPU_CPU_DEVICE_H_
