// CudaAttentionPlan::Rect (internal to core/cuda): the uploaded pieces of a request that is not
// square. Shared by cuda_attention.cc (which destroys plans) and cuda_attention_rect.cc.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_RECT_H_
#define ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_RECT_H_

#include <cstdint>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"

namespace attnserve {

struct CudaAttentionPlan::Rect {
  struct Piece {
    // kCsr: a RectLayout; kDense / kDenseCausal: implicit layouts (dense specs, no CSR built).
    FlashFwdLayoutView::Kind kind = FlashFwdLayoutView::Kind::kCsr;
    int64_t q_row = 0;  // first query row of Q (and O, LSE) the piece covers
    int64_t q_pos = 0;  // its position
    int64_t q_len = 0;
    int64_t k_row = 0;  // first key row of K and V
    int64_t k_pos = 0;  // its position
    int64_t k_len = 0;
    int32_t tile = 128;
    // A split-KV decode piece (core/cuda/flash_decode): a whole dense or window span with few
    // query rows per KV head; the rules are rule_causal and rule_window, no layout.
    bool decode = false;
    bool rule_causal = false;
    int64_t rule_window = -1;
    DeviceBuffer row_ptr, col_idx, mask, row_order;
  };
  std::vector<Piece> pieces;
  // Dense causal spans that are not decode pieces: several pieces cover each query row (the keys before its span's queries, then
  // the diagonal), so they LSE-merge into an f32 accumulator (workspace o_acc_f32).
  bool accumulate = false;
  // O = 0 and LSE = -inf written before the pieces run, for the rows no piece writes. Not needed
  // when non-empty decode pieces cover every query row (each writes all of its rows itself): a
  // decode step then launches its kernels only.
  bool fill_outputs = true;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_RECT_H_
