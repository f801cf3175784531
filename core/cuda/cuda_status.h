// CUDA error -> absl::Status with the failing expression, file and line.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_STATUS_H_
#define ATTNSERVE_CORE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

// cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED, invalid values -> INVALID_ARGUMENT, no device
// -> UNAVAILABLE, anything else -> INTERNAL. The message names expr, file:line and the CUDA error.
inline absl::Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file,
                                      int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, ": ", cudaGetErrorName(err), " (",
                                 cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace attnserve

#define CUDA_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                   \
    const cudaError_t attn_cuda_err_ = (expr);                                           \
    if (attn_cuda_err_ != cudaSuccess) {                                                 \
      return ::attnserve::CudaErrorToStatus(attn_cuda_err_, #expr, __FILE__, __LINE__);  \
    }                                                                                    \
  } while (0)

#endif  // ATTNSERVE_CORE_CUDA_CUDA_STATUS_H_
