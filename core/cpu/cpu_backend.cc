#include "core/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "Eigen/Core"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_tile.h"
#include "core/cpu/merge.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

using cpu_detail::AlignedFloats;
using cpu_detail::AttendQueryTile;
using cpu_detail::BlockResult;
using cpu_detail::HeadSlice;
using cpu_detail::LoadRow;
using cpu_detail::QueryTile;
using cpu_detail::RunItems;
using cpu_detail::SquareQueryTile;
using cpu_detail::StoreRow;
using cpu_detail::ThreadScratch;
using cpu_detail::TileScratch;
using cpu_detail::kNegInf;

// Float32 [B, H, N, D] copies of the inputs, charged to the tracker: every (batch, head) slice is
// contiguous rows, which is what the tile GEMMs read.
struct Workspaces {
  HostTensor q;  // [B, Hq, N, D], times the softmax scale
  HostTensor k;  // [B, Hkv, N, D]
  HostTensor v;  // [B, Hkv, N, D]
};

absl::StatusOr<Workspaces> MakeWorkspaces(const AttentionShape& s, float scale,
                                          const HostTensor& q, const HostTensor& k,
                                          const HostTensor& v, const CpuRunOptions& options) {
  Workspaces ws;
  ATTN_ASSIGN_OR_RETURN(ws.q, HostTensor::Create(DType::kF32,
                                                 {s.batch, s.q_heads, s.tokens, s.head_dim},
                                                 options.tracker));
  ATTN_ASSIGN_OR_RETURN(ws.k, HostTensor::Create(DType::kF32,
                                                 {s.batch, s.kv_heads, s.tokens, s.head_dim},
                                                 options.tracker));
  ATTN_ASSIGN_OR_RETURN(ws.v, HostTensor::Create(DType::kF32,
                                                 {s.batch, s.kv_heads, s.tokens, s.head_dim},
                                                 options.tracker));
  const int64_t N = s.tokens, D = s.head_dim;
  // Items: (b, head) of q, then of k and v; each transposes N rows of D.
  const int64_t nq = s.batch * s.q_heads, nkv = s.batch * s.kv_heads;
  ATTN_RETURN_IF_ERROR(RunItems(options.pool, options.cancel, nq + nkv, [&](int64_t i) {
    const bool is_q = i < nq;
    const int64_t bh = is_q ? i : i - nq;
    const int64_t H = is_q ? s.q_heads : s.kv_heads;
    const int64_t b = bh / H, h = bh % H;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t src = ((b * N + n) * H + h) * D;
      const int64_t dst = (bh * N + n) * D;
      if (is_q) {
        LoadRow(q, src, D, scale, ws.q.data_as<float>() + dst);
      } else {
        LoadRow(k, src, D, 1.f, ws.k.data_as<float>() + dst);
        LoadRow(v, src, D, 1.f, ws.v.data_as<float>() + dst);
      }
    }
  }));
  return ws;
}

// Dense, window and block_sparse: one softmax per row over the layout's kept blocks. Items are
// (query block, b, head), heaviest query blocks first for causal layouts so the dynamic
// schedule ends balanced.
absl::Status RunLayout(const AttentionShape& s, const BlockLayout& layout, const Workspaces& ws,
                       const CpuRunOptions& options, HostTensor& o, HostTensor& lse) {
  const int64_t N = s.tokens, D = s.head_dim, Hq = s.q_heads;
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t bh_count = s.batch * Hq;
  const int64_t nqb = layout.num_blocks;
  const IntervalRule rule = ToIntervalRule(layout.rule);
  return RunItems(options.pool, options.cancel, nqb * bh_count, [&](int64_t i) {
    const int64_t qb = nqb - 1 - i / bh_count;
    const int64_t bh = i % bh_count;
    const int64_t b = bh / Hq, h = bh % Hq;
    const int64_t kv = b * s.kv_heads + h / group;
    const HeadSlice in{ws.q.data_as<float>() + bh * N * D, ws.k.data_as<float>() + kv * N * D,
                       ws.v.data_as<float>() + kv * N * D, N, D};
    const int64_t q0 = qb * layout.block_size;
    const BlockResult res = AttendQueryTile(SquareQueryTile(layout, rule, qb, in), ThreadScratch());
    for (int64_t r = 0; r < res.rows; ++r) {
      StoreRow(res.o + r * D, D, o, ((b * N + q0 + r) * Hq + h) * D);
    }
    std::memcpy(lse.data_as<float>() + bh * N + q0, res.lse, res.rows * sizeof(float));
  });
}

