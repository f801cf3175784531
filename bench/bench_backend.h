// What attnbench drives: one backend holding one problem. attnbench's --backend switch picks the
// implementation (MakeCpuBenchBackend here; MakeCudaBenchBackend in bench/cuda/cuda_bench.h).
#ifndef ATTNSERVE_BENCH_BENCH_BACKEND_H_
#define ATTNSERVE_BENCH_BENCH_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cpu/cpu_backend.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/tensor/tensor.h"

namespace attnserve::bench {

class BenchBackend {
 public:
  virtual ~BenchBackend() = default;

  // "cpu: AMD EPYC 7B13, 2 threads": what the results were measured on.
  virtual std::string device() const = 0;

  // Takes one problem. q/k/v and `compiled` must outlive the following Run() calls. A device
  // backend copies the inputs over here, so the copy is outside the timed runs.
  virtual absl::Status Prepare(const AttentionSpec& spec, const CompiledPattern& compiled,
                               const HostTensor& q, const HostTensor& k, const HostTensor& v) = 0;

  // One attention forward of the prepared problem; returns when its outputs are complete.
  virtual absl::Status Run() = 0;

  // The last run's outputs on the host: o [B, N, Hq, D] in the input dtype, lse [B, Hq, N] f32.
  virtual absl::StatusOr<const AttentionOutputs*> Outputs() = 0;

  // The device's dense matrix-multiply rate in GFLOP/s in this process, the yardstick the
  // attention rate is reported against (CPU: Eigen sgemm on every thread at once).
  virtual absl::StatusOr<double> MeasureGemmGflops() = 0;

  // The kernel the last Run() launched, as the launch reported it ("sm80", "sm90v3", ...); empty
  // for backends without a kernel choice.
  virtual std::string kernel() const { return ""; }
};

// threads: how many threads run the attention (the caller plus threads - 1 pool workers).
absl::StatusOr<std::unique_ptr<BenchBackend>> MakeCpuBenchBackend(int threads);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_BENCH_BACKEND_H_
