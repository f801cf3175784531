// DevicePool: the devices this server process owns, built once at start from the flags
// (--backend, --devices, --cpu-workers, --cpu-threads). The scheduler runs one worker thread per
// device; nothing else calls Device::Run.
#ifndef ATTNSERVE_SERVER_DEVICE_POOL_H_
#define ATTNSERVE_SERVER_DEVICE_POOL_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/cuda/cuda_options.h"
#include "core/engine/device.h"

namespace attnserve {

enum class BackendChoice { kAuto, kCpu, kCuda };

// "auto", "cpu", "cuda"; INVALID_ARGUMENT otherwise.
absl::StatusOr<BackendChoice> ParseBackendChoice(absl::string_view text);
// "1,3" -> {1, 3}; INVALID_ARGUMENT on anything but non-negative integers without duplicates.
absl::StatusOr<std::vector<int>> ParseDeviceList(absl::string_view text);

// Whether this binary was built with the CUDA backend (ATTNSERVE_HAVE_CUDA).
bool CudaBackendBuilt();

struct DevicePoolOptions {
  BackendChoice backend = BackendChoice::kAuto;  // auto: cuda when a GPU is present, else cpu
  std::optional<std::vector<int>> devices;       // indices to use; nullopt: all
  int cpu_workers = 1;                           // CPU devices (cpu:0 .. cpu:N-1)
  int cpu_threads = 0;                           // threads per CPU device; 0: cores / workers
  CudaOptions cuda;                              // engine and kernel choices of CUDA devices
};

class DevicePool {
 public:
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(const DevicePoolOptions& options);
  // Adopts ready-made devices (tests). All must share one backend; at least one.
  static absl::StatusOr<std::unique_ptr<DevicePool>> FromDevices(
      std::vector<std::unique_ptr<Device>> devices);

  BackendKind backend() const { return backend_; }
  size_t size() const { return devices_.size(); }
  Device& device(size_t i) { return *devices_[i]; }
  const Device& device(size_t i) const { return *devices_[i]; }
  std::vector<const Device*> devices() const;

 private:
  DevicePool(BackendKind backend, std::vector<std::unique_ptr<Device>> devices)
      : backend_(backend), devices_(std::move(devices)) {}

  BackendKind backend_;
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_DEVICE_POOL_H_
