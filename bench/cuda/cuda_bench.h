// The CUDA kernel-level benchmark: dense / block-sparse / dilated cases on one GPU (cases.h),
// timed with CUDA events (warm-up excluded, median of the timed runs), each checked against the
// float64 reference at a small size of the same spec on every run (case_runner.h). Results are
// JSON (one object with a "results" array) plus a markdown table. Called by attnbench_cuda
// (cuda_bench_main.cc); attnbench's `--backend cuda` uses MakeCudaBenchBackend.
//
// FLOPs = 4 * B * Hq * D * admitted (query, key) pairs (causal and sparse layouts count only the
// pairs they admit); "effective TFLOP/s" of sparse cases divides those kept FLOPs by the time.
#ifndef ATTNSERVE_BENCH_CUDA_CUDA_BENCH_H_
#define ATTNSERVE_BENCH_CUDA_CUDA_BENCH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bench_backend.h"
#include "bench/cuda/cases.h"
#include "bench/cuda/plan_launch.h"
#include "core/cuda/cuda_options.h"

namespace attnserve::bench {

struct CudaBenchReport {
  std::string json;      // {"device": ..., "date": ..., "results": [...]}
  std::string markdown;  // a table, one row per case
  bool all_correct = true;
};

// Runs the selected cases. A case that fails (e.g. out of memory) is recorded with its error and
// the run continues; only setup failures (no GPU) return an error.
absl::StatusOr<CudaBenchReport> RunCudaBench(const CudaBenchOptions& options);

// The case names RunCudaBench knows, in run order.
std::vector<std::string> CudaBenchCaseNames();

// attnbench's `--backend cuda`: one GPU (CUDA ordinal `device`) behind the BenchBackend
// interface, running our kernels with `options`' choices. Prepare uploads the layout and inputs;
// Run launches and synchronizes; Outputs copies back; MeasureGemmGflops times an 8192^3 bf16
// cuBLAS GEMM; kernel() names the flash kernel of the last Run. UNAVAILABLE without a GPU.
absl::StatusOr<std::unique_ptr<BenchBackend>> MakeCudaBenchBackend(int device,
                                                                    const CudaOptions& options);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_CUDA_BENCH_H_
