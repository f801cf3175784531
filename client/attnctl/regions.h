// attnctl run/bench --shm and --cuda-ipc: the problem's Q/K/V in memory shared with a server on
// this host (one POSIX shm object, or one cudaMalloc'ed buffer exported with cudaIpcGetMemHandle),
// registered as one region for inputs and outputs; O and LSE are read back from it so --out and
// --check work as over gRPC. The region is unregistered and the memory freed at the end.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_REGIONS_H_
#define ATTNSERVE_CLIENT_ATTNCTL_REGIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "client/attn_client.h"
#include "client/attnctl/flag_parser.h"
#include "client/attnctl/problem.h"
#include "client/shared_memory_region.h"

ABSL_DECLARE_FLAG(int64_t, cuda_device);

namespace attnserve::attnctl {

enum class RegionMode { kNone, kShm, kCudaIpc };

// --shm, --cuda-ipc, --cuda-device.
std::vector<FlagUse> RegionFlags();
// INVALID_ARGUMENT when both are given.
absl::StatusOr<RegionMode> RegionModeFromFlags();

// Device memory shared through CUDA IPC (region_device_buffer.cc in CUDA builds of attnctl,
// region_device_buffer_unavailable.cc otherwise).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual std::string ipc_handle() const = 0;  // the raw cudaIpcMemHandle_t
  virtual absl::Status CopyIn(int64_t offset, const void* src, int64_t n) = 0;
  virtual absl::Status CopyOut(int64_t offset, void* dst, int64_t n) const = 0;
};
// FAILED_PRECONDITION "attnctl was built without CUDA" in CPU builds.
absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(int device, int64_t bytes);

class RegionSession {
 public:
  // Allocates, copies Q/K/V in, poisons the output slots and registers the region.
  static absl::StatusOr<std::unique_ptr<RegionSession>> Start(client::AttnClient& client,
                                                              const Problem& problem,
                                                              RegionMode mode, int device);
  // Unregisters (best effort) and frees the memory.
  ~RegionSession();
  // Points `input` at the region (q, k, v null; o and lse refs set).
  void Apply(client::AttendInput* input) const;
  // Reads O and LSE back into result->o and result->lse.
  absl::Status ReadOutputs(client::AttendResult* result) const;
  // "shm /attnserve_123_0, 12.0 MiB" for the printout.
  std::string Description() const;
  double setup_seconds() const { return setup_seconds_; }

 private:
  RegionSession(client::AttnClient& client, const Problem& problem)
      : client_(client), problem_(problem) {}
  absl::Status CopyIn(int64_t offset, const void* src, int64_t n);
  absl::Status CopyOut(int64_t offset, void* dst, int64_t n) const;

  client::AttnClient& client_;
  const Problem& problem_;
  std::string name_;
  bool registered_ = false;
  std::unique_ptr<client::SharedMemoryRegion> shm_;
  std::unique_ptr<DeviceBuffer> device_;
  int64_t q_ = 0, k_ = 0, v_ = 0, o_ = 0, lse_ = 0, total_ = 0;
  int64_t q_bytes_ = 0, kv_bytes_ = 0, lse_bytes_ = 0;
  double setup_seconds_ = 0;
};

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_REGIONS_H_
