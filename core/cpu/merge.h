// The LSE merge of partial attention results (dilated branches, ring steps, split keys):
//   L = log(exp(L_a) + exp(L_b)),  O = exp(L_a - L) * O_a + exp(L_b - L) * O_b
// in float32; a partial with LSE -inf contributes nothing, and two -inf partials stay O = 0,
// LSE = -inf.
#ifndef ATTNSERVE_CORE_CPU_MERGE_H_
#define ATTNSERVE_CORE_CPU_MERGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// Row-level kernel: merges (o_in, lse_in) into the accumulator (o_acc, lse_acc) in place.
// o_*: rows x head_dim floats with row strides in elements; lse_*: rows floats with strides.
void MergePartialRows(int64_t rows, int64_t head_dim, float* o_acc, int64_t o_acc_stride,
                      float* lse_acc, int64_t lse_acc_stride, const float* o_in,
                      int64_t o_in_stride, const float* lse_in, int64_t lse_in_stride);

// Tensor-level merge: acc_o/in_o [B, N, H, D] f32, acc_lse/in_lse [B, H, N] f32, same shapes.
absl::Status MergePartials(HostTensor& acc_o, HostTensor& acc_lse, const HostTensor& in_o,
                           const HostTensor& in_lse);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CPU_MERGE_H_
