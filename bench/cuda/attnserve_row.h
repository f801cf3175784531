// The "attnserve" row of a dense/window case: what the service's CudaDevice runs on that case.
// In its default (auto) engine mode that is our flash_fwd kernels where the built-in engine table
// measured them faster on this GPU model, else cuDNN's fused attention where CudnnSdpaSupports
// takes the case, our kernels support the head dim too, and the loaded cuDNN has an engine for
// it; else our kernels (the "own" row again, with the reason in the note). With
// ATTNSERVE_ATTENTION_ENGINE=cudnn it is cuDNN wherever cuDNN runs the case: the timing
// bench/engine_table.py pairs with the own row to measure the table.
#ifndef ATTNSERVE_BENCH_CUDA_ATTNSERVE_ROW_H_
#define ATTNSERVE_BENCH_CUDA_ATTNSERVE_ROW_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "bench/cuda/case_runner.h"
#include "bench/cuda/cases.h"
#include "core/cuda/caching_allocator.h"

namespace attnserve::bench {

bool DenseOrWindow(const AttentionSpec& spec);

// The cuDNN engine as attnserve's CudaDevice holds it: one per device, its workspace from the
// device's caching allocator, on the device's one stream; created on first use.
class AttnserveEngine {
 public:
  AttnserveEngine(int device, CachingAllocator& alloc);
  ~AttnserveEngine();

  // "90100 from /path/libcudnn.so.9", "not loaded", or why it could not be loaded.
  std::string Describe() const;
  void Reset();  // drops the engine (before the allocator empties its cache)

 private:
  friend Result RunAttnserveRow(const Case&, const Result&, const CudaBenchOptions&,
                                AttnserveEngine&, CachingAllocator&, cudaStream_t);
  struct State;  // the engine, in builds with the cuDNN path
  std::unique_ptr<State> state_;
};

// The attnserve row of `c` given its own row: cuDNN timed as our kernels are (same inputs,
// warm-up, median) and checked at the small size; or `own` relabelled, with the reason.
Result RunAttnserveRow(const Case& c, const Result& own, const CudaBenchOptions& opt,
                       AttnserveEngine& served, CachingAllocator& alloc, cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_ATTNSERVE_ROW_H_
