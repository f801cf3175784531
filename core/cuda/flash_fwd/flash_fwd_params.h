// FlashFwdParams: the whole host -> kernel contract of the flash_fwd family. Plain data, no
// ownership: every pointer is device memory owned by the caller and must outlive the launch.
//
// Element strides are int64 so that the same kernel runs on [B, N, H, D] tensors, on head subsets
// and on gathered dilated segments (a "segment" axis folded into grid.z). Query and key positions
// share one axis of length `seqlen` (self-attention over one sequence or one gathered segment).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_PARAMS_H_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_PARAMS_H_

#include <cstdint>

#include "core/tensor/dtype.h"

namespace attnserve {

struct FlashFwdParams {
  // Tensors. q/k/v/o hold `dtype` elements (bf16 or f16); lse is float32 natural-log.
  const void* q = nullptr;  // [batch, seg, seqlen, heads, head_dim] via the strides below
  const void* k = nullptr;  // same, with kv heads
  const void* v = nullptr;  // same, with kv heads
  void* o = nullptr;        // same as q; float32 when `accumulate`
  float* lse = nullptr;     // [batch, heads, seg, seqlen] via the lse strides

  // Element strides of q/k/v/o: batch, segment, token row, head.
  int64_t q_batch_stride = 0, q_seg_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_seg_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_seg_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_seg_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // Element strides of lse.
  int64_t lse_batch_stride = 0, lse_seg_stride = 0, lse_head_stride = 0, lse_row_stride = 1;

  // Accumulate mode (dilated branches, split keys): instead of storing, LSE-merge this result
  // into (o as float32, lse) in place: L = log(e^L_acc + e^L_new), O = e^(L_acc-L) O_acc +
  // e^(L_new-L) O_new; rows with no admissible key leave the accumulators untouched. Each
  // (row, head) must belong to one CTA of the launch; launches are ordered by the stream.
  bool accumulate = false;

  int32_t batch = 1;        // batches; grid.z = batch * num_segs
  int32_t num_segs = 1;     // equal-length segments per batch (1 for plain attention)
  int64_t seqlen = 0;       // query tokens per segment (and key tokens when seqlen_k < 0)
  int64_t seqlen_k = -1;    // key tokens per segment; -1: equal to seqlen
  // Global positions of query row 0 and key row 0: kCausalDiagonal and kPartial blocks compare
  // (q_pos_offset + query row) with (k_pos_offset + key row). Both 0 for self-attention.
  int64_t q_pos_offset = 0;
  int64_t k_pos_offset = 0;

  // Heads: CTA head index i (grid.y, i < num_heads) works on query head
  // h = head_start + i * head_step, which reads kv head h / kv_group.
  int32_t num_heads = 0;
  int32_t head_start = 0;
  int32_t head_step = 1;
  int32_t kv_group = 1;     // Hq / Hkv (GQA)

  int32_t head_dim = 0;     // 64 or 128 (compile-time in the kernel; checked by the dispatch)
  int32_t block_size = 0;   // 64 or 128: the layout's block = the query tile of one CTA
  DType dtype = DType::kBF16;

  float scale = 0.f;        // softmax scale applied to q.k
  float scale_log2 = 0.f;   // scale * log2(e): the kernel works in exp2

  // Block layout (device memory). When col_idx is null the layout is the implicit dense one:
  // row r keeps blocks [0, num_k_blocks) (causal: [0, r], the diagonal masked kCausalDiagonal;
  // causal needs seqlen_k == seqlen and equal position offsets). A CSR may be rectangular:
  // num_q_blocks rows over the query blocks, columns are key blocks in [0, num_k_blocks).
  const int64_t* row_ptr = nullptr;   // num_q_blocks + 1
  const int32_t* col_idx = nullptr;   // kept key blocks, ascending per row
  const uint8_t* block_mask = nullptr;  // BlockMask per entry of col_idx
  const int32_t* row_order = nullptr;   // optional: grid.x -> query block (heavy rows first)
  int64_t num_q_blocks = 0;
  int64_t num_k_blocks = 0;
  bool dense_causal = false;  // only for the implicit dense layout
  // CSR only: every entry kFull and the key length a multiple of the block, so that no tile
  // needs a mask (the sm90 kernel then runs its tile loop without the mask path).
  bool csr_all_full = false;

  // TokenRule of kPartial blocks.
  bool rule_causal = false;
  int64_t rule_window = -1;   // |i - j| <= window; -1: no window
};

// No tile of the launch needs a mask: a CSR of kFull entries (csr_all_full) or the implicit dense
// non-causal layout, over a key length that is a multiple of the block (no ragged last tile).
inline bool FlashFwdTilesAllFull(const FlashFwdParams& p) {
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  const bool full = p.col_idx != nullptr ? p.csr_all_full : !p.dense_causal;
  return full && p.block_size > 0 && nk % p.block_size == 0;
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_FLASH_FWD_PARAMS_H_
