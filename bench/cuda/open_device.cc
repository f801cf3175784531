// OpenCudaDevice (open_device.h).
#include "bench/cuda/open_device.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda/cuda_status.h"

namespace attnserve::bench {

absl::StatusOr<std::string> OpenCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device visible (cudaGetDeviceCount: ",
        err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), "); this bench needs a GPU"));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: ", ordinal, " is not in [0, ", count, ")"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  char bus[32] = {0};
  CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus), ordinal));
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  return absl::StrFormat("%s (GPU %d, PCI %s; CUDA runtime %d.%d, driver %d.%d)", prop.name,
                         ordinal, bus, runtime / 1000, runtime % 1000 / 10, driver / 1000,
                         driver % 1000 / 10);
}

}  // namespace attnserve::bench
