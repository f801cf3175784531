// Host tensors: a dtype, a shape and an owned, 64-byte aligned, row-major buffer.
#ifndef ATTNSERVE_CORE_TENSOR_TENSOR_H_
#define ATTNSERVE_CORE_TENSOR_TENSOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor/dtype.h"
#include "core/tensor/host_memory.h"

namespace attnserve {

// Counts the bytes held by the buffers charged to it. Thread-safe. The CPU backend's "device
// memory" metrics read one of these per CPU device.
class MemoryTracker {
 public:
  void Allocate(int64_t bytes);
  void Free(int64_t bytes);
  int64_t in_use_bytes() const { return in_use_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // Starts a new peak window at the current usage.
  void ResetPeak();

 private:
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
};

// [B, N, H, D] in the names used throughout: batch, tokens, heads, head dim. `tokens` counts the
// QUERY rows per sequence (Nq); K and V have kv_len() rows per sequence (Nkv), which differs only
// when kv_tokens is set (decode, chunked prefill: docs/DESIGN.md "The math").
struct AttentionShape {
  int64_t batch = 0;
  int64_t tokens = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t kv_tokens = 0;  // keys per sequence; 0: the same as tokens

  int64_t kv_len() const { return kv_tokens > 0 ? kv_tokens : tokens; }
};

// Alignment of every HostTensor buffer: a cache line, and the widest SIMD load (AVX-512).
inline constexpr size_t kHostTensorAlignment = 64;

namespace tensor_internal {
// How a HostTensor's buffer goes back: to its HostMemory, to aligned delete, or (a view) nowhere.
struct BufferDeleter {
  HostMemory* memory = nullptr;  // null: plain aligned new
  size_t bytes = 0;              // what was allocated
  bool view = false;             // Wrap: nothing to free; `owner` keeps the bytes alive
  bool page_locked = false;
  std::shared_ptr<const void> owner;
  void operator()(std::byte* p) const;
};
}  // namespace tensor_internal

// A dense, row-major host tensor. Move-only. The buffer is 64-byte aligned and, if a tracker was
// given, charged to it for the tensor's lifetime (the tracker must outlive the tensor).
class HostTensor {
 public:
  HostTensor() = default;
  // INVALID_ARGUMENT for negative dims; RESOURCE_EXHAUSTED when the size overflows or the
  // allocation fails. Contents are uninitialised.
  // `memory` supplies the bytes (page-locked on a GPU host); null: plain memory.
  static absl::StatusOr<HostTensor> Create(DType dtype, std::vector<int64_t> dims,
                                           MemoryTracker* tracker = nullptr,
                                           HostMemory* memory = nullptr);
  // A tensor over memory it does not own (a caller's shared-memory region): `data` must be
  // 64-byte aligned, hold the tensor's bytes and stay valid while `owner` (kept alive by the
  // tensor) is held. INVALID_ARGUMENT when the tensor needs more than `bytes_available` bytes, the
  // data is misaligned or a dim is negative.
  static absl::StatusOr<HostTensor> Wrap(DType dtype, std::vector<int64_t> dims, std::byte* data,
                                         size_t bytes_available,
                                         std::shared_ptr<const void> owner);
  HostTensor(HostTensor&& other) noexcept;
  HostTensor& operator=(HostTensor&& other) noexcept;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  ~HostTensor();

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t dim(int i) const { return dims_[i]; }
  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }
  bool empty() const { return data_ == nullptr; }
  // True for Wrap'ed tensors (the bytes belong to someone else).
  bool is_view() const { return data_.get_deleter().view; }
  // True when the bytes are page-locked (from a page-locked HostMemory).
  bool page_locked() const { return data_.get_deleter().page_locked; }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  template <typename T>
  T* data_as() { return reinterpret_cast<T*>(data_.get()); }
  template <typename T>
  const T* data_as() const { return reinterpret_cast<const T*>(data_.get()); }

  // Element access by flat index, converting through float (exact for every dtype on load).
  float GetFloat(int64_t i) const;
  void SetFloat(int64_t i, float value);  // rounds to dtype

  // Writes all elements as float32 into out[0, numel).
  void ToFloat32(float* out) const;
  // Sets all elements from float32 (rounding to dtype).
  void FromFloat32(const float* in);
  // Fills every byte with `byte` (tests poison outputs with 0xFF: NaN in every dtype).
  void FillBytes(uint8_t byte);

  // "[1, 8192, 16, 128] bf16"
  std::string DebugString() const;

 private:
  using Deleter = tensor_internal::BufferDeleter;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> dims_;
  int64_t numel_ = 0;
  std::unique_ptr<std::byte, Deleter> data_;
  MemoryTracker* tracker_ = nullptr;
};

// Fills t with uniform values in [lo, hi) from a seeded generator (rounded to t's dtype).
void FillUniform(HostTensor& t, uint64_t seed, float lo = -1.f, float hi = 1.f);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_TENSOR_TENSOR_H_
