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

// LSE-merges a partial result (o, lse) into float32 accumulators (acc_o, acc_lse), the rule of
// docs/DESIGN.md, "The math": L = log(e^L_acc + e^L_new), O = e^(L_acc - L) O_acc + e^(L_new - L) O_new.
// Rows whose new lse is -inf (nothing admitted) leave the accumulators untouched; an accumulator
// row at -inf (empty) takes the new row. o [batch, rows, heads, head_dim] (bf16 or f16) and
// lse [batch, heads, rows] are contiguous; acc_o rows are heads * head_dim floats apart with
// batches acc_o_batch_stride floats apart; acc_lse[b, h, r] is at
// b * acc_lse_batch_stride + h * acc_lse_head_stride + r. head_dim and acc_o_batch_stride must be
// multiples of 4 and acc_o 16-byte aligned (cudaErrorInvalidValue otherwise). Two launches (O,
// then LSE), ordered on `stream`.
cudaError_t LaunchLseMergeInto(DType o_dtype, const void* o, const float* lse, float* acc_o,
                               float* acc_lse, int64_t batch, int64_t rows, int64_t heads,
                               int64_t head_dim, int64_t acc_o_batch_stride,
                               int64_t acc_lse_batch_stride, int64_t acc_lse_head_stride,
                               cudaStream_t stream);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_ATTENTION_OPS_H_
