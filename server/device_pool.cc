#include "server/device_pool.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/cpu/cpu_device.h"

#if defined(ATTNSERVE_HAVE_CUDA)
#include "core/cuda/cuda_device.h"
#endif

namespace attnserve {
namespace {

absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCpuDevices(
    const DevicePoolOptions& options) {
  if (options.cpu_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-workers: must be >= 1, got ", options.cpu_workers));
  }
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpu-threads: must be >= 0 (0: cores / workers), got ", options.cpu_threads));
  }
  std::vector<int> indices;
  if (options.devices) {
    for (int i : *options.devices) {
      if (i >= options.cpu_workers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--devices: cpu:", i, " does not exist (--cpu-workers=", options.cpu_workers,
            " gives cpu:0 .. cpu:", options.cpu_workers - 1, ")"));
      }
      indices.push_back(i);
    }
  } else {
    for (int i = 0; i < options.cpu_workers; ++i) indices.push_back(i);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = options.cpu_threads > 0
                          ? options.cpu_threads
                          : std::max(1, cores / static_cast<int>(indices.size()));
  std::vector<std::unique_ptr<Device>> devices;
  for (int i : indices) devices.push_back(MakeCpuDevice(i, threads));
  return devices;
}

#if defined(ATTNSERVE_HAVE_CUDA)
absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCuda(const DevicePoolOptions& options) {
  const int count = CudaDeviceCount();
  std::vector<int> ordinals;
  if (options.devices) {
    for (int i : *options.devices) {
      if (i >= count) {
        return absl::InvalidArgumentError(
            absl::StrCat("--devices: cuda:", i, " does not exist (", count, " GPUs visible)"));
      }
      ordinals.push_back(i);
    }
  } else {
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  }
  if (ordinals.empty()) {
    return absl::FailedPreconditionError("--backend=cuda: no CUDA device is visible");
  }
  return MakeCudaDevices(ordinals, options.cuda);
}
#endif

}  // namespace

absl::StatusOr<BackendChoice> ParseBackendChoice(absl::string_view text) {
  if (text == "auto") return BackendChoice::kAuto;
  if (text == "cpu") return BackendChoice::kCpu;
  if (text == "cuda") return BackendChoice::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: must be auto, cpu or cuda, got \"", text, "\""));
}

absl::StatusOr<std::vector<int>> ParseDeviceList(absl::string_view text) {
  std::vector<int> out;
  absl::flat_hash_set<int> seen;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    int i = -1;
    if (!absl::SimpleAtoi(part, &i) || i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: \"", part, "\" is not a device index (e.g. --devices=0,1)"));
    }
    if (!seen.insert(i).second) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: ", i, " listed twice"));
    }
    out.push_back(i);
  }
  if (out.empty()) return absl::InvalidArgumentError("--devices: empty list");
  return out;
}

bool CudaBackendBuilt() {
#if defined(ATTNSERVE_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(const DevicePoolOptions& options) {
  BackendKind kind = BackendKind::kCpu;
  switch (options.backend) {
    case BackendChoice::kCpu:
      kind = BackendKind::kCpu;
      break;
    case BackendChoice::kCuda:
      if (!CudaBackendBuilt()) {
        return absl::FailedPreconditionError(
            "--backend=cuda: this attnserve was built without the CUDA backend (no nvcc at "
            "configure time, or -DATTNSERVE_ENABLE_CUDA=OFF); use --backend=cpu or rebuild with "
            "CUDA");
      }
      kind = BackendKind::kCuda;
      break;
    case BackendChoice::kAuto:
#if defined(ATTNSERVE_HAVE_CUDA)
      kind = CudaDeviceCount() > 0 ? BackendKind::kCuda : BackendKind::kCpu;
#else
      kind = BackendKind::kCpu;
#endif
      break;
  }
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices = absl::InternalError("no backend");
  if (kind == BackendKind::kCpu) {
    devices = MakeCpuDevices(options);
  } else {
#if defined(ATTNSERVE_HAVE_CUDA)
    devices = MakeCuda(options);
#endif
  }
  if (!devices.ok()) return devices.status();
  return FromDevices(*std::move(devices));
}

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::FromDevices(
    std::vector<std::unique_ptr<Device>> devices) {
  if (devices.empty()) return absl::InvalidArgumentError("device pool: no devices");
  const BackendKind kind = devices.front()->kind();
  for (const auto& d : devices) {
    if (d->kind() != kind) {
      return absl::InvalidArgumentError(absl::StrCat("device pool: ", d->name(), " is not a ",
                                                     std::string(BackendName(kind)), " device"));
    }
  }
  return std::unique_ptr<DevicePool>(new DevicePool(kind, std::move(devices)));
}

std::vector<const Device*> DevicePool::devices() const {
  std::vector<const Device*> out;
  for (const auto& d : devices_) out.push_back(d.get());
  return out;
}

}  // namespace attnserve
