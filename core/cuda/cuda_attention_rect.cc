// CudaAttentionPlan for requests that are not square (docs/DESIGN.md "The math": Nq != Nkv, a
// query offset, packed sequences), span by span (core/spec/rect_pattern.h: RequestSpans):
//   - window and block_sparse spans: their RectLayouts (SpanLayouts, the pieces the CPU backend
//     runs), each uploaded as a CSR and launched with its own rows and positions; the layouts of
//     a span cover disjoint query rows, so each stores its rows;
//   - dense spans: no CSR at all (a chunk of a 1M-token prefill would list millions of tiles):
//     not causal, one implicit dense launch; causal, the keys before the span's first query are
//     admitted for every query (one implicit dense launch), the keys at the queries' positions
//     form a square causal diagonal (the kernel's implicit causal layout), and queries past the
//     last key see every key from the first query's position on (implicit dense). Those pieces
//     overlap on query rows, so they LSE-merge into an f32 accumulator.
// Spans with few query rows per KV head (decode steps: q_len * Hq / Hkv <= 64) of dense and window
// specs run instead as one split-KV decode piece each (core/cuda/flash_decode: the keys cut over
// enough CTAs to fill the GPU, the query heads of a KV head packed so each K/V byte is read once),
// which writes its rows' O and LSE itself (into the f32 accumulator when there is one).
// Rows no piece covers (no admissible key) keep O = 0 and LSE = -inf from the fill before the
// launches.
#include "core/cuda/cuda_attention_rect.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/device_upload.h"
#include "core/cuda/flash_decode/flash_decode.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"
#include "core/spec/rect_pattern.h"
#include "core/util/status_macros.h"

