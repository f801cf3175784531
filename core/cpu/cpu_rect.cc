// CpuAttentionRect: any request (a query offset, Nq != Nkv, packed sequences) as the RectLayouts of
// its spans, each run by CpuAttentionPiece into float32 accumulators: the ring's machinery with
// one span (or one per sequence) instead of one piece per ring step.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_tile.h"
#include "core/cpu/merge.h"
#include "core/spec/rect_pattern.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

using cpu_detail::kNegInf;
using cpu_detail::LoadRow;
using cpu_detail::RunItems;
using cpu_detail::StoreRow;

// `t` as float32 rows: the tensor itself when it is float32, else a converted copy in `copy`.
absl::StatusOr<const float*> AsFloat32(const HostTensor& t, HostTensor& copy,
                                       const CpuRunOptions& options) {
  if (t.dtype() == DType::kF32) return t.data_as<float>();
  ATTN_ASSIGN_OR_RETURN(copy, HostTensor::Create(DType::kF32, t.dims(), options.tracker));
  const int64_t row = t.dim(2) * t.dim(3);  // every head of one token
  float* dst = copy.data_as<float>();
  ATTN_RETURN_IF_ERROR(RunItems(options.pool, options.cancel, t.dim(0) * t.dim(1),
                                [&](int64_t i) { LoadRow(t, i * row, row, 1.f, dst + i * row); }));
  return dst;
}

// One request's run: its inputs as float32 [B, rows, heads, D], the accumulators every span
// merges into, and the figures.
struct RectRun {
  const AttentionSpec& spec;
  const AttentionShape& s;
  const CpuRunOptions& options;
  const float* q;  // [B, Nq, Hq, D]
  const float* k;  // [B, Nkv, Hkv, D]
  const float* v;
  float* acc_o;    // [B, Nq, Hq, D]
  float* acc_lse;  // [B, Hq, Nq]
  bool count_pairs;
  std::atomic<int64_t> pairs{0};  // per (batch, head) pair units, see Count
};

// Dense, window and block_sparse: the span's pieces on the request's own buffers.
absl::Status RunPlainSpan(RectRun& run, const QuerySpan& span, ThreadPool* pool) {
  const AttentionShape& s = run.s;
  ATTN_ASSIGN_OR_RETURN(const std::vector<RectLayout> layouts,
                        SpanLayouts(run.spec, span, run.options.compile));
  std::vector<HeadPair> heads;
  for (int64_t h = 0; h < s.q_heads; ++h) {
    heads.push_back({static_cast<int32_t>(h),
                     static_cast<int32_t>(h / (s.q_heads / s.kv_heads))});
  }
  CpuPieceArgs args;
  args.batch = s.batch;
  args.head_dim = s.head_dim;
  args.q = run.q;
  args.q_rows = s.tokens;
  args.q_heads = s.q_heads;
  args.k = run.k;
  args.v = run.v;
  args.kv_rows = s.kv_len();
  args.kv_heads = s.kv_heads;
  args.heads = heads;
  args.acc_o = run.acc_o;
  args.acc_lse = run.acc_lse;
  args.k_row0 = span.k_row;
  CpuRunOptions piece_options;
  piece_options.pool = pool;
  piece_options.cancel = run.options.cancel;
  for (const RectLayout& layout : layouts) {
    args.q_row0 = span.q_row + (layout.q_begin - span.q_pos);
    ATTN_RETURN_IF_ERROR(CpuAttentionPiece(run.spec, layout, args, piece_options));
    if (run.count_pairs) run.pairs += layout.AdmittedPairs() * s.q_heads;
  }
  return absl::OkStatus();
}

