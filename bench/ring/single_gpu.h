// One GPU running the full dense problem, the T1 of the scaling bench and each device of its
// data-parallel run: bf16 inputs filled on the device, then either our plan or cuDNN's fused
// attention (what the service's CudaDevice runs on one GPU).
#ifndef ATTNSERVE_BENCH_RING_SINGLE_GPU_H_
#define ATTNSERVE_BENCH_RING_SINGLE_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_options.h"
#include "core/spec/attention_spec.h"

namespace attnserve {
class CudnnSdpa;  // core/cuda/cudnn_sdpa (only when built with the cuDNN path)
}  // namespace attnserve

namespace attnserve::bench {

struct SingleGpu {
  int device = 0;
  std::unique_ptr<CachingAllocator> alloc;
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudaAttentionPlan> plan;
  CudnnSdpa* sdpa = nullptr;  // set: runs cuDNN's fused attention instead of `plan`
  bool causal = false;
  DeviceBuffer q, k, v, o, lse;
  AttentionShape shape;
  ~SingleGpu();
};

enum class SingleGpuEngine { kOwn, kCudnn };

// The problem on `device` with inputs from `seed`; UNAVAILABLE for kCudnn where this build or
// host has no cuDNN.
absl::StatusOr<std::unique_ptr<SingleGpu>> MakeSingleGpu(int device, const AttentionShape& shape,
                                                         bool causal, uint64_t seed,
                                                         const CudaOptions& cuda,
                                                         SingleGpuEngine engine =
                                                             SingleGpuEngine::kOwn);

// One run, synchronized: its wall time in seconds.
absl::StatusOr<double> RunSingleOnce(SingleGpu& g);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_RING_SINGLE_GPU_H_