namespace attnserve {

namespace {

using Kind = FlashFwdLayoutView::Kind;

// One implicit launch of a dense span: query rows [q0, q0 + q_len) of the span against its key
// rows [k0, k0 + k_len) (positions: the span's query positions, and keys at their rows).
struct DensePiece {
  Kind kind;
  int64_t q0, q_len, k0, k_len;
};

// The implicit pieces of a dense span (see the file comment), and its admitted pairs. Key row
// offsets k0 are within the span's keys, whose first sits at position span.k_pos (0 unless the keys
// are a shard of a longer sequence); with causal, query rows before that position admit nothing
// and are left out.
double DensePieces(const QuerySpan& span, bool causal, std::vector<DensePiece>* out) {
  const auto add = [&](Kind kind, int64_t q0, int64_t q_len, int64_t k0, int64_t k_len) {
    if (q_len > 0 && k_len > 0) out->push_back({kind, q0, q_len, k0, k_len});
  };
  const int64_t K = span.k_len;
  if (!causal) {
    add(Kind::kDense, 0, span.q_len, 0, K);
    return static_cast<double>(span.q_len) * static_cast<double>(K);
  }
  int64_t P = span.q_pos - span.k_pos;  // the first query's position, counted from key row 0
  const int64_t s = P < 0 ? std::min(span.q_len, -P) : 0;  // leading rows that admit nothing
  P += s;
  const int64_t L = span.q_len - s;
  const int64_t before = std::min(P, K);                           // keys every query admits
  const int64_t m = std::max<int64_t>(0, std::min(K, P + L) - P);  // the square diagonal
  add(Kind::kDense, s, L, 0, before);
  add(Kind::kDenseCausal, s, m, P, m);
  add(Kind::kDense, s + m, L - m, P, m);
  const double dm = static_cast<double>(m);
  return static_cast<double>(L) * static_cast<double>(before) + dm * (dm + 1) / 2 +
         static_cast<double>(L - m) * dm;
}

// The decode problem of a split-KV piece, with the tensors of the whole request at its rows.
FlashDecodeProblem DecodeProblem(const CudaAttentionPlan::Rect::Piece& p,
                                 const AttentionShape& shape, DType dtype, float scale) {
  FlashDecodeProblem d;
  d.tensors.shape = shape;  // tokens = Nq: the batch and LSE row pitch of q, o and lse
  d.tensors.kv_tokens = shape.kv_len();
  d.tensors.dtype = dtype;
  d.q_len = p.q_len;
  d.kv_len = p.k_len;
  d.q_pos = p.q_pos;
  d.k_pos = p.k_pos;
  d.causal = p.rule_causal;
  d.window = p.rule_window;
  d.scale = scale;
  return d;
}

// One split-KV decode piece: q/k/v/o/lse are the request's tensors (o: the output, or the f32
// accumulator when `o_f32`); the split workspace is the plan's (the pieces of a run share it: they
// run in order on one stream).
absl::Status RunDecodePiece(const CudaAttentionPlan::Rect::Piece& p, const AttentionShape& shape,
                            DType dtype, float scale, bool o_f32,
                            const FlashKernelOptions& options, const CudaAttentionPlan& plan,
                            const void* q, const void* k, const void* v, void* o, float* lse,
                            cudaStream_t stream, FlashKernel* ran) {
  const int64_t hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t o_es = o_f32 ? 4 : es;
  FlashDecodeProblem problem = DecodeProblem(p, shape, dtype, scale);
  problem.tensors.q = static_cast<const char*>(q) + p.q_row * hq * d * es;
  problem.tensors.k = static_cast<const char*>(k) + p.k_row * hkv * d * es;
  problem.tensors.v = static_cast<const char*>(v) + p.k_row * hkv * d * es;
  problem.tensors.o = static_cast<char*>(o) + p.q_row * hq * d * o_es;
  problem.tensors.lse = lse + p.q_row;
  problem.o_f32 = o_f32;
  FlashDecodeParams params = BuildFlashDecodeParams(problem);
  if (FlashDecodeEmpty(params)) return absl::OkStatus();  // O = 0, LSE = -inf from the fill
  ATTN_RETURN_IF_ERROR(PlanFlashDecodeSplits(&params, options.decode_splits, options.arch));
  *ran = params.wgmma ? FlashKernel::kSplitKvDecodeSm90 : FlashKernel::kSplitKvDecode;
  if (const int64_t bytes = FlashDecodeWorkspaceBytes(params); bytes > 0) {
    ATTN_ASSIGN_OR_RETURN(
        void* splits, plan.Workspace(CudaAttentionPlan::WorkspaceSlot::kDecodeSplits, bytes));
    SetFlashDecodeWorkspace(&params, splits);
  }
  return RunFlashDecode(params, stream);
}

}  // namespace

absl::Status CudaAttentionPlan::BuildRect(const AttentionSpec& spec, const CompileOptions& options,
                                          cudaStream_t stream) {
  auto rect = std::make_unique<Rect>();
  const bool dense = std::holds_alternative<DenseSpec>(spec.pattern);
  const auto* window = std::get_if<WindowSpec>(&spec.pattern);
  const int64_t group = shape_.q_heads / shape_.kv_heads;
  const auto is_decode = [&](const QuerySpan& span) {
    return (dense || window != nullptr) && kernel_options_.decode == DecodeKernel::kSplitKv &&
           FlashDecodeSupports(shape_.head_dim, compute_dtype_, span.q_len, group);
  };
  double pairs = 0, kept = 0, tiles = 0;
  int64_t decoded_rows = 0;  // query rows of non-empty decode pieces
  bool only_decode = true;
  for (const QuerySpan& span : RequestSpans(spec, shape_)) {
    if (span.q_len > 0 && is_decode(span)) {
      Rect::Piece p;
      p.decode = true;
      p.q_row = span.q_row;
      p.q_pos = span.q_pos;
      p.q_len = span.q_len;
      p.k_row = span.k_row;
      p.k_pos = span.k_pos;
      p.k_len = span.k_len;
      p.tile = options.block_size;
      p.rule_causal = spec.causal;
      p.rule_window = WindowWithin(spec, span.extent()).value_or(-1);
      const FlashDecodeParams d =
          BuildFlashDecodeParams(DecodeProblem(p, shape_, compute_dtype_, scale_));
      pairs += static_cast<double>(FlashDecodeAdmittedPairs(d));
      tiles += static_cast<double>(NumBlocks(span.k_len, options.block_size));
      kept += static_cast<double>(NumBlocks(d.key_end - d.key_begin, options.block_size));
      if (!FlashDecodeEmpty(d)) decoded_rows += span.q_len;
      rect->pieces.push_back(std::move(p));
      continue;
    }
    only_decode = false;
    if (dense) {
      rect->accumulate = rect->accumulate || spec.causal;
      std::vector<DensePiece> parts;
      pairs += DensePieces(span, spec.causal, &parts);
      for (const DensePiece& d : parts) {
        Rect::Piece p;
        p.kind = d.kind;
        p.q_row = span.q_row + d.q0;
        p.q_pos = span.q_pos + d.q0;
        p.q_len = d.q_len;
        p.k_row = span.k_row + d.k0;
        p.k_pos = span.k_pos + d.k0;
        p.k_len = d.k_len;
        p.tile = options.block_size;
        // (One tile needs no order: skipping it spares decode steps a synchronous upload.)
        if (d.kind == Kind::kDenseCausal && NumBlocks(p.q_len, p.tile) > 1) {
          // Heaviest (longest) query tiles of the diagonal first, as for square causal layouts.
          std::vector<int32_t> order(static_cast<size_t>(NumBlocks(p.q_len, p.tile)));
          for (size_t t = 0; t < order.size(); ++t) {
            order[t] = static_cast<int32_t>(order.size() - 1 - t);
          }
          ATTN_ASSIGN_OR_RETURN(p.row_order, UploadVector(*alloc_, order, stream));
          plan_bytes_ += static_cast<int64_t>(order.size() * 4);
        }
        rect->pieces.push_back(std::move(p));
      }
      const double q_tiles = static_cast<double>(NumBlocks(span.q_len, options.block_size));
      const double k_tiles = static_cast<double>(NumBlocks(span.k_len, options.block_size));
      tiles += q_tiles * k_tiles;
      kept += spec.causal ? std::min(q_tiles * k_tiles,
                                     q_tiles * static_cast<double>(NumBlocks(
                                                   span.q_pos + span.q_len, options.block_size)))
                          : q_tiles * k_tiles;
      continue;
    }
    ATTN_ASSIGN_OR_RETURN(std::vector<RectLayout> layouts, SpanLayouts(spec, span, options));
    for (const RectLayout& l : layouts) {
      if (l.rule.segment_starts != nullptr) {
        return absl::InternalError("rect plan: a segmented rule outside a dilated spec");
      }
      Rect::Piece p;
      p.q_row = span.q_row + (l.q_begin - span.q_pos);
      p.q_pos = l.q_begin;
      p.q_len = l.q_len;
      p.k_row = span.k_row + (l.k_begin - span.k_pos);  // layouts count keys from span.k_pos
      p.k_pos = l.k_begin;
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
      plan_bytes_ +=
          static_cast<int64_t>(l.row_ptr.size() * 8 + l.col_idx.size() * 5 + order.size() * 4);
      pairs += static_cast<double>(l.AdmittedPairs());
      kept += static_cast<double>(l.kept_tiles());
      tiles += static_cast<double>(l.num_q_tiles() * l.num_k_tiles());
      rect->pieces.push_back(std::move(p));
    }
  }
  rect->fill_outputs = !(only_decode && decoded_rows == shape_.tokens);
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
  const int64_t o_elems = b * nq * hq * d;
  void* acc = nullptr;  // f32 O accumulator of overlapping pieces
  if (rect_->accumulate) {
    ATTN_ASSIGN_OR_RETURN(acc, Workspace(WorkspaceSlot::kOAccF32, workspace_.o_acc_f32));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, static_cast<size_t>(o_elems * 4), stream));
  } else if (rect_->fill_outputs) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o, 0, static_cast<size_t>(o_elems * es), stream));
  }
  if (rect_->fill_outputs) {
    CUDA_RETURN_IF_ERROR(LaunchFillFloat(lse, -INFINITY, b * hq * nq, stream));
  }
  void* const o_base = rect_->accumulate ? acc : o;
  const int64_t o_es = rect_->accumulate ? 4 : es;
  for (const Rect::Piece& p : rect_->pieces) {
    if (cancel != nullptr && cancel->load()) return absl::CancelledError("cancelled");
    if (p.decode) {
      FlashKernel ran = FlashKernel::kSplitKvDecode;
      ATTN_RETURN_IF_ERROR(RunDecodePiece(p, shape_, compute_dtype_, scale_, rect_->accumulate,
                                          kernel_options_, *this, q, k, v, o_base, lse, stream,
                                          &ran));
      if (kernel != nullptr) *kernel = ran;
      continue;
    }
    FlashFwdTensors t;
    t.q = static_cast<const char*>(q) + p.q_row * hq * d * es;
    t.k = static_cast<const char*>(k) + p.k_row * hkv * d * es;
    t.v = static_cast<const char*>(v) + p.k_row * hkv * d * es;
    t.o = static_cast<char*>(o_base) + p.q_row * hq * d * o_es;
    t.lse = lse + p.q_row;
    t.shape = shape_;  // tokens = Nq: the batch and LSE row pitch of q, o and lse
    t.kv_tokens = nkv;
    t.dtype = compute_dtype_;
    FlashFwdRange range;
    range.q_len = p.q_len;
    range.kv_len = p.k_len;
    range.q_pos_offset = p.q_pos;
    range.k_pos_offset = p.k_pos;
    range.accumulate = rect_->accumulate;
    FlashFwdLayoutView view;
    view.kind = p.kind;
    view.block_size = p.tile;
    view.row_order = p.row_order.size() > 0 ? p.row_order.as<int32_t>() : nullptr;
    if (p.kind == Kind::kCsr) {
      view.row_ptr = p.row_ptr.as<int64_t>();
      view.col_idx = p.col_idx.as<int32_t>();
      view.block_mask = p.mask.as<uint8_t>();
      view.rule_causal = p.rule_causal;
      view.rule_window = p.rule_window;
    }
    ATTN_RETURN_IF_ERROR(RunAttentionForward(BuildFlashFwdParams(t, range, view, scale_),
                                             kernel_options_, stream, kernel));
  }
  if (rect_->accumulate) {
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, acc, compute_dtype_, o, o_elems, stream));
  }
  return absl::OkStatus();
}

}  // namespace attnserve
