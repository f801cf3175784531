// CudaAttentionPlan for requests that are not square (docs/DESIGN.md "The math": Nq != Nkv, a
// query offset, packed sequences): the request's spans and their RectLayouts come from
// core/spec/rect_pattern.h, the same pieces the CPU backend runs; each is uploaded as a CSR and
// launched on the flash kernels with its own query rows, key rows and positions. The pieces
// cover disjoint query rows, so each stores its rows (no accumulation); rows no piece covers
// (no admissible key) keep O = 0 and LSE = -inf from the fill before the launches.
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_attention_rect.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/device_upload.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"
#include "core/spec/rect_pattern.h"
#include "core/util/status_macros.h"

namespace attnserve {

absl::Status CudaAttentionPlan::BuildRect(const AttentionSpec& spec, const CompileOptions& options,
                                          cudaStream_t stream) {
  auto rect = std::make_unique<Rect>();
  double pairs = 0, kept = 0, tiles = 0;
  for (const QuerySpan& span : RequestSpans(spec, shape_)) {
    ATTN_ASSIGN_OR_RETURN(std::vector<RectLayout> layouts, SpanLayouts(spec, span, options));
    for (const RectLayout& l : layouts) {
      if (l.rule.segment_starts != nullptr) {
        return absl::InternalError("rect plan: a segmented rule outside a dilated spec");
      }
      Rect::Piece p;
      p.q_row = span.q_row + (l.q_begin - span.q_pos);
      p.q_pos = l.q_begin;
      p.q_len = l.q_len;
      p.k_row = span.k_row + l.k_begin;
      p.k_len = l.k_len;
      p.tile = l.tile;
      p.rule_causal = l.rule.causal;
      p.rule_window = l.rule.window ? *l.rule.window : -1;
      std::vector<uint8_t> mask(l.mask.size());
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint8_t>(l.mask[i]);
      // Heaviest query tiles first, as for square layouts.
      std::vector<int32_t> order(static_cast<size_t>(l.num_q_tiles()));
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return l.row_ptr[a + 1] - l.row_ptr[a] > l.row_ptr[b + 1] - l.row_ptr[b];
      });
      ATTN_ASSIGN_OR_RETURN(p.row_ptr, UploadVector(*alloc_, l.row_ptr, stream));
      ATTN_ASSIGN_OR_RETURN(p.col_idx, UploadVector(*alloc_, l.col_idx, stream));
      ATTN_ASSIGN_OR_RETURN(p.mask, UploadVector(*alloc_, mask, stream));
      ATTN_ASSIGN_OR_RETURN(p.row_order, UploadVector(*alloc_, order, stream));
      plan_bytes_ += static_cast<int64_t>(l.row_ptr.size() * 8 + l.col_idx.size() * 5 +
                                          order.size() * 4);
      pairs += static_cast<double>(l.AdmittedPairs());
      kept += static_cast<double>(l.kept_tiles());
      tiles += static_cast<double>(l.num_q_tiles() * l.num_k_tiles());
      rect->pieces.push_back(std::move(p));
    }
  }
  flops_ = 4.0 * static_cast<double>(shape_.batch * shape_.q_heads * shape_.head_dim) * pairs;
  sparsity_ = tiles > 0 ? 1.0 - kept / tiles : 0.0;
  rect_ = std::move(rect);
  return absl::OkStatus();
}

absl::Status CudaAttentionPlan::RunRect(const void* q, const void* k, const void* v, void* o,
                                        float* lse, cudaStream_t stream,
                                        const std::atomic<bool>* cancel,
                                        FlashKernel* kernel) const {
  const int64_t b = shape_.batch, nq = shape_.tokens, nkv = shape_.kv_len(), hq = shape_.q_heads,
                hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(compute_dtype_));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o, 0, static_cast<size_t>(b * nq * hq * d * es), stream));
  CUDA_RETURN_IF_ERROR(LaunchFillFloat(lse, -INFINITY, b * hq * nq, stream));
  for (const Rect::Piece& p : rect_->pieces) {
    if (cancel != nullptr && cancel->load()) return absl::CancelledError("cancelled");
    FlashFwdTensors t;
    t.q = static_cast<const char*>(q) + p.q_row * hq * d * es;
    t.k = static_cast<const char*>(k) + p.k_row * hkv * d * es;
    t.v = static_cast<const char*>(v) + p.k_row * hkv * d * es;
    t.o = static_cast<char*>(o) + p.q_row * hq * d * es;
    t.lse = lse + p.q_row;
    t.shape = shape_;  // tokens = Nq: the batch and LSE row pitch of q, o and lse
    t.kv_tokens = nkv;
    t.dtype = compute_dtype_;
    FlashFwdRange range;
    range.q_len = p.q_len;
    range.kv_len = p.k_len;
    range.q_pos_offset = p.q_pos;
    range.k_pos_offset = 0;
    FlashFwdLayoutView view;
    view.kind = FlashFwdLayoutView::Kind::kCsr;
    view.block_size = p.tile;
    view.row_ptr = p.row_ptr.as<int64_t>();
    view.col_idx = p.col_idx.as<int32_t>();
    view.block_mask = p.mask.as<uint8_t>();
    view.row_order = p.row_order.as<int32_t>();
    view.rule_causal = p.rule_causal;
    view.rule_window = p.rule_window;
    ATTN_RETURN_IF_ERROR(RunAttentionForward(BuildFlashFwdParams(t, range, view, scale_),
                                             kernel_options_, stream, kernel));
  }
  return absl::OkStatus();
}

}  // namespace attnserve
