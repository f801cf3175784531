// The benches' one way to build and launch a CudaAttentionPlan: with the run's CudaOptions (made
// once in main, flags first, then the environment's overrides) and with the flash kernel that a
// launch ran reported back, for the results' "flash_kernel" field. attnbench, attnbench_cuda and
// attnbench_ring's single-GPU side all go through here, so a change of the plan's API is one
// edit in plan_launch.cc.
#ifndef ATTNSERVE_BENCH_CUDA_PLAN_LAUNCH_H_
#define ATTNSERVE_BENCH_CUDA_PLAN_LAUNCH_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_options.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"

namespace attnserve::bench {

// The run's CUDA options: `kernel` (auto|sm80|sm90) and `sm90_schedule` (a Sm90Schedule name or
// v1|v3; empty: the default) as the flags give them, then CudaOptionsFromEnv's overrides
// (ATTNSERVE_FLASH_KERNEL, ATTNSERVE_SM90_VARIANT, ... as the lease scripts set them), read once.
absl::StatusOr<CudaOptions> BenchCudaOptions(std::string_view kernel,
                                             std::string_view sm90_schedule);

// CudaAttentionPlan::Create with `options`' flash kernel choice. `compiled` may be null.
absl::StatusOr<std::unique_ptr<CudaAttentionPlan>> MakeBenchPlan(
    const AttentionSpec& spec, const AttentionShape& shape, DType dtype, CachingAllocator& alloc,
    cudaStream_t stream, const CudaOptions& options, const CompiledPattern* compiled = nullptr);

// Enqueues one run of `plan` (no synchronization). `kernel` (optional) receives the flash kernel
// the run launched, as FlashKernelName spells it: "sm80", "sm90" (single tile), "sm90v3"
// (persistent), "decode", "decode_sm90".
absl::Status RunBenchPlan(const CudaAttentionPlan& plan, const void* q, const void* k,
                          const void* v, void* o, float* lse, cudaStream_t stream,
                          std::string* kernel = nullptr);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_PLAN_LAUNCH_H_
