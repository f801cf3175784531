#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"

#include <cmath>

namespace attnserve {

FlashFwdParams BuildFlashFwdParams(const FlashFwdTensors& t, const FlashFwdRange& range,
                                   const FlashFwdLayoutView& layout, float scale) {
  const int64_t hq = t.shape.q_heads, hkv = t.shape.kv_heads, d = t.shape.head_dim;
  const int64_t q_tokens = t.shape.tokens;
  const int64_t kv_tokens = t.kv_tokens > 0 ? t.kv_tokens : q_tokens;
  const int64_t o_tokens = t.o_tokens > 0 ? t.o_tokens : q_tokens;
  const int64_t step = range.row_step, pitch = range.segment_pitch;
  FlashFwdParams p;
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.lse = t.lse;
  p.accumulate = range.accumulate;

  // A token of q/o is Hq * D elements, of k/v Hkv * D; rows are `step` tokens apart, segments
  // `pitch` tokens apart, batches a whole buffer apart.
  p.q_batch_stride = q_tokens * hq * d;
  p.q_seg_stride = pitch * hq * d;
  p.q_row_stride = step * hq * d;
  p.q_head_stride = d;
  p.o_batch_stride = o_tokens * hq * d;
  p.o_seg_stride = pitch * hq * d;
  p.o_row_stride = step * hq * d;
  p.o_head_stride = d;
  p.k_batch_stride = p.v_batch_stride = kv_tokens * hkv * d;
  p.k_seg_stride = p.v_seg_stride = pitch * hkv * d;
  p.k_row_stride = p.v_row_stride = step * hkv * d;
  p.k_head_stride = p.v_head_stride = d;
  // lse [B, Hq, tokens]: the same token walk within a head's row.
  p.lse_batch_stride = hq * q_tokens;
  p.lse_head_stride = q_tokens;
  p.lse_seg_stride = pitch;
  p.lse_row_stride = step;

  p.batch = static_cast<int32_t>(t.shape.batch);
  p.num_segs = static_cast<int32_t>(range.num_segments);
  p.seqlen = range.q_len;
  p.seqlen_k = range.kv_len;
  p.q_pos_offset = range.q_pos_offset;
  p.k_pos_offset = range.k_pos_offset;
  p.num_heads = range.num_heads > 0 ? range.num_heads : static_cast<int32_t>(hq);
  p.head_start = range.head_start;
  p.head_step = range.head_step;
  p.kv_group = static_cast<int32_t>(hq / hkv);
  p.head_dim = static_cast<int32_t>(d);
  p.block_size = layout.block_size;
  p.dtype = t.dtype;
  p.scale = scale;
  p.scale_log2 = static_cast<float>(scale * M_LOG2E);

  const int64_t kv_len = range.kv_len >= 0 ? range.kv_len : range.q_len;
  p.num_q_blocks = NumBlocks(range.q_len, layout.block_size);
  p.num_k_blocks = NumBlocks(kv_len, layout.block_size);
  p.row_order = layout.row_order;
  switch (layout.kind) {
    case FlashFwdLayoutView::Kind::kDense:
      break;
    case FlashFwdLayoutView::Kind::kDenseCausal:
      p.dense_causal = true;
      break;
    case FlashFwdLayoutView::Kind::kCsr:
      p.row_ptr = layout.row_ptr;
      p.col_idx = layout.col_idx;
      p.block_mask = layout.block_mask;
      p.rule_causal = layout.rule_causal;
      p.rule_window = layout.rule_window;
      p.csr_all_full = layout.all_full;
      break;
  }
  return p;
}

}  // namespace attnserve
