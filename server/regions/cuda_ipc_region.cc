// CUDA IPC regions: a caller's device memory opened with cudaIpcOpenMemHandle.
//
// A request runs on the region's GPU whenever that GPU belongs to this server: its kernels read
// Q/K/V and write O/LSE in place (the request assembler makes DeviceTensorViews of the region,
// the placement policies pin the request to that GPU). Ordering with the caller: the memory is
// ordinary device memory to our streams, so the caller must have finished writing its inputs (a
// synchronised stream) before it sends Attend, and may read the outputs once the response has
// arrived (the run synchronises its stream before answering). Regions on a GPU this server does
// not run on are copied through page-locked host memory (CopyOut / CopyIn below).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/regions/region_registry.h"

namespace attnserve {
namespace {

absl::Status CudaError(cudaError_t err, const std::string& what) {
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

class CudaIpcRegion final : public Region {
 public:
  CudaIpcRegion(std::string name, int device, std::byte* ptr, int64_t bytes)
      : Region(std::move(name), RegionKind::kCudaIpc, bytes), device_(device), ptr_(ptr) {}
  ~CudaIpcRegion() override {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    if (cudaSetDevice(device_) == cudaSuccess) cudaIpcCloseMemHandle(ptr_);
    if (previous >= 0 && previous != device_) cudaSetDevice(previous);
    cudaGetLastError();
  }

  absl::Status CopyOut(int64_t offset, void* dst, int64_t n) override {
    return Copy(dst, ptr_ + offset, n, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyIn(int64_t offset, const void* src, int64_t n) override {
    return Copy(ptr_ + offset, src, n, cudaMemcpyHostToDevice);
  }
  std::byte* device_data() override { return ptr_; }
  int device() const override { return device_; }
  void Describe(RegionInfo* info) const override { info->device = device_; }

 private:
  // Runs on gRPC threads (inputs) and device workers (outputs): a worker's current device is its
  // own GPU, so the previous device is restored afterwards.
  absl::Status Copy(void* dst, const void* src, int64_t n, cudaMemcpyKind kind) {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    absl::Status status;
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      status = CudaError(err, absl::StrCat("region ", name(), ": cudaSetDevice(", device_, ")"));
    } else if (err = cudaMemcpy(dst, src, static_cast<size_t>(n), kind); err != cudaSuccess) {
      status = CudaError(err, absl::StrCat("region ", name(), ": cudaMemcpy of ", n, " bytes"));
    }
    if (previous >= 0 && previous != device_) cudaSetDevice(previous);
    cudaGetLastError();
    return status;
  }

  const int device_;
  std::byte* const ptr_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> OpenCudaIpcRegion(const std::string& name,
                                                          const std::string& handle, int device,
                                                          int64_t bytes) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.handle: must be ",
                                                   sizeof(cudaIpcMemHandle_t), " bytes, got ",
                                                   handle.size()));
  }
  if (bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.bytes: must be >= 1, got ", bytes));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();
  if (count == 0) {
    // Built with CUDA, running without a GPU (the CPU backend serves): as in a CPU-only build.
    return absl::FailedPreconditionError(
        "cuda_ipc: CUDA IPC regions need the CUDA backend (this host has no CUDA device)");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc.device: ", device, " is not a CUDA device of this server (",
                     count, " visible)"));
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cuda_ipc.device: cudaSetDevice(", device, ")"));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  if (cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_ipc.handle: cudaIpcOpenMemHandle on device ", device, ": ",
        cudaGetErrorString(err), " (the handle must come from cudaIpcGetMemHandle of a live "
        "allocation in another process)"));
  }
  // The handle names a whole allocation: `bytes` must fit in it, or copies would run past it.
  // cuMemGetAddressRange is reached through the runtime (no link-time libcuda dependency, so
  // the binary still starts on hosts without a driver).
  using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult query{};
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                       &query) == cudaSuccess &&
      fn != nullptr && reinterpret_cast<AddressRangeFn>(fn)(&base, &size, p) == CUDA_SUCCESS &&
      static_cast<uint64_t>(bytes) > size - (p - base)) {
    cudaIpcCloseMemHandle(ptr);
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_ipc.bytes: ", bytes, " exceeds the shared allocation of ", size, " bytes"));
  }
  cudaGetLastError();
  return std::unique_ptr<Region>(
      new CudaIpcRegion(name, device, static_cast<std::byte*>(ptr), bytes));
}

}  // namespace attnserve
