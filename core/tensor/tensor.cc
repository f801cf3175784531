#include "core/tensor/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve {

void MemoryTracker::Allocate(int64_t bytes) {
  const int64_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  // Raise the peak to `now` unless another thread already raised it further; on failure
  // compare_exchange reloads `peak` and the loop re-checks.
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::Free(int64_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

void MemoryTracker::ResetPeak() {
  peak_.store(in_use_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

namespace {

std::string ShapeString(const std::vector<int64_t>& dims, DType dtype) {
  // absl (20220623) has its own string_view type, so StrCat needs it spelled out.
  const std::string_view name = DTypeName(dtype);
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "] ",
                      absl::string_view(name.data(), name.size()));
}

}  // namespace

void* PlainHostMemory::Allocate(size_t bytes) {
  if (bytes >= kPlainHostMmapBytes) {
    // Its own mapping (page-aligned, hence 64-byte aligned): munmap gives it back to the OS at
    // once, whatever malloc's heaps look like.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  return ::operator new (bytes, std::align_val_t{kHostTensorAlignment}, std::nothrow);
}

void PlainHostMemory::Free(void* p, size_t bytes) {
  if (bytes >= kPlainHostMmapBytes) {
    munmap(p, bytes);
    return;
  }
  ::operator delete (p, std::align_val_t{kHostTensorAlignment});
}

void tensor_internal::BufferDeleter::operator()(std::byte* p) const {
  if (view) return;
  if (memory != nullptr) {
    memory->Free(p, bytes);
  } else {
    ::operator delete (p, std::align_val_t{kHostTensorAlignment});
  }
}

namespace {

// numel and bytes of a tensor; INVALID_ARGUMENT for a negative dim, RESOURCE_EXHAUSTED on overflow.
absl::Status SizeOf(DType dtype, const std::vector<int64_t>& dims, int64_t* numel_out,
                    int64_t* bytes_out) {
  bool has_zero_dim = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", ShapeString(dims, dtype), ": dim ",
                                                     i, " is ", dims[i], ", must be >= 0"));
    }
    has_zero_dim = has_zero_dim || dims[i] == 0;
  }
  // A zero dim makes the product 0 whatever the others are, so only a product of positive dims
  // can overflow.
  int64_t numel = has_zero_dim ? 0 : 1;
  int64_t bytes = 0;
  bool overflow = false;
  if (!has_zero_dim) {
    for (int64_t d : dims) overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  overflow =
      overflow || __builtin_mul_overflow(numel, static_cast<int64_t>(DTypeSize(dtype)), &bytes);
  if (overflow) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor ", ShapeString(dims, dtype), ": size exceeds ",
                     std::numeric_limits<int64_t>::max(), " bytes (int64 overflow)"));
  }
  *numel_out = numel;
  *bytes_out = bytes;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HostTensor> HostTensor::Create(DType dtype, std::vector<int64_t> dims,
                                              MemoryTracker* tracker, HostMemory* memory) {
  int64_t numel = 0;
  int64_t bytes = 0;
  if (absl::Status s = SizeOf(dtype, dims, &numel, &bytes); !s.ok()) return s;
  // Round the allocation up to whole 64-byte lines so that SIMD loops may read the last line
  // whole; at least one line, so that a valid zero-element tensor is not empty(). The nothrow
  // form reports failure as nullptr: no exception can escape, as every boundary returns Status.
  constexpr int64_t kAlign = static_cast<int64_t>(kHostTensorAlignment);
  void* raw = nullptr;
  int64_t padded = 0;
  if (bytes <= std::numeric_limits<int64_t>::max() - kAlign) {
    padded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    raw = memory != nullptr
              ? memory->Allocate(static_cast<size_t>(padded))
              : ::operator new (static_cast<size_t>(padded), std::align_val_t{kHostTensorAlignment},
                                std::nothrow);
  }
  if (raw == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor ", ShapeString(dims, dtype), ": ", bytes,
                     " bytes exceeds the host memory available (allocation failed)"));
  }
  HostTensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.numel_ = numel;
  t.data_ = std::unique_ptr<std::byte, Deleter>(
      static_cast<std::byte*>(raw),
      Deleter{memory, static_cast<size_t>(padded), false,
              memory != nullptr && memory->page_locked(), nullptr});
  t.tracker_ = tracker;
  if (tracker != nullptr) tracker->Allocate(bytes);
  return t;
}