// Dilated: per branch, per (b, head, segment) item, gather the segment's positions into
// contiguous scratch, run the tiled core over the dense (causal) segment layout, and LSE-merge
// the rows into a float32 accumulator. Branches run one after the other so that the items of
// one ParallelFor (disjoint segments of one head) never write the same accumulator row.
absl::Status RunDilated(const AttentionShape& s, const CompiledPattern& compiled,
                        const Workspaces& ws, const CpuRunOptions& options, bool causal,
                        HostTensor& o, HostTensor& lse) {
  const int64_t B = s.batch, N = s.tokens, D = s.head_dim, Hq = s.q_heads;
  const int64_t group = s.q_heads / s.kv_heads;
  const DilatedPlan& plan = *compiled.dilated;

  // The segment layout is used as a prefix (dense layouts are prefix-closed); build a longer one
  // if the compiled layout does not cover the longest gathered segment.
  int64_t longest = 0;
  for (const DilatedBranch& br : plan.branches) {
    for (const DilatedGroup& g : br.groups) {
      for (size_t t = 0; t + 1 < g.seg_start.size(); ++t) {
        longest = std::max(longest, g.seg_start[t + 1] - g.seg_start[t]);
      }
    }
  }
  const int32_t bs = compiled.layout.block_size > 0 ? compiled.layout.block_size : 128;
  BlockLayout own_layout;
  const BlockLayout* seg_layout = &compiled.layout;
  if (compiled.layout.seq_len < longest || compiled.layout.block_size <= 0) {
    own_layout = DenseLayout(longest, bs, causal);
    seg_layout = &own_layout;
  }

  const IntervalRule seg_rule = ToIntervalRule(seg_layout->rule);

  ATTN_ASSIGN_OR_RETURN(HostTensor acc_o,
                        HostTensor::Create(DType::kF32, {B, Hq, N, D}, options.tracker));
  float* acc = acc_o.data_as<float>();
  float* acc_lse = lse.data_as<float>();  // [B, Hq, N]: merged in place
  std::fill_n(acc, acc_o.numel(), 0.f);
  std::fill_n(acc_lse, lse.numel(), kNegInf);

  for (const DilatedBranch& br : plan.branches) {
    if (br.groups.empty()) continue;
    // Items of this branch: for every (b, h), the segments of h's group.
    std::vector<int64_t> head_start(Hq + 1, 0);
    for (int64_t h = 0; h < Hq; ++h) {
      const DilatedGroup& g = br.groups[h % br.rate];
      head_start[h + 1] = head_start[h] + std::max<int64_t>(0, g.seg_start.size() - 1);
    }
    const int64_t per_batch = head_start[Hq];
    ATTN_RETURN_IF_ERROR(RunItems(options.pool, options.cancel, B * per_batch, [&](int64_t i) {
      const int64_t b = i / per_batch;
      const int64_t rem = i % per_batch;
      const int64_t h =
          std::upper_bound(head_start.begin(), head_start.end(), rem) - head_start.begin() - 1;
      const int64_t t = rem - head_start[h];
      const DilatedGroup& g = br.groups[h % br.rate];
      const int64_t p0 = g.seg_start[t], len = g.seg_start[t + 1] - p0;
      if (len == 0) return;
      const int64_t* pos = g.positions.data() + p0;
      // Gathered (len, D) rows of q (head h) and k/v (its kv head).
      thread_local AlignedFloats gather;
      if (gather.size() < static_cast<size_t>(3 * len * D)) gather.resize(3 * len * D);
      float* gq = gather.data();
      float* gk = gq + len * D;
      float* gv = gk + len * D;
      const float* q_src = ws.q.data_as<float>() + (b * Hq + h) * N * D;
      const int64_t kv = b * s.kv_heads + h / group;
      const float* k_src = ws.k.data_as<float>() + kv * N * D;
      const float* v_src = ws.v.data_as<float>() + kv * N * D;
      for (int64_t x = 0; x < len; ++x) {
        std::memcpy(gq + x * D, q_src + pos[x] * D, D * sizeof(float));
        std::memcpy(gk + x * D, k_src + pos[x] * D, D * sizeof(float));
        std::memcpy(gv + x * D, v_src + pos[x] * D, D * sizeof(float));
      }
      const HeadSlice in{gq, gk, gv, len, D};
      float* acc_bh = acc + (b * Hq + h) * N * D;
      float* lse_bh = acc_lse + (b * Hq + h) * N;
      for (int64_t qb = 0; qb < NumBlocks(len, bs); ++qb) {
        const BlockResult res =
            AttendQueryTile(SquareQueryTile(*seg_layout, seg_rule, qb, in), ThreadScratch());
        for (int64_t r = 0; r < res.rows; ++r) {
          const int64_t p = pos[qb * bs + r];
          MergePartialRows(1, D, acc_bh + p * D, D, lse_bh + p, 1, res.o + r * D, D,
                           res.lse + r, 1);
        }
      }
    }));
  }

  // Accumulator [B, Hq, N, D] f32 -> O [B, N, Hq, D] in the input dtype.
  return RunItems(options.pool, options.cancel, B * Hq, [&](int64_t bh) {
    const int64_t b = bh / Hq, h = bh % Hq;
    for (int64_t n = 0; n < N; ++n) {
      StoreRow(acc + (bh * N + n) * D, D, o, ((b * N + n) * Hq + h) * D);
    }
  });
}

