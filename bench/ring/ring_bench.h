// attnbench_ring's two benchmarks and what they share. See ring_bench_main.cc for the flags.
//
// Scaling (scaling.cc): ring attention over GPUs (core/parallel/ring_cuda) against the same
// engine on one GPU, and the per-GPU memory of ring vs data parallel (heads split over the GPUs).
// Timing: every rank (host thread) passes a barrier, rank 0 takes the host clock, each rank runs
// and synchronizes its stream, a second barrier, rank 0 takes the clock: wall time of the whole
// ring including every transfer. Median of --reps runs after --warmup runs. T1 is one GPU on the
// full sequence with the same engine, timed the same way: --engine=own runs flash_fwd on one GPU
// and in every ring piece; --engine=cudnn runs cuDNN's fused attention on one GPU (what the
// service runs there) and in the ring's unmasked and diagonal pieces (RingCudaPlanOptions::
// cudnn_pieces); both (the default) runs each case twice.
// FLOPs: 4 * B * Hq * D * admitted pairs (causal: the kept triangle N(N+1)/2).
// Efficiency: T1 / (P * T2) (1.0 = perfect scaling).
// Correctness: the ring's O/LSE are compared with T1's on every 509th query row of each range (max
// |dO| / max|O| and max |dLSE|), printed and recorded. Data parallel (heads split over the GPUs,
// full sequence each): one run, for its memory and a rough time. Longest sequence: dense causal,
// one run per N on 1 GPU and on the ring, ascending; a mode stops at its first failure or when the
// run predicted from the previous one (time ~ N^2) exceeds --max_run_s. The whole bench skips
// stages that would start after --budget_s.
//
// Longest dense causal under a per-GPU memory budget (longest_causal.cc, --longest-causal):
// bf16, D = --dim (128), Hq = Hkv = --heads (8), B = 1. N1: the longest N (multiple of 4096) the
// single-GPU path runs with at most X GiB of device memory: cuDNN's fused attention when the build
// and host have it (as CudaDevice runs one GPU in its default mode), else CudaAttentionPlan. N2:
// the longest for the ring over --devices GPUs with device_memory_budget = X per GPU (the plan
// picks the schedule). Budget enforcement: every device buffer of an attempt (inputs, outputs,
// ring buffers and layouts, cuDNN workspace) comes from a fresh CachingAllocator whose hard limit
// (set_limit) is X, so an attempt that would hold more fails with RESOURCE_EXHAUSTED; sizes are
// the allocator's rounded ones. Not counted on either side: the CUDA context, cuDNN's handle and
// NCCL's own buffers. Search: doubling from 65536 (ring: from N1), then bisection to 4096 tokens;
// each attempt runs twice (the first also builds graphs / connects NCCL, the second is timed) and
// fails when a run exceeds --time-cap-s. The ring's K/V are filled on the device in its home
// pieces (RingCudaRank::HomeKv), and Run restores them, so nothing is re-uploaded between runs.
#ifndef ATTNSERVE_BENCH_RING_RING_BENCH_H_
#define ATTNSERVE_BENCH_RING_RING_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/cuda_options.h"
#include "core/spec/attention_spec.h"

namespace attnserve::bench {

struct RingBenchOptions {
  std::string json;  // results file ("" = none)
  // Scaling.
  std::vector<int64_t> ns = {262144, 524288};
  std::vector<int64_t> longest = {1048576, 2097152, 4194304};
  int reps = 5;
  int warmup = 1;
  double max_run_s = 60;
  double budget_s = 220;
  // "own" (flash_fwd on one GPU and in every ring piece), "cudnn" (cuDNN fused attention on one
  // GPU and in the ring's unmasked/diagonal pieces), or "both".
  std::string engine = "both";
  // Both.
  int64_t heads = 8;
  int64_t dim = 128;
  int devices = 2;
  std::string commit;  // "" = BenchCommit's lookup
  CudaOptions cuda;    // our kernels' choices, made once in main
  // --longest-causal.
  double memory_budget_gib = 4;
  double time_cap_s = 20;
};

// The scaling bench (plus its longest-N sweep); the process exit code.
int RunScalingBench(const RingBenchOptions& opt);
// The --longest-causal bench; the process exit code.
int RunLongestCausalBench(const RingBenchOptions& opt);

inline AttentionSpec DenseSpecOf(bool causal) {
  AttentionSpec s;
  s.pattern = DenseSpec{};
  s.causal = causal;
  return s;
}

inline double DenseFlops(const AttentionShape& s, bool causal) {
  const double n = static_cast<double>(s.tokens);
  const double pairs = causal ? n * (n + 1) / 2 : n * n;
  return 4.0 * s.batch * s.q_heads * s.head_dim * pairs;
}

inline constexpr double kGiB = 1024.0 * 1024 * 1024;

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_RING_RING_BENCH_H_
