#include "core/cuda/resident_memory.h"

#include <cuda_runtime.h>

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// Makes `ordinal` current for the calling thread (a gRPC thread) and restores its previous
// device afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(ordinal);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
    cudaGetLastError();
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

class CudaResidentMemory final : public ResidentMemory {
 public:
  CudaResidentMemory(int ordinal, DeviceBuffer buffer, HostCopyCounters* copies, int64_t bytes)
      : ResidentMemory(bytes), ordinal_(ordinal), buffer_(std::move(buffer)), copies_(copies) {}

  ~CudaResidentMemory() override {
    DeviceScope scope(ordinal_);
    buffer_.Reset();  // nothing is queued on it: every write synchronised, every reader too
  }

  absl::Status Write(int64_t offset, const void* src, int64_t n) override {
    if (offset < 0 || n < 0 || offset > bytes() - n) {
      return absl::InternalError(absl::StrCat("resident memory: write of [", offset, ", +", n,
                                              ") past ", bytes(), " bytes"));
    }
    DeviceScope scope(ordinal_);
    CUDA_RETURN_IF_ERROR(scope.status());
    ATTN_RETURN_IF_ERROR(CopyToDevice(device_data() + offset, src, static_cast<size_t>(n),
                                      cudaStreamPerThread, copies_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamPerThread));
    return absl::OkStatus();
  }

  absl::Status CopyFrom(ResidentMemory& from, int64_t n) override {
    if (from.device_data() == nullptr || n > bytes() || n > from.bytes() || n < 0) {
      return absl::InternalError("resident memory: CopyFrom needs device memory that fits");
    }
    DeviceScope scope(ordinal_);
    CUDA_RETURN_IF_ERROR(scope.status());
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_data(), from.device_data(),
                                         static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                                         cudaStreamPerThread));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamPerThread));
    return absl::OkStatus();
  }

  std::byte* device_data() override { return buffer_.as<std::byte>(); }

 private:
  const int ordinal_;
  DeviceBuffer buffer_;
  HostCopyCounters* const copies_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ResidentMemory>> MakeCudaResidentMemory(
    int ordinal, CachingAllocator& alloc, HostCopyCounters* copies, int64_t bytes) {
  DeviceScope scope(ordinal);
  CUDA_RETURN_IF_ERROR(scope.status());
  ATTN_ASSIGN_OR_RETURN(
      DeviceBuffer buffer,
      DeviceBuffer::Create(alloc, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return std::unique_ptr<ResidentMemory>(
      new CudaResidentMemory(ordinal, std::move(buffer), copies, bytes));
}

}  // namespace attnserve
