// PinnedHostPool: the CUDA backend's HostMemory. Page-locked host blocks (cudaHostAlloc,
// portable: every GPU of the process copies from them at the bus's rate), cached by size class
// so that a steady stream of requests page-locks nothing after warm-up (cudaHostAlloc costs about
// a millisecond per 100 MiB and cudaFreeHost synchronizes the device). One pool per process
// (ProcessPinnedHostPool), shared by every CudaDevice: page-locked memory is a resource of the
// process, and the pool outlives every tensor allocated from it (it is never destroyed, so a
// tensor released during shutdown still has its pool).
//
// The cap bounds the page-locked bytes the pool holds (in use + cached). A block that would pass
// it is first made room for by freeing cached blocks; if the blocks in use alone would pass it,
// the block comes from pageable memory instead and is counted (fallback_bytes), so the service
// slows down rather than fails, and the metric says so.
//
// Register/Unregister page-lock caller-owned memory (shared-memory regions) with
// cudaHostRegister, counted in registered_bytes.
#ifndef ATTNSERVE_CORE_CUDA_PINNED_HOST_POOL_H_
#define ATTNSERVE_CORE_CUDA_PINNED_HOST_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/tensor/host_memory.h"

namespace attnserve {

class PinnedHostPool final : public HostMemory {
 public:
  // `cap_bytes` <= 0: half of the host's physical memory.
  explicit PinnedHostPool(int64_t cap_bytes = 0);
  ~PinnedHostPool() override;  // frees the cached blocks; blocks in use must be back by then
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  void* Allocate(size_t bytes) override;
  void Free(void* p, size_t bytes) override;
  absl::Status Register(void* p, size_t bytes) override;
  void Unregister(void* p) override;
  bool page_locked() const override { return true; }

  HostMemoryStats stats() const override;
  // <= 0: half of the host's physical memory. Applies to later allocations.
  void set_cap_bytes(int64_t cap_bytes);
  // Frees every cached block (tests, and memory pressure).
  void Trim();

  // The size class a request of `bytes` is served from: 2 MiB granules up to 32 MiB, then four
  // classes per power of two (at most 25% slack).
  static size_t SizeClass(size_t bytes);

 private:
  void TrimLocked(int64_t target_cached) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int64_t cap_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, std::vector<void*>> cached_ ABSL_GUARDED_BY(mu_);  // class -> blocks
  std::unordered_map<void*, size_t> in_use_ ABSL_GUARDED_BY(mu_);     // block -> class
  std::unordered_map<void*, size_t> fallback_ ABSL_GUARDED_BY(mu_);   // pageable blocks
  std::unordered_map<void*, size_t> registered_ ABSL_GUARDED_BY(mu_);
  HostMemoryStats stats_ ABSL_GUARDED_BY(mu_);
};

// The process's pool (created on first use, never destroyed).
PinnedHostPool& ProcessPinnedHostPool();

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_PINNED_HOST_POOL_H_
