// The one place a FlashFwdParams is filled from tensors: every launch of the flash_fwd family
// (CudaAttentionPlan's layouts and dilated branches, the CUDA ring's pieces, the tests) describes
// where its tensors are, which rows and heads it covers and which block layout it walks, and
// BuildFlashFwdParams derives the ~30 strides and counts from that. RunAttentionForward
// (core/cuda/cuda_attention.h) validates the result; the builder itself checks nothing.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_PARAMS_BUILDER_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_PARAMS_BUILDER_H_

#include <cstdint>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/dtype.h"

namespace attnserve {

// The device tensors of one launch, all token-major and contiguous per token:
//   q [B, shape.tokens, Hq, D], k/v [B, kv_tokens, Hkv, D], o [B, o_tokens, Hq, D] in `dtype`
//   (f32 when the launch accumulates), lse [B, Hq, shape.tokens] f32.
// Each pointer is where the launch's first row (batch 0, segment 0, row 0) lives: callers offset
// them to a piece or a dilated run.
struct FlashFwdTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  // batch, q_heads, kv_heads and head_dim; tokens = tokens per batch of q (and per lse row).
  AttentionShape shape;
  int64_t kv_tokens = 0;  // tokens per batch of k and v; 0: shape.tokens
  int64_t o_tokens = 0;   // tokens per batch of o; 0: shape.tokens
  DType dtype = DType::kBF16;
};

// Which rows and heads of those tensors the launch covers, and how.
struct FlashFwdRange {
  int64_t q_len = 0;    // query rows per segment
  int64_t kv_len = -1;  // key rows per segment; -1: q_len
  // Tokens between consecutive rows (a dilated branch's rate reads its positions in place).
  int64_t row_step = 1;
  int64_t num_segments = 1;   // equal-length segments per batch (folded into grid.z)
  int64_t segment_pitch = 0;  // tokens between consecutive segments' first rows
  // Global positions of query row 0 and key row 0 (the causal and rule masks compare them).
  int64_t q_pos_offset = 0;
  int64_t k_pos_offset = 0;
  // Query heads head_start, head_start + head_step, ... (num_heads of them; 0: every head).
  int32_t head_start = 0;
  int32_t head_step = 1;
  int32_t num_heads = 0;
  // LSE-merge into (o as f32, lse) instead of storing (FlashFwdParams::accumulate).
  bool accumulate = false;
};

// The block layout a launch walks (device memory owned by the caller).
struct FlashFwdLayoutView {
  enum class Kind {
    kDense,        // every key block (implicit: no CSR)
    kDenseCausal,  // blocks [0, row] of a square, aligned layout (implicit)
    kCsr,          // row_ptr / col_idx / block_mask, rectangular allowed
  };
  Kind kind = Kind::kDense;
  int32_t block_size = 128;             // 64 or 128: the query tile of one CTA
  const int64_t* row_ptr = nullptr;     // kCsr: [query blocks + 1]
  const int32_t* col_idx = nullptr;     // kCsr: kept key blocks, ascending per row
  const uint8_t* block_mask = nullptr;  // kCsr: BlockMask per entry of col_idx
  const int32_t* row_order = nullptr;   // optional: grid.x -> query block (heavy rows first)
  // kCsr: the token rule of kPartial blocks, on global positions (a TokenRule or IntervalRule
  // without segments): key j admitted for query i when (!rule_causal || j <= i) and
  // (rule_window < 0 || |i - j| <= rule_window).
  bool rule_causal = false;
  int64_t rule_window = -1;
  // kCsr: every entry kFull and the key length a multiple of block_size (FlashFwdParams::
  // csr_all_full). Left false where the caller does not know it.
  bool all_full = false;
};

// `scale` is the softmax scale applied to q.k (EffectiveScale of the spec).
FlashFwdParams BuildFlashFwdParams(const FlashFwdTensors& tensors, const FlashFwdRange& range,
                                   const FlashFwdLayoutView& layout, float scale);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_PARAMS_BUILDER_H_
