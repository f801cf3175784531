#include "core/cuda/pinned_host_pool.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/tensor/tensor.h"

namespace attnserve {

namespace {

constexpr size_t kGranule = size_t{2} << 20;

int64_t HalfOfPhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return int64_t{8} << 30;
  return static_cast<int64_t>(pages) * page / 2;
}

}  // namespace

size_t PinnedHostPool::SizeClass(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes <= 16 * kGranule) return (bytes + kGranule - 1) / kGranule * kGranule;
  // Four classes per power of two: p, 1.25p, 1.5p, 1.75p (p the power of two at or below).
  const size_t p = std::bit_floor(bytes);
  const size_t quarter = p / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

PinnedHostPool::PinnedHostPool(int64_t cap_bytes)
    : cap_bytes_(cap_bytes > 0 ? cap_bytes : HalfOfPhysicalMemory()) {
  stats_.cap_bytes = cap_bytes_;
}

void PinnedHostPool::set_cap_bytes(int64_t cap_bytes) {
  absl::MutexLock lock(&mu_);
  cap_bytes_ = cap_bytes > 0 ? cap_bytes : HalfOfPhysicalMemory();
  stats_.cap_bytes = cap_bytes_;
}

PinnedHostPool& ProcessPinnedHostPool() {
  static PinnedHostPool* const pool = new PinnedHostPool();
  return *pool;
}

PinnedHostPool::~PinnedHostPool() {
  absl::MutexLock lock(&mu_);
  TrimLocked(0);
  for (auto& [p, bytes] : registered_) cudaHostUnregister(p);
}

void* PinnedHostPool::Allocate(size_t bytes) {
  const size_t cls = SizeClass(bytes);
  absl::MutexLock lock(&mu_);
  if (auto it = cached_.find(cls); it != cached_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    in_use_.emplace(p, cls);
    stats_.cached_bytes -= static_cast<int64_t>(cls);
    stats_.in_use_bytes += static_cast<int64_t>(cls);
    return p;
  }
  const int64_t need = static_cast<int64_t>(cls);
  if (stats_.in_use_bytes + need > cap_bytes_) {
    // Over the cap even with nothing cached: pageable, counted.
    void* p = ::operator new (bytes, std::align_val_t{kHostTensorAlignment}, std::nothrow);
    if (p != nullptr) {
      fallback_.emplace(p, bytes);
      stats_.fallback_bytes += static_cast<int64_t>(bytes);
    }
    return p;
  }
  if (stats_.in_use_bytes + stats_.cached_bytes + need > cap_bytes_) {
    TrimLocked(cap_bytes_ - stats_.in_use_bytes - need);
  }
  void* p = nullptr;
  // Portable: page-locked for every device of the process, not only the current one.
  if (cudaHostAlloc(&p, cls, cudaHostAllocPortable) != cudaSuccess || p == nullptr) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    TrimLocked(0);
    if (cudaHostAlloc(&p, cls, cudaHostAllocPortable) != cudaSuccess || p == nullptr) {
      cudaGetLastError();
      return nullptr;
    }
  }
  ++stats_.allocations;
  in_use_.emplace(p, cls);
  stats_.in_use_bytes += need;
  return p;
}

void PinnedHostPool::Free(void* p, size_t) {
  if (p == nullptr) return;
  absl::MutexLock lock(&mu_);
  if (auto it = fallback_.find(p); it != fallback_.end()) {
    fallback_.erase(it);
    ::operator delete (p, std::align_val_t{kHostTensorAlignment});
    return;
  }
  auto it = in_use_.find(p);
  if (it == in_use_.end()) return;  // not ours: a bug elsewhere, but never free a stranger
  const size_t cls = it->second;
  in_use_.erase(it);
  stats_.in_use_bytes -= static_cast<int64_t>(cls);
  cached_[cls].push_back(p);
  stats_.cached_bytes += static_cast<int64_t>(cls);
}

absl::Status PinnedHostPool::Register(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return absl::InvalidArgumentError("register: empty range");
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  absl::MutexLock lock(&mu_);
  registered_[p] = bytes;
  stats_.registered_bytes += static_cast<int64_t>(bytes);
  return absl::OkStatus();
}

void PinnedHostPool::Unregister(void* p) {
  absl::MutexLock lock(&mu_);
  auto it = registered_.find(p);
  if (it == registered_.end()) return;
  cudaHostUnregister(p);
  cudaGetLastError();
  stats_.registered_bytes -= static_cast<int64_t>(it->second);
  registered_.erase(it);
}

HostMemoryStats PinnedHostPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void PinnedHostPool::Trim() {
  absl::MutexLock lock(&mu_);
  TrimLocked(0);
}

void PinnedHostPool::TrimLocked(int64_t target_cached) {
  // Largest blocks first: fewest cudaFreeHost calls (each synchronizes) for the bytes freed.
  for (auto it = cached_.rbegin(); it != cached_.rend() && stats_.cached_bytes > target_cached;
       ++it) {
    std::vector<void*>& blocks = it->second;
    while (!blocks.empty() && stats_.cached_bytes > target_cached) {
      cudaFreeHost(blocks.back());
      blocks.pop_back();
      stats_.cached_bytes -= static_cast<int64_t>(it->first);
    }
  }
  cudaGetLastError();
}

}  // namespace attnserve
