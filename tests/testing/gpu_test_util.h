// Shared helpers of the GPU tests (tests/gpu): the GPU-present checks, uploads and downloads of
// host tensors and vectors, and the one "run a CudaAttentionPlan on poisoned outputs" harness.
// Library attn_gpu_testing (tests/testing/CMakeLists.txt), built when the CUDA backend is.
#ifndef ATTNSERVE_TESTS_TESTING_GPU_TEST_UTIL_H_
#define ATTNSERVE_TESTS_TESTING_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_device.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

// Skips the test (GTEST_SKIP) where fewer than `n` CUDA devices are visible.
#define SKIP_WITHOUT_GPUS(n)                                                    \
  do {                                                                          \
    const int attn_gpus_ = ::attnserve::CudaDeviceCount();                      \
    if (attn_gpus_ < (n)) {                                                     \
      if (attn_gpus_ == 0) GTEST_SKIP() << "no CUDA device available";          \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << attn_gpus_; \
    }                                                                           \
  } while (0)

// Skips the test where no CUDA device is visible.
#define SKIP_WITHOUT_GPU() SKIP_WITHOUT_GPUS(1)

namespace attnserve::testing {

// Bytes of 0xFF: NaN in every float dtype, so an element a kernel forgets to write fails.
inline constexpr int kPoisonByte = 0xFF;

// Bounds for f32 inputs against the float64 reference: the GPU paths compute them in bf16 from
// inputs rounded to bf16, which the reference does not round, so the rounding of the inputs
// adds to bf16's own bounds (O: max |o - ref| / max |ref|, 1e-2 for bf16 inputs; LSE: max
// absolute error, 2e-3 for bf16 inputs). O reached 1.024e-2 for rect_attention_test's f32
// random_chunk with ATTN_TEST_SEED=7185794720605136659 on an H200.
inline constexpr double kF32InputOTolerance = 2e-2;
inline constexpr double kF32InputLseTolerance = 3e-2;

// A fresh device buffer holding `bytes` bytes of `host` (synchronous copy).
absl::StatusOr<DeviceBuffer> UploadBytes(CachingAllocator& alloc, const void* host, size_t bytes);

// A fresh device buffer holding `tensor`'s bytes.
absl::StatusOr<DeviceBuffer> UploadTensor(CachingAllocator& alloc, const HostTensor& tensor);

// A fresh device buffer holding `host` (at least one element's bytes, so empty vectors still give
// a valid pointer).
template <typename T>
absl::StatusOr<DeviceBuffer> UploadVector(CachingAllocator& alloc, const std::vector<T>& host) {
  if (host.empty()) return DeviceBuffer::Create(alloc, sizeof(T));
  return UploadBytes(alloc, host.data(), host.size() * sizeof(T));
}

// A fresh device buffer of `bytes` poisoned bytes (kPoisonByte).
absl::StatusOr<DeviceBuffer> PoisonedDeviceBuffer(CachingAllocator& alloc, size_t bytes);

// Copies tensor.nbytes() bytes from `device` into `tensor` (synchronous).
absl::Status DownloadTensor(const void* device, HostTensor& tensor);

// What RunPlanOnGpu returns.
struct PlanRunResult {
  HostTensor o;              // [B, N, Hq, D] in the input dtype
  HostTensor lse;            // [B, Hq, N] f32
  FlashKernel kernel{};      // the flash kernel the plan's launches ran
  bool all_full_blocks = false;  // CudaAttentionPlan::all_full_blocks of the plan
  int64_t in_use_after = 0;  // the allocator's in-use bytes once every buffer was freed
};

// The GPU tests' harness: on `device`, creates the CudaAttentionPlan of (spec, q/k/v's shape,
// dtype) with `options`, uploads q/k/v, poisons O and LSE on the device, runs the plan on a fresh
// stream, synchronizes, checks for a pending CUDA error and downloads O and LSE. Any failure is
// an error status naming the step.
absl::StatusOr<PlanRunResult> RunPlanOnGpu(const AttentionSpec& spec, const HostTensor& q,
                                           const HostTensor& k, const HostTensor& v,
                                           const CudaAttentionPlan::Options& options = {},
                                           int device = 0);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_GPU_TEST_UTIL_H_
