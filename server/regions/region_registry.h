// Shared-memory regions of callers on the same host (Triton's system and CUDA shared-memory
// extensions): a caller registers memory once under a name, then names byte ranges of it in
// AttendHeader instead of streaming Q/K/V and O/LSE through gRPC.
//
// Ownership: the registry holds each registered region; a request takes a lease (a shared_ptr)
// on every region it names, for as long as its tensors live. Unregister only marks a region as
// closing (new leases are refused with FAILED_PRECONDITION "region X is being unregistered") and
// drops the registry's hold; the memory is unmapped when the last lease goes, so a request in
// flight never reads or writes unmapped memory. The name stays taken until then.
//
// Identity: every method takes `owner`, the caller's identity (its principal's name, server/auth/;
// "" for every caller without a token file). Each owner has its own namespace of names: Acquire,
// Unregister and List see only the owner's regions (another owner's is NOT_FOUND), and two owners
// may each register a region of the same name.
#ifndef ATTNSERVE_SERVER_REGIONS_REGION_REGISTRY_H_
#define ATTNSERVE_SERVER_REGIONS_REGION_REGISTRY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor/host_memory.h"

namespace attnserve {

enum class RegionKind { kSystem = 0, kCudaIpc = 1 };
inline constexpr int kNumRegionKinds = 2;
// "system", "cuda_ipc" (the metrics' `kind` label and RegionStatus.kind).
std::string_view RegionKindName(RegionKind kind);

// What the registry reports about one region.
struct RegionInfo {
  std::string name;
  std::string owner;
  RegionKind kind = RegionKind::kSystem;
  int64_t bytes = 0;
  std::string shm_key;  // system
  int64_t offset = 0;   // system: offset inside the shm object
  int device = -1;      // cuda_ipc
  int64_t leases = 0;
  bool closing = false;
  bool page_locked = false;
};

// Mapped memory of one region; the destructor unmaps it. Thread-safe for copies to disjoint
// ranges.
class Region {
 public:
  Region(std::string name, RegionKind kind, int64_t bytes)
      : name_(std::move(name)), kind_(kind), bytes_(bytes) {}
  virtual ~Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::string& name() const { return name_; }
  RegionKind kind() const { return kind_; }
  int64_t bytes() const { return bytes_; }
  // Host-mapped regions: the first byte (valid while the Region lives). Null for device memory.
  virtual std::byte* host_data() { return nullptr; }
  // Device regions (CUDA IPC): the first byte in the memory of GPU device(), valid while the
  // Region lives; null and -1 for host regions.
  virtual std::byte* device_data() { return nullptr; }
  virtual int device() const { return -1; }
  // Copies bytes [offset, offset + n) of the region to host memory `dst`, or host memory `src`
  // into them (host regions: memcpy; CUDA IPC regions: cudaMemcpy). The range must be inside.
  virtual absl::Status CopyOut(int64_t offset, void* dst, int64_t n) = 0;
  virtual absl::Status CopyIn(int64_t offset, const void* src, int64_t n) = 0;
  // OK while the memory can be used; FAILED_PRECONDITION when it cannot any more (a shm object
  // that its creator shrank below the region: reading it would fault).
  virtual absl::Status CheckUsable() const { return absl::OkStatus(); }
  // Kind-specific fields of RegionInfo (shm_key, offset, device, page_locked).
  virtual void Describe(RegionInfo* info) const = 0;

 private:
  std::string name_;
  RegionKind kind_;
  int64_t bytes_;
};
using RegionLease = std::shared_ptr<Region>;

// Maps a POSIX shared memory object: shm_open(shm_key, O_RDWR), fstat (at least offset + bytes),
// mmap of [offset, offset + bytes) read-write, and `host_memory->Register` of the mapping
// (page-locked on CUDA hosts; when that fails the region stays usable, pageable). Errors name the
// request fields ("system.shm_key: ...").
absl::StatusOr<std::unique_ptr<Region>> OpenSystemRegion(const std::string& name,
                                                         const std::string& shm_key,
                                                         int64_t offset, int64_t bytes,
                                                         HostMemory* host_memory);
// Opens a cudaIpcMemHandle_t (its raw bytes) on CUDA device `device`. Built from
// cuda_ipc_region.cc with the CUDA backend; without it (cuda_ipc_region_unavailable.cc) always
// FAILED_PRECONDITION "CUDA IPC regions need the CUDA backend".
absl::StatusOr<std::unique_ptr<Region>> OpenCudaIpcRegion(const std::string& name,
                                                          const std::string& handle, int device,
                                                          int64_t bytes);

struct RegionRegistryOptions {
  int max_regions = 64;  // registered plus closing-but-still-mapped; RESOURCE_EXHAUSTED past it
  // Page-locks system regions for device copies (the devices' host memory). Not owned; may be
  // null (nothing is registered). Must outlive every region.
  HostMemory* host_memory = nullptr;
};

struct UnregisterOutcome {
  bool in_use = false;  // leases were held when it was marked: unmapped when the last goes
  int64_t leases = 0;
};

// Mapped regions and their bytes by kind (the attnserve_regions / attnserve_region_bytes gauges).
struct RegionTotals {
  std::array<int64_t, kNumRegionKinds> regions{};
  std::array<int64_t, kNumRegionKinds> bytes{};
};

class RegionRegistry {
 public:
  virtual ~RegionRegistry() = default;
  // INVALID_ARGUMENT for a bad name (1 to 128 of [A-Za-z0-9_.-]) or size; ALREADY_EXISTS for a
  // name in use (closing ones included); RESOURCE_EXHAUSTED at max_regions; then the open's error.
  virtual absl::StatusOr<RegionInfo> RegisterSystem(const std::string& owner,
                                                    const std::string& name,
                                                    const std::string& shm_key, int64_t offset,
                                                    int64_t bytes) = 0;
  virtual absl::StatusOr<RegionInfo> RegisterCudaIpc(const std::string& owner,
                                                     const std::string& name,
                                                     const std::string& handle, int device,
                                                     int64_t bytes) = 0;
  // Marks the region closing and drops the registry's hold. NOT_FOUND when not registered,
  // FAILED_PRECONDITION when already closing.
  virtual absl::StatusOr<UnregisterOutcome> Unregister(const std::string& owner,
                                                       const std::string& name) = 0;
  // Sorted by name; closing regions that are still mapped are listed with closing = true.
  virtual std::vector<RegionInfo> List(const std::string& owner) = 0;
  // A lease for one request: NOT_FOUND "no region named 'x'", FAILED_PRECONDITION "region x is
  // being unregistered" (or no longer usable).
  virtual absl::StatusOr<RegionLease> Acquire(const std::string& owner,
                                              const std::string& name) = 0;
  // Thread-safe; what the metrics read on each scrape.
  virtual RegionTotals Totals() const = 0;
  // Drops every registration (server shutdown); leases still held keep their regions mapped
  // until they are released.
  virtual void ReleaseAll() = 0;
};

std::unique_ptr<RegionRegistry> MakeRegionRegistry(const RegionRegistryOptions& options);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REGIONS_REGION_REGISTRY_H_
