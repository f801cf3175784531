#include "bench/cuda/plan_launch.h"

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {

absl::StatusOr<CudaOptions> BenchCudaOptions(std::string_view kernel,
                                             std::string_view sm90_schedule) {
  CudaOptions base;
  ATTN_ASSIGN_OR_RETURN(base.flash.arch, ParseFlashKernelArch(kernel, "--kernel"));
  if (!sm90_schedule.empty()) {
    ATTN_ASSIGN_OR_RETURN(base.flash.sm90_schedule,
                          ParseSm90Schedule(sm90_schedule, "--sm90-schedule"));
  }
  return CudaOptionsFromEnv(base);
}

absl::StatusOr<std::unique_ptr<CudaAttentionPlan>> MakeBenchPlan(
    const AttentionSpec& spec, const AttentionShape& shape, DType dtype, CachingAllocator& alloc,
    cudaStream_t stream, const CudaOptions& options, const CompiledPattern* compiled) {
  CudaAttentionPlan::Options plan_options;
  plan_options.kernel = options.flash;
  return CudaAttentionPlan::Create(spec, shape, dtype, alloc, stream, compiled, plan_options);
}

absl::Status RunBenchPlan(const CudaAttentionPlan& plan, const void* q, const void* k,
                          const void* v, void* o, float* lse, cudaStream_t stream,
                          std::string* kernel) {
  FlashKernel ran = FlashKernel::kSm80;
  ATTN_RETURN_IF_ERROR(plan.Run(q, k, v, o, lse, stream, /*cancel=*/nullptr, &ran));
  if (kernel != nullptr) *kernel = std::string(FlashKernelName(ran));
  return absl::OkStatus();
}

}  // namespace attnserve::bench
