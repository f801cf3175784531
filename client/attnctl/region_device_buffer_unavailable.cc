// --cuda-ipc in an attnctl built without CUDA (CMake picks this file or region_device_buffer.cc).
#include "client/attnctl/regions.h"

namespace attnserve::attnctl {

absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(int, int64_t) {
  return absl::FailedPreconditionError(
      "--cuda-ipc: this attnctl was built without CUDA (use --shm, or build with the CUDA "
      "toolkit)");
}

}  // namespace attnserve::attnctl
