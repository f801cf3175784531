// The CUDA device a single-GPU bench runs on: checked, made current and described.
#ifndef ATTNSERVE_BENCH_CUDA_OPEN_DEVICE_H_
#define ATTNSERVE_BENCH_CUDA_OPEN_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace attnserve::bench {

// Makes CUDA device `ordinal` current and returns its description for the run record ("NVIDIA
// H200 (GPU 0, PCI ...; CUDA runtime 13.0, driver 13.0)"). UNAVAILABLE when no device is
// visible, INVALID_ARGUMENT (naming --device) when the ordinal is out of range.
absl::StatusOr<std::string> OpenCudaDevice(int ordinal);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_OPEN_DEVICE_H_
