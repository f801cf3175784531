// Running one attnbench_cuda case: the timed launches at the case's size (CUDA events, warm-up
// excluded, median of the timed runs) and the correctness check at a small size of the same spec
// against the float64 reference, on fresh random inputs every run.
#ifndef ATTNSERVE_BENCH_CUDA_CASE_RUNNER_H_
#define ATTNSERVE_BENCH_CUDA_CASE_RUNNER_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "bench/cuda/cases.h"
#include "core/cuda/caching_allocator.h"

namespace attnserve::bench {

// The small-size check of a case's spec: same spec, D, dtype; N = 700 (ragged at 64 and 128).
struct SmallCheckResult {
  double o_rel = -1;
  double lse_max_abs = -1;
  int64_t nonfinite = -1;
  bool ok = false;
  std::string error;
};

// One result row.
struct Result {
  Case c;
  std::string variant = "own";       // "own": our kernels; "attnserve": what the service runs
  std::string engine = "flash_fwd";  // the kernels timed: "flash_fwd" or "cudnn"
  std::string kernel;                // the flash kernel the timed launches ran ("none": none)
  std::string note;                  // why an attnserve row is not on cuDNN
  std::string error;
  double compile_ms = 0;
  double plan_ms = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0;
  int iters = 0;
  double flops = 0, sparsity = 0;
  int64_t peak_bytes = 0;
  int64_t plan_bytes = 0;
  SmallCheckResult check;
};

// One forward on device pointers, enqueued on the case's stream.
using Launch =
    std::function<absl::Status(const void* q, const void* k, const void* v, void* o, float* lse)>;
// One forward of the case's spec at `shape` on device pointers; synchronizes the stream.
using SmallRun = std::function<absl::Status(const AttentionShape& shape, const void* q,
                                            const void* k, const void* v, void* o, float* lse)>;

// Compiles (timed, dumped to opt.csr_dir when the case asks), plans (timed) and times the case
// on our kernels with opt.cuda's choices; fills r's figures and r.kernel.
absl::Status RunCase(const Case& c, const CudaBenchOptions& opt, CachingAllocator& alloc,
                     cudaStream_t stream, Result& r);

// Allocates and fills the case's inputs on the device, then times `launch` with CUDA events:
// warm-up runs, then the median (min, max) of the timed runs; records the allocator's peak.
absl::Status TimeLaunches(const Launch& launch, const Case& c, const CudaBenchOptions& opt,
                          CachingAllocator& alloc, cudaStream_t stream, Result& r);

// The check of `c`'s spec at the small size through `run_small` (errors land in .error).
SmallCheckResult SmallCheck(const Case& c, CachingAllocator& alloc, cudaStream_t stream,
                            const SmallRun& run_small);

// "NVIDIA H200", or "unknown".
std::string CudaDeviceName(int device);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_CASE_RUNNER_H_
