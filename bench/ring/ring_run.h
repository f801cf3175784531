// The multi-GPU runs of the scaling bench: the ring over devices [0, P) and data parallel (heads
// split over the devices), each rank on a host thread of its own (bench/harness/rank_threads.h).
#ifndef ATTNSERVE_BENCH_RING_RING_RUN_H_
#define ATTNSERVE_BENCH_RING_RING_RUN_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "bench/ring/single_gpu.h"
#include "core/cuda/cuda_options.h"
#include "core/parallel/ring_cuda.h"
#include "core/spec/attention_spec.h"

namespace attnserve::bench {

// The ring's options for this run's CUDA choices (flash kernel; the engine gates cuDNN pieces);
// the one place the ring benches build RingCudaOptions.
RingCudaOptions RingOptionsFor(const CudaOptions& cuda);

struct RingResult {
  absl::Status status;
  std::vector<double> times;  // seconds, the timed runs
  std::vector<RingCudaRankStats> stats;
  double check_o_rel = NAN;  // vs the single-GPU output on sampled rows
  double check_lse_abs = NAN;
};

struct RingRunSpec {
  AttentionShape shape;
  bool causal = false;
  int devices = 2;
  int warmup = 0;  // untimed runs
  int reps = 1;    // timed runs
  uint64_t seed = 0;
  bool cudnn_pieces = false;  // unmasked/diagonal pieces on cuDNN (RingCudaPlanOptions)
};

// Runs a P-rank ring on devices [0, P). Inputs: copied from `source` (device 0's full tensors)
// when given, else filled on each device from spec.seed. When `source` is given, O/LSE are
// compared with source->o / source->lse on every 509th row of each range.
RingResult RunRing(const RingRunSpec& spec, const CudaOptions& cuda, SingleGpu* source = nullptr);

// Data parallel: heads split over the devices, each device a full-sequence plan of its heads,
// all running concurrently; wall time of the slowest, and each device's peak bytes.
struct DpResult {
  absl::Status status;
  double median_s = NAN;
  std::vector<int64_t> peak_bytes;
};
DpResult RunDataParallel(const AttentionShape& shape, bool causal, int devices, int warmup,
                         int reps, const CudaOptions& cuda);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_RING_RING_RUN_H_