// Dilated: per branch and head offset, gather the set's rows of the span (queries of the offset's
// heads, keys of their KV heads), run the segmented piece on them, and LSE-merge the gathered
// rows back. Groups run one after the other, so no two write the same accumulator row at once.
absl::Status RunDilatedSpan(RectRun& run, const DilatedSpec& dilated, const QuerySpan& span,
                            ThreadPool* pool) {
  const AttentionShape& s = run.s;
  const int64_t B = s.batch, D = s.head_dim, Hq = s.q_heads, Hkv = s.kv_heads;
  const int64_t Nq = s.tokens, Nkv = s.kv_len();
  const int64_t g = Hq / Hkv;
  for (size_t br = 0; br < dilated.segment_lengths.size(); ++br) {
    const int64_t w = dilated.segment_lengths[br], r = dilated.dilation_rates[br];
    for (int64_t o = 0; o < std::min(r, Hq); ++o) {
      const DilatedSpanGroup group = BuildDilatedSpanGroup(span, w, r, o);
      if (group.q_rows.empty() || group.k_rows.empty()) continue;  // nothing admitted
      const RectLayout layout =
          DilatedGroupLayout(group, run.spec.causal, run.options.compile.block_size);
      if (layout.kept_tiles() == 0) continue;
      std::vector<int64_t> q_heads, kv_heads;  // global heads, local index = position here
      std::vector<HeadPair> pairs;
      for (const int64_t h : DilatedGroupHeads(Hq, r, o)) {
        if (kv_heads.empty() || kv_heads.back() != h / g) kv_heads.push_back(h / g);
        pairs.push_back({static_cast<int32_t>(q_heads.size()),
                         static_cast<int32_t>(kv_heads.size() - 1)});
        q_heads.push_back(h);
      }
      const int64_t nq = static_cast<int64_t>(group.q_rows.size());
      const int64_t nk = static_cast<int64_t>(group.k_rows.size());
      const int64_t hq = static_cast<int64_t>(q_heads.size());
      const int64_t hkv = static_cast<int64_t>(kv_heads.size());
      ATTN_ASSIGN_OR_RETURN(HostTensor gq, HostTensor::Create(DType::kF32, {B, nq, hq, D},
                                                              run.options.tracker));
      ATTN_ASSIGN_OR_RETURN(HostTensor gkv, HostTensor::Create(DType::kF32, {2, B, nk, hkv, D},
                                                               run.options.tracker));
      ATTN_ASSIGN_OR_RETURN(HostTensor acc, HostTensor::Create(DType::kF32, {B, nq, hq, D},
                                                               run.options.tracker));
      ATTN_ASSIGN_OR_RETURN(HostTensor acc_lse, HostTensor::Create(DType::kF32, {B, hq, nq},
                                                                   run.options.tracker));
      std::fill_n(acc.data_as<float>(), acc.numel(), 0.f);
      std::fill_n(acc_lse.data_as<float>(), acc_lse.numel(), kNegInf);
      float* gk = gkv.data_as<float>();
      float* gv = gk + B * nk * hkv * D;
      // Items: (b, gathered query row), then (b, gathered key row).
      ATTN_RETURN_IF_ERROR(RunItems(pool, run.options.cancel, B * (nq + nk), [&](int64_t i) {
        const bool is_q = i < B * nq;
        const int64_t bi = is_q ? i : i - B * nq;
        const int64_t n = is_q ? nq : nk;
        const int64_t b = bi / n, x = bi % n;
        if (is_q) {
          const int64_t row = span.q_row + group.q_rows[x];
          for (int64_t h = 0; h < hq; ++h) {
            std::copy_n(run.q + ((b * Nq + row) * Hq + q_heads[h]) * D, D,
                        gq.data_as<float>() + ((b * nq + x) * hq + h) * D);
          }
          return;
        }
        const int64_t row = span.k_row + group.k_rows[x];
        for (int64_t h = 0; h < hkv; ++h) {
          const int64_t src = ((b * Nkv + row) * Hkv + kv_heads[h]) * D;
          const int64_t dst = ((b * nk + x) * hkv + h) * D;
          std::copy_n(run.k + src, D, gk + dst);
          std::copy_n(run.v + src, D, gv + dst);
        }
      }));
      CpuPieceArgs args;
      args.batch = B;
      args.head_dim = D;
      args.q = gq.data_as<float>();
      args.q_rows = nq;
      args.q_heads = hq;
      args.k = gk;
      args.v = gv;
      args.kv_rows = nk;
      args.kv_heads = hkv;
      args.heads = pairs;
      args.acc_o = acc.data_as<float>();
      args.acc_lse = acc_lse.data_as<float>();
      CpuRunOptions piece_options;
      piece_options.pool = pool;
      piece_options.cancel = run.options.cancel;
      ATTN_RETURN_IF_ERROR(CpuAttentionPiece(run.spec, layout, args, piece_options));
      if (run.count_pairs) run.pairs += layout.AdmittedPairs() * hq;
      ATTN_RETURN_IF_ERROR(RunItems(pool, run.options.cancel, B * nq, [&](int64_t i) {
        const int64_t b = i / nq, x = i % nq;
        const int64_t row = span.q_row + group.q_rows[x];
        for (int64_t h = 0; h < hq; ++h) {
          const int64_t gh = q_heads[h];
          MergePartialRows(1, D, run.acc_o + ((b * Nq + row) * Hq + gh) * D, D,
                           run.acc_lse + (b * Hq + gh) * Nq + row, 1,
                           acc.data_as<float>() + ((b * nq + x) * hq + h) * D, D,
                           acc_lse.data_as<float>() + (b * hq + h) * nq + x, 1);
        }
      }));
    }
  }
  return absl::OkStatus();
}

absl::Status RunSpan(RectRun& run, const QuerySpan& span, ThreadPool* pool) {
  if (const auto* d = std::get_if<DilatedSpec>(&run.spec.pattern)) {
    return RunDilatedSpan(run, *d, span, pool);
  }
  return RunPlainSpan(run, span, pool);
}

