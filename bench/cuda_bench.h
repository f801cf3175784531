// The CUDA kernel-level benchmark: dense / block-sparse / dilated cases on one GPU, timed with
// CUDA events (warm-up excluded, median of the timed runs), each checked against the float64
// reference at a small size of the same spec on every run. Results are JSON (one object with a
// "results" array) plus a markdown table. Called by attnbench_cuda (bench/cuda_bench_main.cc) and
// usable from attnbench's `--backend cuda`.
//
// FLOPs = 4 * B * Hq * D * admitted (query, key) pairs (causal and sparse layouts count only the
// pairs they admit); "effective TFLOP/s" of sparse cases divides those kept FLOPs by the time.
#ifndef ATTNSERVE_BENCH_CUDA_BENCH_H_
#define ATTNSERVE_BENCH_CUDA_BENCH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bench_backend.h"

namespace attnserve::bench {

struct CudaBenchOptions {
  int device = 0;
  // Comma-separated case names or group prefixes ("dense", "sparse", "dilated", "compile",
  // "huge"); "all" runs everything, in order from light to heavy.
  std::string cases = "all";
  int warmup = 3;                 // untimed runs per case
  int iters = 10;                 // timed runs per case (median reported)
  std::string csr_dir;            // when set, block-sparse layouts are dumped here as .npy
  std::string command;            // recorded in the JSON
};

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

// attnbench's `--backend cuda`: one GPU (CUDA ordinal `device`) behind the BenchBackend interface.
// Prepare uploads the layout and inputs; Run launches and synchronizes; Outputs copies back;
// MeasureGemmGflops times an 8192^3 bf16 cuBLAS GEMM. UNAVAILABLE without a GPU.
absl::StatusOr<std::unique_ptr<BenchBackend>> MakeCudaBenchBackend(int device);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_BENCH_H_
