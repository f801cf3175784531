// CUDA IPC regions in a build without the CUDA backend (CMake picks this file or
// cuda_ipc_region.cc, so no caller needs an #if).
#include "server/regions/region_registry.h"

namespace attnserve {

absl::StatusOr<std::unique_ptr<Region>> OpenCudaIpcRegion(const std::string&, const std::string&,
                                                          int, int64_t) {
  return absl::FailedPreconditionError(
      "cuda_ipc: CUDA IPC regions need the CUDA backend (this attnserve was built without it)");
}

}  // namespace attnserve
