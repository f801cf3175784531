// HostMemory: where a host tensor's bytes come from, and how caller-owned host memory is made
// fast for devices to copy. The CPU backend uses plain memory (PlainHostMemory). The CUDA backend
// supplies page-locked memory from a caching pool (core/cuda/pinned_host_pool.h): copies between
// page-locked host memory and a GPU run at the bus's rate, pageable ones at a fraction of it, so
// every host buffer on a GPU request's path (request Q/K/V, O and LSE, staging) comes from here.
#ifndef ATTNSERVE_CORE_TENSOR_HOST_MEMORY_H_
#define ATTNSERVE_CORE_TENSOR_HOST_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace attnserve {

// What a HostMemory holds (all zero for plain memory).
struct HostMemoryStats {
  int64_t in_use_bytes = 0;      // page-locked blocks handed out
  int64_t cached_bytes = 0;      // page-locked blocks kept for reuse
  int64_t registered_bytes = 0;  // caller memory page-locked with Register
  int64_t fallback_bytes = 0;    // total bytes handed out pageable because of a cap
  int64_t cap_bytes = 0;
  int64_t allocations = 0;  // page-locking allocations made (a steady state makes none)
};

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  // At least `bytes` bytes (64-byte aligned), or nullptr when none can be had. Thread-safe.
  virtual void* Allocate(size_t bytes) = 0;
  // Returns a block from Allocate(bytes). Thread-safe.
  virtual void Free(void* p, size_t bytes) = 0;
  // Makes caller-owned memory [p, p + bytes) page-locked for device copies (a shared-memory
  // region); Unregister undoes it. No-ops where nothing is to be gained (CPU).
  virtual absl::Status Register(void* p, size_t bytes) = 0;
  virtual void Unregister(void* p) = 0;
  // Whether Allocate's blocks are page-locked.
  virtual bool page_locked() const = 0;
  // Thread-safe.
  virtual HostMemoryStats stats() const { return {}; }
};

// Blocks of at least this many bytes are PlainHostMemory mappings of their own.
inline constexpr size_t kPlainHostMmapBytes = size_t{1} << 20;

// Plain (pageable) host memory: the CPU backend's. Blocks of kPlainHostMmapBytes or more (request
// buffers, outputs, workspaces) are anonymous mmap mappings, unmapped on Free, so the memory of a
// finished request goes back to the OS at once instead of staying in malloc's heaps, where
// fragmentation and glibc's sliding mmap threshold would keep it resident (docs/DESIGN.md
// "Hostile streams and memory"). `Free` must get the size given to `Allocate`.
class PlainHostMemory final : public HostMemory {
 public:
  void* Allocate(size_t bytes) override;
  void Free(void* p, size_t bytes) override;
  absl::Status Register(void*, size_t) override { return absl::OkStatus(); }
  void Unregister(void*) override {}
  bool page_locked() const override { return false; }
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_TENSOR_HOST_MEMORY_H_