// The compiled pattern may come from elsewhere (the ring driver builds its own): every index the
// core will follow is checked first, in O(kept blocks), so a bad layout is an error, never an
// out-of-bounds read.
absl::Status CheckLayout(const BlockLayout& l, int64_t tokens) {
  if (l.seq_len != tokens || l.block_size <= 0 ||
      l.num_blocks != NumBlocks(tokens, l.block_size) ||
      static_cast<int64_t>(l.row_ptr.size()) != l.num_blocks + 1 ||
      l.mask.size() != l.col_idx.size() || l.row_ptr.front() != 0 ||
      l.row_ptr.back() != static_cast<int64_t>(l.col_idx.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("compiled.layout: compiled for ", l.seq_len, " tokens at block size ",
                     l.block_size, " (", l.num_blocks, " blocks, ", l.kept_blocks(),
                     " kept), inputs have ", tokens, " tokens"));
  }
  for (int64_t i = 0; i < l.num_blocks; ++i) {
    if (l.row_ptr[i + 1] < l.row_ptr[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("compiled.layout.row_ptr[", i + 1, "]: must be non-decreasing"));
    }
    for (int64_t e = l.row_ptr[i]; e < l.row_ptr[i + 1]; ++e) {
      if (l.col_idx[e] < 0 || l.col_idx[e] >= l.num_blocks ||
          (e > l.row_ptr[i] && l.col_idx[e] <= l.col_idx[e - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "compiled.layout.col_idx[", e, "]: ", l.col_idx[e],
            " must be in [0, num_blocks) and ascend within its row"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDilatedPlan(const DilatedPlan& plan, const AttentionShape& s) {
  for (size_t k = 0; k < plan.branches.size(); ++k) {
    const DilatedBranch& br = plan.branches[k];
    if (br.rate < 1 || static_cast<int64_t>(br.groups.size()) < std::min(br.rate, s.q_heads)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compiled.dilated.branches[", k, "]: ", br.groups.size(), " groups for rate ", br.rate,
          " and ", s.q_heads, " query heads"));
    }
    for (const DilatedGroup& g : br.groups) {
      const int64_t n = static_cast<int64_t>(g.positions.size());
      bool ok = !g.seg_start.empty() && g.seg_start.front() == 0 && g.seg_start.back() == n;
      for (size_t t = 0; ok && t + 1 < g.seg_start.size(); ++t) {
        ok = g.seg_start[t] <= g.seg_start[t + 1];
      }
      for (int64_t x = 0; ok && x < n; ++x) {
        ok = g.positions[x] >= 0 && g.positions[x] < s.tokens &&
             (x == 0 || g.positions[x] > g.positions[x - 1]);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "compiled.dilated.branches[", k, "]: group ", g.offset,
            " is not a valid gather plan for ", s.tokens, " tokens"));
      }
    }
  }
  return absl::OkStatus();
}

// The piece's layout may come from anywhere (the ring builds one per step): every index the kernel
// follows and every buffer row it touches is checked first, in O(query tiles + kept tiles).
absl::Status CheckPiece(const RectLayout& l, const CpuPieceArgs& a) {
  if (l.tile < 1 || l.q_len < 0 || l.k_len < 0 ||
      static_cast<int64_t>(l.row_ptr.size()) != l.num_q_tiles() + 1 ||
      l.mask.size() != l.col_idx.size() || l.row_ptr.front() != 0 ||
      l.row_ptr.back() != l.kept_tiles()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout: not a CSR over ", l.num_q_tiles(), " query tiles of ", l.tile, " (row_ptr has ",
        l.row_ptr.size(), " entries, col_idx ", l.col_idx.size(), ", mask ", l.mask.size(), ")"));
  }
  for (int64_t i = 0; i < l.num_q_tiles(); ++i) {
    if (l.row_ptr[i + 1] < l.row_ptr[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout.row_ptr[", i + 1, "]: must be non-decreasing"));
    }
    for (int64_t e = l.row_ptr[i]; e < l.row_ptr[i + 1]; ++e) {
      if (l.col_idx[e] < 0 || l.col_idx[e] >= l.num_k_tiles() ||
          (e > l.row_ptr[i] && l.col_idx[e] <= l.col_idx[e - 1])) {
        return absl::InvalidArgumentError(absl::StrCat("layout.col_idx[", e, "]: ", l.col_idx[e],
                                                       " must be in [0, ", l.num_k_tiles(),
                                                       ") and ascend within its row"));
      }
    }
  }
  if (a.batch < 1 || a.head_dim < 1 || a.q_heads < 1 || a.kv_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("args: batch, head_dim, q_heads and kv_heads must be >= 1, got ", a.batch,
                     ", ", a.head_dim, ", ", a.q_heads, ", ", a.kv_heads));
  }
  if (a.q_row0 < 0 || a.q_row0 + l.q_len > a.q_rows) {
    return absl::InvalidArgumentError(absl::StrCat("args.q_row0: rows [", a.q_row0, ", ",
                                                   a.q_row0 + l.q_len, ") of the layout's queries",
                                                   " must lie in the buffer's ", a.q_rows));
  }
  if (a.k_row0 < 0 || a.k_row0 + l.k_len > a.kv_rows) {
    return absl::InvalidArgumentError(absl::StrCat("args.k_row0: rows [", a.k_row0, ", ",
                                                   a.k_row0 + l.k_len, ") of the layout's keys",
                                                   " must lie in the buffer's ", a.kv_rows));
  }
  for (size_t i = 0; i < a.heads.size(); ++i) {
    const HeadPair& hp = a.heads[i];
    if (hp.q_head < 0 || hp.q_head >= a.q_heads || hp.kv_head < 0 || hp.kv_head >= a.kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat("args.heads[", i, "]: (", hp.q_head, ", ",
                                                     hp.kv_head, ") must lie in [0, ", a.q_heads,
                                                     ") x [0, ", a.kv_heads, ")"));
    }
  }
  if (l.kept_tiles() > 0 && !a.heads.empty() &&
      (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.acc_o == nullptr ||
       a.acc_lse == nullptr)) {
    return absl::InvalidArgumentError("args: q, k, v, acc_o and acc_lse must be set");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuAttentionInto(const AttentionSpec& spec, const CompiledPattern& compiled,
                              const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              const CpuRunOptions& options, HostTensor& o, HostTensor& lse) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  if (!IsSquare(spec, s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compiled: a pattern compiled for one length cannot run ", s.tokens, " queries at offset ",
        spec.q_offset, " against ", s.kv_len(), " keys", IsPacked(spec) ? " (packed)" : "",
        "; run it with CpuAttention or CpuAttentionRectInto"));
  }
  const bool is_dilated = std::holds_alternative<DilatedSpec>(spec.pattern);
  if (is_dilated != compiled.dilated.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compiled: pattern was compiled for a different spec kind than ", std::string(PatternName(spec.pattern))));
  }
  if (!is_dilated) {
    ATTN_RETURN_IF_ERROR(CheckLayout(compiled.layout, s.tokens));
  } else {
    ATTN_RETURN_IF_ERROR(CheckDilatedPlan(*compiled.dilated, s));
  }
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
  const float scale = EffectiveScale(spec, s.head_dim);
  ATTN_ASSIGN_OR_RETURN(Workspaces ws, MakeWorkspaces(s, scale, q, k, v, options));
  if (is_dilated) return RunDilated(s, compiled, ws, options, spec.causal, o, lse);
  return RunLayout(s, compiled.layout, ws, options, o, lse);
}

