// --cuda-ipc: a cudaMalloc'ed buffer exported with cudaIpcGetMemHandle (CUDA builds of attnctl).
#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "client/attnctl/regions.h"

namespace attnserve::attnctl {
namespace {

absl::Status CudaError(cudaError_t err, const std::string& what) {
  cudaGetLastError();
  return absl::InternalError(absl::StrCat("--cuda-ipc: ", what, ": ", cudaGetErrorString(err)));
}

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(int device, void* ptr, std::string handle)
      : device_(device), ptr_(static_cast<char*>(ptr)), handle_(std::move(handle)) {}
  ~CudaBuffer() override {
    cudaSetDevice(device_);
    cudaFree(ptr_);
  }
  std::string ipc_handle() const override { return handle_; }
  absl::Status CopyIn(int64_t offset, const void* src, int64_t n) override {
    cudaError_t err = cudaMemcpy(ptr_ + offset, src, static_cast<size_t>(n),
                                 cudaMemcpyHostToDevice);
    return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "cudaMemcpy to the device");
  }
  absl::Status CopyOut(int64_t offset, void* dst, int64_t n) const override {
    cudaError_t err = cudaMemcpy(dst, ptr_ + offset, static_cast<size_t>(n),
                                 cudaMemcpyDeviceToHost);
    return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "cudaMemcpy from the device");
  }

 private:
  const int device_;
  char* const ptr_;
  const std::string handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(int device, int64_t bytes) {
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  void* ptr = nullptr;
  if (cudaError_t err = cudaMalloc(&ptr, static_cast<size_t>(bytes)); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaMalloc(", bytes, ")"));
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t err = cudaIpcGetMemHandle(&handle, ptr); err != cudaSuccess) {
    cudaFree(ptr);
    return CudaError(err, "cudaIpcGetMemHandle");
  }
  return std::unique_ptr<DeviceBuffer>(
      new CudaBuffer(device, ptr, std::string(reinterpret_cast<const char*>(&handle),
                                              sizeof(handle))));
}

}  // namespace attnserve::attnctl
