// Elementwise kernels around the attention kernel: dtype conversion and fills. (Dilated branches
// need no gather/scatter: the attention kernel reads them in place through strides and merges
// into the accumulators in its epilogue; see cuda_attention.cc.) All take device pointers, run on `stream`, and
// return the launch error. Tensors are row-major [B, N, H, D] unless stated.
#ifndef ATTNSERVE_CORE_CUDA_ATTENTION_OPS_H_
#define ATTNSERVE_CORE_CUDA_ATTENTION_OPS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor/dtype.h"

namespace attnserve {

// out[i] = round_to(out_dtype, in[i]) for n elements; in/out dtypes among f32, f16, bf16.
cudaError_t LaunchConvert(DType in_dtype, const void* in, DType out_dtype, void* out, int64_t n,
                          cudaStream_t stream);

// out[i] = value for n floats.
cudaError_t LaunchFillFloat(float* out, float value, int64_t n, cudaStream_t stream);

// out[i] = uniform in [lo, hi) from a counter-based hash of (seed, i), rounded to dtype. For
// benches: fills multi-GB inputs on the device instead of generating them on the host.
cudaError_t LaunchFillUniform(DType dtype, void* out, int64_t n, uint64_t seed, float lo, float hi,
                              cudaStream_t stream);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_ATTENTION_OPS_H_