absl::StatusOr<AttentionOutputs> CpuAttentionCompiled(const AttentionSpec& spec,
                                                      const CompiledPattern& compiled,
                                                      const HostTensor& q, const HostTensor& k,
                                                      const HostTensor& v,
                                                      const CpuRunOptions& options) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  AttentionOutputs out;
  ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(q.dtype(), q.dims(), options.tracker));
  ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32,
                                                    {s.batch, s.q_heads, s.tokens},
                                                    options.tracker));
  ATTN_RETURN_IF_ERROR(CpuAttentionInto(spec, compiled, q, k, v, options, out.o, out.lse));
  return out;
}

absl::StatusOr<AttentionOutputs> CpuAttention(const AttentionSpec& spec, const HostTensor& q,
                                              const HostTensor& k, const HostTensor& v,
                                              const CpuRunOptions& options) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, s));
  if (!IsSquare(spec, s)) return CpuAttentionRect(spec, q, k, v, options);
  ATTN_ASSIGN_OR_RETURN(const CompiledPattern compiled,
                        CompileValidatedPattern(spec, s.tokens, s.q_heads, options.compile));
  return CpuAttentionCompiled(spec, compiled, q, k, v, options);
}

absl::Status CpuAttentionPiece(const AttentionSpec& spec, const RectLayout& layout,
                               const CpuPieceArgs& args, const CpuRunOptions& options) {
  ATTN_RETURN_IF_ERROR(CheckPiece(layout, args));
  // Work items are (batch, head pair, query tile) over the query tiles with kept tiles only: a
  // ring piece is often a thin band, and idle items would still cost a pool hand-out each.
  std::vector<int64_t> tiles;
  for (int64_t qt = 0; qt < layout.num_q_tiles(); ++qt) {
    if (layout.row_ptr[qt + 1] > layout.row_ptr[qt]) tiles.push_back(qt);
  }
  const int64_t per_bh = static_cast<int64_t>(tiles.size());
  const int64_t heads = static_cast<int64_t>(args.heads.size());
  if (per_bh == 0 || heads == 0) return absl::OkStatus();
  const int64_t D = args.head_dim;
  const int64_t tile = layout.tile;
  const int64_t q_stride = args.q_heads * D;
  const int64_t kv_stride = args.kv_heads * D;
  const float scale = EffectiveScale(spec, D);
  return RunItems(options.pool, options.cancel, args.batch * heads * per_bh, [&](int64_t i) {
    const int64_t qt = tiles[i % per_bh];
    const int64_t bh = i / per_bh;
    const int64_t b = bh / heads;
    const HeadPair& hp = args.heads[bh % heads];
    const int64_t row0 = args.q_row0 + qt * tile;  // buffer row of the tile's first query
    const int64_t e0 = layout.row_ptr[qt];
    const int64_t kv_off = ((b * args.kv_rows + args.k_row0) * args.kv_heads + hp.kv_head) * D;
    const QueryTile in{.q = args.q + ((b * args.q_rows + row0) * args.q_heads + hp.q_head) * D,
                       .q_stride = q_stride,
                       .rows = std::min(tile, layout.q_len - qt * tile),
                       .q_pos = layout.q_begin + qt * tile,
                       .k = args.k + kv_off,
                       .v = args.v + kv_off,
                       .kv_stride = kv_stride,
                       .k_len = layout.k_len,
                       .k_pos = layout.k_begin,
                       .d = D,
                       .tile = tile,
                       .scale = scale,
                       .col_idx = layout.col_idx.data() + e0,
                       .mask = layout.mask.data() + e0,
                       .entries = layout.row_ptr[qt + 1] - e0,
                       .rule = &layout.rule};
    const BlockResult res = AttendQueryTile(in, ThreadScratch());
    MergePartialRows(res.rows, D,
                     args.acc_o + ((b * args.q_rows + row0) * args.q_heads + hp.q_head) * D,
                     q_stride, args.acc_lse + (b * args.q_heads + hp.q_head) * args.q_rows + row0,
                     1, res.o, D, res.lse, 1);
  });
}

}  // namespace attnserve
