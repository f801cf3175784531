// A per-device caching allocator: freed blocks go back to size-class free lists and are reused;
// cudaMalloc only on a miss; on an out-of-memory miss the cache is emptied and the cudaMalloc
// retried once. Counts bytes in use (handed out), reserved (held from CUDA, in use or cached) and
// the peak of in use, with atomics, so metrics threads can read Stats() while a worker allocates.
//
// Sizes are rounded up to a class: 512 B granules below 1 MiB, 2 MiB granules below 64 MiB, and
// 1/8 of the next power of two above (at most 12.5% slack), so reuse hits across requests of
// slightly different shapes without unbounded waste.
#ifndef ATTNSERVE_CORE_CUDA_CACHING_ALLOCATOR_H_
#define ATTNSERVE_CORE_CUDA_CACHING_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve {

struct AllocatorStats {
  int64_t in_use_bytes = 0;    // handed out and not yet freed (rounded sizes)
  int64_t reserved_bytes = 0;  // obtained from cudaMalloc and not yet returned to CUDA
  int64_t peak_bytes = 0;      // peak of in_use_bytes since construction or ResetPeak
  int64_t total_bytes = 0;     // cudaMemGetInfo total (0 if it failed)
  int64_t free_bytes = 0;      // cudaMemGetInfo free
  int64_t num_mallocs = 0;     // cudaMalloc calls made
  int64_t cache_hits = 0;      // allocations served from the cache
};

class CachingAllocator {
 public:
  // Allocations are made on `device` (the caller's thread is switched to it for the call).
  explicit CachingAllocator(int device);
  ~CachingAllocator();  // returns every cached block to CUDA; blocks still in use leak (logged)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Device memory of at least `bytes` (256-byte aligned); RESOURCE_EXHAUSTED when even an
  // emptied cache cannot satisfy it. bytes == 0 returns nullptr.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // Returns ptr (from Allocate) to the cache. Work still queued on a stream may use the block:
  // callers free only after synchronizing the stream that used it (single-stream use per device).
  void Free(void* ptr);
  // Returns every cached (free) block to CUDA.
  void EmptyCache();
  void ResetPeak();
  // Hard cap on in-use bytes (rounded sizes; 0 = none): an Allocate that would take in_use above
  // it answers RESOURCE_EXHAUSTED without calling CUDA. Emulates a smaller device (benchmarks).
  void set_limit(int64_t bytes) { limit_.store(bytes); }
  int64_t limit() const { return limit_.load(); }
  // Thread-safe.
  AllocatorStats Stats() const;
  int device() const { return device_; }

  static size_t RoundSize(size_t bytes);

 private:
  void EmptyCacheLocked();

  const int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;    // size class -> cached block
  std::unordered_map<void*, size_t> live_;      // handed-out block -> size class
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> reserved_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_mallocs_{0};
  std::atomic<int64_t> cache_hits_{0};
  std::atomic<int64_t> limit_{0};
};

// A device buffer owned by a CachingAllocator; freed back to it on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Create(CachingAllocator& alloc, size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }
  void Reset();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  CachingAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CACHING_ALLOCATOR_H_