// Many spans (a packed batch of short sequences) run one per pool item, each inline: a span is
// then too small to spread, and one pool hand-out per piece would dominate. Few spans spread their
// own pieces over the pool instead. Spans write disjoint query rows, so either order is safe.
absl::Status RunSpans(RectRun& run, const std::vector<QuerySpan>& spans) {
  ThreadPool* pool = run.options.pool;
  if (pool == nullptr || static_cast<int64_t>(spans.size()) <= pool->num_threads()) {
    for (const QuerySpan& span : spans) ATTN_RETURN_IF_ERROR(RunSpan(run, span, pool));
    return absl::OkStatus();
  }
  std::mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  ATTN_RETURN_IF_ERROR(
      RunItems(pool, run.options.cancel, static_cast<int64_t>(spans.size()), [&](int64_t i) {
        if (failed.load(std::memory_order_relaxed)) return;
        absl::Status status = RunSpan(run, spans[i], nullptr);
        if (status.ok()) return;
        failed.store(true, std::memory_order_relaxed);
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = std::move(status);
      }));
  return first_error;
}

}  // namespace

absl::Status CpuAttentionRectInto(const AttentionSpec& spec, const HostTensor& q,
                                  const HostTensor& k, const HostTensor& v,
                                  const CpuRunOptions& options, HostTensor& o, HostTensor& lse,
                                  CpuRectFigures* figures) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, s));
  if (o.dtype() != q.dtype() || o.dims() != q.dims()) {
    return absl::InvalidArgumentError(absl::StrCat("o: expected ", q.DebugString(), ", got ",
                                                   o.DebugString()));
  }
  const std::vector<int64_t> lse_dims = {s.batch, s.q_heads, s.tokens};
  if (lse.dtype() != DType::kF32 || lse.dims() != lse_dims) {
    return absl::InvalidArgumentError(absl::StrCat("lse: expected [", s.batch, ", ", s.q_heads,
                                                   ", ", s.tokens, "] f32, got ",
                                                   lse.DebugString()));
  }
  HostTensor q_copy, k_copy, v_copy, acc_copy;
  ATTN_ASSIGN_OR_RETURN(const float* qf, AsFloat32(q, q_copy, options));
  ATTN_ASSIGN_OR_RETURN(const float* kf, AsFloat32(k, k_copy, options));
  ATTN_ASSIGN_OR_RETURN(const float* vf, AsFloat32(v, v_copy, options));
  // A float32 O is its own accumulator; other dtypes accumulate in float32 and convert at the end.
  float* acc = nullptr;
  if (o.dtype() == DType::kF32) {
    acc = o.data_as<float>();
  } else {
    ATTN_ASSIGN_OR_RETURN(acc_copy, HostTensor::Create(DType::kF32, o.dims(), options.tracker));
    acc = acc_copy.data_as<float>();
  }
  // Rows no span reaches (no admissible key) keep O = 0, LSE = -inf.
  std::fill_n(acc, o.numel(), 0.f);
  std::fill_n(lse.data_as<float>(), lse.numel(), kNegInf);

  RectRun run{spec, s, options, qf, kf, vf, acc, lse.data_as<float>(), figures != nullptr};
  const std::vector<QuerySpan> spans = RequestSpans(spec, s);
  ATTN_RETURN_IF_ERROR(RunSpans(run, spans));
  if (figures != nullptr) {
    double possible = 0;
    for (const QuerySpan& span : spans) {
      possible += static_cast<double>(span.q_len) * static_cast<double>(span.k_len);
    }
    const double heads = static_cast<double>(s.batch) * static_cast<double>(s.q_heads);
    figures->admitted_pairs = static_cast<double>(run.pairs.load()) * s.batch;
    figures->possible_pairs = possible * heads;
  }
  if (o.dtype() == DType::kF32) return absl::OkStatus();
  const int64_t row = s.q_heads * s.head_dim;
  return RunItems(options.pool, options.cancel, s.batch * s.tokens,
                  [&](int64_t i) { StoreRow(acc + i * row, row, o, i * row); });
}

absl::StatusOr<AttentionOutputs> CpuAttentionRect(const AttentionSpec& spec, const HostTensor& q,
                                                  const HostTensor& k, const HostTensor& v,
                                                  const CpuRunOptions& options,
                                                  CpuRectFigures* figures) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  AttentionOutputs out;
  ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(q.dtype(), q.dims(), options.tracker));
  ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens},
                                                    options.tracker));
  ATTN_RETURN_IF_ERROR(CpuAttentionRectInto(spec, q, k, v, options, out.o, out.lse, figures));
  return out;
}

}  // namespace attnserve
