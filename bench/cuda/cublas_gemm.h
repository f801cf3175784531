// The GPU's GEMM yardstick for attnbench --backend cuda: an 8192^3 bf16 cuBLAS GEMM (f32
// accumulate), 3 warm-up runs and 10 timed ones on one stream, reported in GFLOP/s.
#ifndef ATTNSERVE_BENCH_CUDA_CUBLAS_GEMM_H_
#define ATTNSERVE_BENCH_CUDA_CUBLAS_GEMM_H_

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"

namespace attnserve::bench {

// cuBLAS is resolved at run time (dlopen), so the benches need neither a link-time cuBLAS nor
// one in their bundle (the GPU host's toolkit or PyTorch brings one); UNAVAILABLE without it.
absl::StatusOr<double> MeasureBf16GemmGflops(CachingAllocator& alloc, cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_CUDA_CUBLAS_GEMM_H_
