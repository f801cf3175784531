// CudaAttentionPlan::Rect (internal to core/cuda): the uploaded pieces of a request that is not
// square. Shared by cuda_attention.cc (which destroys plans) and cuda_attention_rect.cc.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_RECT_H_
#define ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_RECT_H_

#include <cstdint>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"

namespace attnserve {

struct CudaAttentionPlan::Rect {
  struct Piece {
    int64_t q_row = 0;  // first query row of Q (and O, LSE) the piece covers
    int64_t q_pos = 0;  // its position
    int64_t q_len = 0;
    int64_t k_row = 0;  // first key row of K and V
    int64_t k_len = 0;
    int32_t tile = 128;
    bool rule_causal = false;
    int64_t rule_window = -1;
    DeviceBuffer row_ptr, col_idx, mask, row_order;
  };
  std::vector<Piece> pieces;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_RECT_H_