absl::StatusOr<HostTensor> HostTensor::Wrap(DType dtype, std::vector<int64_t> dims,
                                            std::byte* data, size_t bytes_available,
                                            std::shared_ptr<const void> owner) {
  int64_t numel = 0;
  int64_t bytes = 0;
  if (absl::Status s = SizeOf(dtype, dims, &numel, &bytes); !s.ok()) return s;
  if (static_cast<uint64_t>(bytes) > bytes_available) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", ShapeString(dims, dtype), ": needs ",
                                                   bytes, " bytes, only ", bytes_available,
                                                   " available"));
  }
  if (data == nullptr) return absl::InvalidArgumentError("tensor: null data");
  // Aligned like every HostTensor: SIMD loops may read the last 64-byte line whole, which stays
  // inside the page (and so inside any mapping) that holds the tensor's last byte.
  if (reinterpret_cast<uintptr_t>(data) % kHostTensorAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", ShapeString(dims, dtype),
                                                   ": data must be ", kHostTensorAlignment,
                                                   "-byte aligned"));
  }
  HostTensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.numel_ = numel;
  t.data_ = std::unique_ptr<std::byte, Deleter>(
      data, Deleter{nullptr, static_cast<size_t>(bytes), true, false, std::move(owner)});
  return t;
}

HostTensor::HostTensor(HostTensor&& other) noexcept
    : dtype_(other.dtype_),
      dims_(std::move(other.dims_)),
      numel_(std::exchange(other.numel_, 0)),
      data_(std::move(other.data_)),
      tracker_(std::exchange(other.tracker_, nullptr)) {
  other.dims_.clear();
}

HostTensor& HostTensor::operator=(HostTensor&& other) noexcept {
  if (this == &other) return *this;
  // Release our own buffer first, charging the Free to the tracker it was charged to.
  if (data_ != nullptr && tracker_ != nullptr) tracker_->Free(static_cast<int64_t>(nbytes()));
  dtype_ = other.dtype_;
  dims_ = std::move(other.dims_);
  other.dims_.clear();
  numel_ = std::exchange(other.numel_, 0);
  data_ = std::move(other.data_);
  tracker_ = std::exchange(other.tracker_, nullptr);
  return *this;
}

HostTensor::~HostTensor() {
  if (data_ != nullptr && tracker_ != nullptr) tracker_->Free(static_cast<int64_t>(nbytes()));
}

float HostTensor::GetFloat(int64_t i) const {
  switch (dtype_) {
    case DType::kF32:
      return data_as<float>()[i];
    case DType::kF16:
      return HalfToFloat(data_as<uint16_t>()[i]);
    case DType::kBF16:
      return Bf16ToFloat(data_as<uint16_t>()[i]);
  }
  return 0.f;
}

void HostTensor::SetFloat(int64_t i, float value) {
  switch (dtype_) {
    case DType::kF32:
      data_as<float>()[i] = value;
      return;
    case DType::kF16:
      data_as<uint16_t>()[i] = FloatToHalf(value);
      return;
    case DType::kBF16:
      data_as<uint16_t>()[i] = FloatToBf16(value);
      return;
  }
}

void HostTensor::ToFloat32(float* out) const {
  if (numel_ == 0) return;
  ConvertToFloat32(dtype_, data_.get(), out, static_cast<size_t>(numel_));
}

void HostTensor::FromFloat32(const float* in) {
  if (numel_ == 0) return;
  ConvertFromFloat32(dtype_, in, data_.get(), static_cast<size_t>(numel_));
}

void HostTensor::FillBytes(uint8_t byte) {
  if (data_ != nullptr) std::memset(data_.get(), byte, nbytes());
}

std::string HostTensor::DebugString() const { return ShapeString(dims_, dtype_); }

namespace {

// splitmix64's output function (Steele, Lea, Flood 2014). Used counter-style: element i of seed s
// gets Mix(s + (i + 1) * golden), i.e. the i-th output of a splitmix64 stream seeded with s,
// so the values depend only on (seed, i): no state, no library generator whose sequence could
// differ between standard libraries.
inline uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

}  // namespace

void FillUniform(HostTensor& t, uint64_t seed, float lo, float hi) {
  const int64_t n = t.numel();
  const double lo_d = lo;
  const double span = static_cast<double>(hi) - static_cast<double>(lo);
  // Convert in chunks through a small float buffer so that the dtype conversion uses the bulk
  // (vectorised) path without a numel-sized temporary.
  constexpr int64_t kChunk = 4096;
  alignas(kHostTensorAlignment) float buf[kChunk];
  const size_t esize = DTypeSize(t.dtype());
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    for (int64_t j = 0; j < len; ++j) {
      const uint64_t bits = SplitMix64(seed + static_cast<uint64_t>(start + j + 1) * kGolden);
      // Top 24 bits -> [0, 1) in steps of 2^-24: exactly representable in float.
      const double u = static_cast<double>(bits >> 40) * 0x1p-24;
      // An explicit fma rounds once, so no compiler's choice to contract (or not) can change
      // the value: the same bits on every IEEE platform.
      float v = static_cast<float>(std::fma(span, u, lo_d));
      if (v >= hi && hi > lo) v = std::nextafter(hi, lo);  // keep the interval half-open
      buf[j] = v;
    }
    ConvertFromFloat32(t.dtype(), buf, t.data() + static_cast<size_t>(start) * esize,
                       static_cast<size_t>(len));
  }
}

}  // namespace attnserve
