#include "core/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"

namespace attnserve {
namespace {

// Switches the calling thread to `device` for a scope and back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

size_t CachingAllocator::RoundSize(size_t bytes) {
  constexpr size_t kSmallGranule = 512;
  constexpr size_t kLargeGranule = 2u << 20;
  if (bytes < (1u << 20)) return (bytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  if (bytes < (64u << 20)) return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
  size_t pow2 = 1;
  while (pow2 < bytes) pow2 <<= 1;
  const size_t granule = pow2 / 8;
  return (bytes + granule - 1) / granule * granule;
}

CachingAllocator::CachingAllocator(int device) : device_(device) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
  if (!live_.empty()) {
    std::fprintf(stderr, "CachingAllocator(cuda:%d): %zu blocks still in use at destruction\n",
                 device_, live_.size());
  }
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t limit = limit_.load();
  auto over_limit = [&](size_t block) -> absl::Status {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda:", device_, ": allocating ", block, " bytes would exceed the allocator limit of ",
        limit, " bytes (in use ", in_use_.load(), ")"));
  };
  // Best fit among cached blocks of this class or larger, but no more than 2x (keeps big cached
  // blocks for big requests).
  auto it = free_blocks_.lower_bound(size);
  if (it != free_blocks_.end() && it->first <= 2 * size &&
      (limit <= 0 || in_use_.load() + static_cast<int64_t>(it->first) <= limit)) {
    void* p = it->second;
    const size_t block = it->first;
    free_blocks_.erase(it);
    live_.emplace(p, block);
    const int64_t now = in_use_.fetch_add(static_cast<int64_t>(block)) + static_cast<int64_t>(block);
    AtomicMax(peak_, now);
    cache_hits_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  if (limit > 0 && in_use_.load() + static_cast<int64_t>(size) > limit) return over_limit(size);
  DeviceGuard guard(device_);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, size);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state of the runtime
    EmptyCacheLocked();
    err = cudaMalloc(&p, size);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (err == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", device_, ": out of device memory allocating ", size, " bytes (in use ",
          in_use_.load(), ", reserved ", reserved_.load(), ")"));
    }
    return CudaErrorToStatus(err, "cudaMalloc", __FILE__, __LINE__);
  }
  num_mallocs_.fetch_add(1, std::memory_order_relaxed);
  reserved_.fetch_add(static_cast<int64_t>(size));
  live_.emplace(p, size);
  const int64_t now = in_use_.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
  AtomicMax(peak_, now);
  return p;
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    std::fprintf(stderr, "CachingAllocator(cuda:%d): Free of unknown pointer %p\n", device_, ptr);
    return;
  }
  const size_t size = it->second;
  live_.erase(it);
  in_use_.fetch_sub(static_cast<int64_t>(size));
  free_blocks_.emplace(size, ptr);
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  if (free_blocks_.empty()) return;
  DeviceGuard guard(device_);
  // Cached blocks may still be read by queued work of the last user; wait for the device.
  cudaDeviceSynchronize();
  for (auto& [size, p] : free_blocks_) {
    cudaFree(p);
    reserved_.fetch_sub(static_cast<int64_t>(size));
  }
  free_blocks_.clear();
}

void CachingAllocator::ResetPeak() { peak_.store(in_use_.load()); }

AllocatorStats CachingAllocator::Stats() const {
  AllocatorStats s;
  s.in_use_bytes = in_use_.load();
  s.reserved_bytes = reserved_.load();
  s.peak_bytes = peak_.load();
  s.num_mallocs = num_mallocs_.load();
  s.cache_hits = cache_hits_.load();
  DeviceGuard guard(device_);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    s.free_bytes = static_cast<int64_t>(free_b);
    s.total_bytes = static_cast<int64_t>(total_b);
  } else {
    cudaGetLastError();
  }
  return s;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(CachingAllocator& alloc, size_t bytes) {
  auto p = alloc.Allocate(bytes);
  if (!p.ok()) return p.status();
  DeviceBuffer b;
  b.alloc_ = &alloc;
  b.ptr_ = *p;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    alloc_ = std::exchange(o.alloc_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (alloc_ != nullptr && ptr_ != nullptr) alloc_->Free(ptr_);
  alloc_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace attnserve
