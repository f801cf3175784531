#include "core/dist/ring_cuda_plan.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/spec/pattern_compiler.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

int64_t DiagonalPairs(int64_t s) { return s * (s + 1) / 2; }

}  // namespace

int64_t LocalRow(const std::vector<TokenRange>& ranges, int64_t pos) {
  int64_t row = 0;
  for (const TokenRange& r : ranges) {
    if (pos >= r.begin && pos < r.end) return row + (pos - r.begin);
    row += r.size();
  }
  return row;  // pos == end of the last range (empty ranges): one past the shard
}

namespace {

bool IsPow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }

// Cuts range r into `parts` sub-ranges on `unit` boundaries, units shared out as evenly as
// possible (earlier parts take the remainder).
std::vector<TokenRange> CutRange(const TokenRange& r, int parts, int64_t unit) {
  std::vector<TokenRange> out;
  const int64_t units = (r.size() + unit - 1) / unit;
  int64_t cum = 0;
  for (int i = 0; i < parts; ++i) {
    const int64_t b = std::min(r.end, r.begin + cum * unit);
    cum += units / parts + (i < units % parts ? 1 : 0);
    out.push_back({b, std::min(r.end, r.begin + cum * unit)});
  }
  return out;
}

// Cuts a shard (its ranges) into m chunks on `unit` boundaries: m == 1 keeps the shard whole,
// otherwise each range gets m / ranges.size() sub-ranges, units shared out as evenly as possible.
// mirror (query chunks of a zigzag shard, two ranges L and H): each range is cut into m parts and
// chunk j = {L_j, H_{m-1-j}}, so every chunk has about the same causal work (its positions sum to
// about N per row pair) on every rank, which keeps the ranks' ticks in step.
absl::StatusOr<std::vector<RingChunk>> CutShard(const std::vector<TokenRange>& ranges, int m,
                                                int64_t unit, const char* what,
                                                bool mirror = false) {
  std::vector<RingChunk> out;
  if (m == 1) {
    RingChunk c;
    c.ranges = ranges;
    for (const TokenRange& r : ranges) c.tokens += r.size();
    out.push_back(std::move(c));
    return out;
  }
  if (mirror && ranges.size() == 2) {
    const std::vector<TokenRange> lo = CutRange(ranges[0], m, unit);
    const std::vector<TokenRange> hi = CutRange(ranges[1], m, unit);
    for (int j = 0; j < m; ++j) {
      RingChunk c;
      c.ranges = {lo[j], hi[m - 1 - j]};
      c.row = LocalRow(ranges, lo[j].begin);
      c.tokens = lo[j].size() + hi[m - 1 - j].size();
      out.push_back(std::move(c));
    }
    return out;
  }
  const int nr = static_cast<int>(ranges.size());
  if (nr == 0 || m % nr != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring: ", what, " = ", m, " must be a multiple of the shard's ", nr,
        " ranges (zigzag causal splits need an even count)"));
  }
  const int per = m / nr;
  int64_t row = 0;
  for (const TokenRange& r : ranges) {
    for (const TokenRange& part : CutRange(r, per, unit)) {
      RingChunk c;
      c.ranges = {part};
      c.row = row;
      c.tokens = part.size();
      row += c.tokens;
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<int64_t> TokenBuffers(const RingCudaPlan& plan, int rank, const AttentionShape& shape,
                                  DType dtype, int qc, int c, int64_t max_q_chunk,
                                  int64_t max_piece) {
  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t nl = plan.shard_tokens[rank];
  const int P = plan.ranks;
  std::vector<int64_t> v;
  v.push_back(b * nl * hq * d * es);  // q
  v.push_back(b * nl * hq * d * es);  // o
  v.push_back(b * hq * nl * 4);       // lse
  if (qc == 1 && c == 1) {
    v.push_back(2 * b * nl * hkv * d * es);  // home K/V
    v.push_back(b * nl * hq * d * 4);        // f32 O
    for (int i = 0; i < std::min(2, P - 1); ++i) v.push_back(2 * b * plan.max_shard_tokens * hkv * d * es);
  } else {
    v.push_back(b * max_q_chunk * hq * d * 4);  // f32 O of one chunk
    for (int i = 0; i < (P == 1 ? c : c + 1); ++i) v.push_back(2 * b * max_piece * hkv * d * es);
  }
  for (int64_t& x : v) x = std::max<int64_t>(x, 256);
  return v;
}

// The cuDNN piece scratch (RingCudaRank allocates it after the token buffers): O in the input
// dtype and LSE in f32 for `rows` query rows.
void AddCudnnScratch(int64_t rows, const AttentionShape& shape, DType dtype,
                     std::vector<int64_t>& v) {
  if (rows <= 0) return;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  v.push_back(std::max<int64_t>(shape.batch * rows * shape.q_heads * shape.head_dim * es, 256));
  v.push_back(std::max<int64_t>(shape.batch * shape.q_heads * rows * 4, 256));
}

int64_t SumRounded(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += RingAllocRound(x);
  return total;
}

// Largest chunk of a (qc or c) cut over every rank, without building a plan.
absl::StatusOr<int64_t> MaxChunkTokens(const RingCudaPlan& plan, int m, bool mirror) {
  int64_t mx = 0;
  for (int p = 0; p < plan.ranks; ++p) {
    ATTN_ASSIGN_OR_RETURN(std::vector<RingChunk> cs,
                          CutShard(plan.split[p], m, plan.block_size, "chunks", mirror));
    for (const RingChunk& c : cs) mx = std::max(mx, c.tokens);
  }
  return mx;
}

}  // namespace

int64_t RingAllocRound(int64_t bytes) {
  constexpr int64_t kSmallGranule = 512;
  constexpr int64_t kLargeGranule = int64_t{2} << 20;
  if (bytes < (int64_t{1} << 20)) return (bytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  if (bytes < (int64_t{64} << 20)) return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
  int64_t pow2 = 1;
  while (pow2 < bytes) pow2 <<= 1;
  const int64_t granule = pow2 / 8;
  return (bytes + granule - 1) / granule * granule;
}

int64_t EstimateRingRankBytes(const RingCudaPlan& plan, int rank, const AttentionShape& shape,
                              DType dtype) {
  std::vector<int64_t> v = TokenBuffers(plan, rank, shape, dtype, plan.q_chunks, plan.kv_pieces,
                                        plan.max_q_chunk_tokens, plan.max_kv_piece_tokens);
  AddCudnnScratch(plan.cudnn_scratch_rows, shape, dtype, v);
  int64_t row_ptr = 0, col_idx = 0, max_q_blocks = 1;
  for (const RingStep& step : plan.steps[rank]) {
    for (const RingPiece& piece : step.pieces) {
      max_q_blocks = std::max(max_q_blocks, NumBlocks(piece.q.size(), plan.block_size));
      if (piece.kind != RingPieceKind::kLayout) continue;
      row_ptr += static_cast<int64_t>(piece.layout.row_ptr.size());
      col_idx += static_cast<int64_t>(piece.layout.col_idx.size());
    }
  }
  v.push_back(std::max<int64_t>(1, row_ptr) * 8);
  v.push_back(std::max<int64_t>(1, col_idx) * 4);
  v.push_back(std::max<int64_t>(1, col_idx));
  v.push_back(max_q_blocks * 4);
  return SumRounded(v);
}

int64_t EstimateRingRankBytes(const RingCudaPlan& plan, const AttentionShape& shape, DType dtype,
                              int q_chunks, int kv_pieces) {
  const bool zigzag = plan.split_kind == SplitKind::kZigzag;
  absl::StatusOr<int64_t> mq = MaxChunkTokens(plan, q_chunks, zigzag);
  absl::StatusOr<int64_t> mk = MaxChunkTokens(plan, kv_pieces, false);
  if (!mq.ok() || !mk.ok()) return std::numeric_limits<int64_t>::max();
  int64_t worst = 0;
  for (int p = 0; p < plan.ranks; ++p) {
    std::vector<int64_t> v = TokenBuffers(plan, p, shape, dtype, q_chunks, kv_pieces, *mq, *mk);
    // A piece's query rows lie in one chunk: the chunk bounds the cuDNN scratch.
    if (plan.cudnn_scratch_rows > 0) AddCudnnScratch(*mq, shape, dtype, v);
    for (int i = 0; i < 4; ++i) v.push_back(256);  // layouts, at least
    worst = std::max(worst, SumRounded(v));
  }
  return worst;
}

namespace {

absl::StatusOr<RingCudaPlan> PlanWith(const AttentionSpec& spec, int64_t n, int ranks,
                                      const RingCudaPlanOptions& options, int qc, int c) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring: ranks must be >= 1, got ", ranks));
  }
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    return absl::UnimplementedError(
        "placement ring: dilated specs are not implemented by the CUDA ring; use the single-GPU "
        "or data-parallel placement");
  }
  if (qc < 1 || c < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: q_chunks and kv_pieces must be >= 1, got ", qc, ", ", c));
  }
  RingCudaPlan plan;
  plan.ranks = ranks;
  plan.seq_len = n;
  plan.block_size = options.block_size;
  plan.q_chunks = qc;
  plan.kv_pieces = c;
  const bool dense = std::holds_alternative<DenseSpec>(spec.pattern);
  std::optional<BlockLayout> global;  // block_sparse only
  IntervalRule rule;                  // dense / window
  rule.causal = spec.causal;
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) rule.window = w->size;
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    CompileOptions compile;
    compile.block_size = bs->block_size;
    compile.max_kept_blocks = options.max_kept_blocks;
    ATTN_ASSIGN_OR_RETURN(global, CompileBlockLayout(spec, n, compile));
    plan.block_size = global->block_size;
  }
  if (plan.block_size != 64 && plan.block_size != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: block size must be 64 or 128, got ", plan.block_size));
  }
  plan.split_kind = SplitKindFor(spec);
  plan.split = SplitSequence(n, ranks, plan.split_kind, plan.block_size);
  plan.shard_tokens.assign(ranks, 0);
  for (int p = 0; p < ranks; ++p) {
    for (const TokenRange& r : plan.split[p]) plan.shard_tokens[p] += r.size();
    plan.max_shard_tokens = std::max(plan.max_shard_tokens, plan.shard_tokens[p]);
    ATTN_ASSIGN_OR_RETURN(std::vector<RingChunk> qcs,
                          CutShard(plan.split[p], qc, plan.block_size, "q_chunks",
                                   plan.split_kind == SplitKind::kZigzag));
    ATTN_ASSIGN_OR_RETURN(std::vector<RingChunk> kps,
                          CutShard(plan.split[p], c, plan.block_size, "kv_pieces"));
    for (const RingChunk& x : qcs) plan.max_q_chunk_tokens = std::max(plan.max_q_chunk_tokens, x.tokens);
    for (const RingChunk& x : kps) plan.max_kv_piece_tokens = std::max(plan.max_kv_piece_tokens, x.tokens);
    plan.q_chunk.push_back(std::move(qcs));
    plan.kv_piece.push_back(std::move(kps));
  }
  const int64_t ticks = plan.ticks();
  plan.steps.assign(ranks, std::vector<RingStep>(ticks));
  plan.admitted_pairs.assign(ranks, 0);
  const int64_t period = static_cast<int64_t>(ranks) * c;
  for (int p = 0; p < ranks; ++p) {
    for (int64_t t = 0; t < ticks; ++t) {
      RingStep& step = plan.steps[p][t];
      const int64_t m = t % period;
      step.q_chunk = static_cast<int>(t / period);
      step.kv_piece = static_cast<int>(m % c);
      step.source = static_cast<int>(((p - m / c) % ranks + ranks) % ranks);
      const std::vector<TokenRange>& src = plan.kv_piece[step.source][step.kv_piece].ranges;
      const std::vector<TokenRange>& qranges = plan.q_chunk[p][step.q_chunk].ranges;
      for (const TokenRange& q : qranges) {
        for (const TokenRange& k : src) {
          if (q.size() == 0 || k.size() == 0) continue;
          RingPiece piece;
          piece.q = q;
          piece.k = k;
          piece.q_row = LocalRow(plan.split[p], q.begin);
          piece.acc_row = LocalRow(qranges, q.begin);
          piece.k_row = LocalRow(src, k.begin);
          if (dense && !spec.causal) {
            piece.kind = RingPieceKind::kFull;
            piece.admitted_pairs = q.size() * k.size();
          } else if (dense && k.end <= q.begin) {
            piece.kind = RingPieceKind::kFull;  // every key precedes every query
            piece.admitted_pairs = q.size() * k.size();
          } else if (dense && k.begin == q.begin && k.end == q.end) {
            piece.kind = RingPieceKind::kCausalDiagonal;
            piece.admitted_pairs = DiagonalPairs(q.size());
          } else {
            piece.kind = RingPieceKind::kLayout;
            if (global) {
              ATTN_ASSIGN_OR_RETURN(piece.layout,
                                    SliceBlockLayout(*global, q.begin, q.end, k.begin, k.end));
            } else {
              piece.layout =
                  RectLayoutFromRule(rule, q.begin, q.end, k.begin, k.end, plan.block_size);
            }
            if (piece.layout.rule.segment_starts != nullptr) {
              return absl::InternalError("ring: segmented rules are not supported on CUDA");
            }
            piece.admitted_pairs = piece.layout.AdmittedPairs();
          }
          if (piece.admitted_pairs == 0) {
            ++step.skipped_pieces;
            continue;
          }
          plan.admitted_pairs[p] += piece.admitted_pairs;
          if (options.cudnn_pieces && piece.kind != RingPieceKind::kLayout) {
            plan.cudnn_scratch_rows = std::max(plan.cudnn_scratch_rows, piece.q.size());
          }
          step.pieces.push_back(std::move(piece));
        }
      }
    }
  }
  return plan;
}

}  // namespace

absl::StatusOr<RingCudaPlan> PlanRingCuda(const AttentionSpec& spec, int64_t n, int ranks,
                                          const RingCudaPlanOptions& options) {
  return PlanWith(spec, n, ranks, options, options.q_chunks > 0 ? options.q_chunks : 1,
                  options.kv_pieces > 0 ? options.kv_pieces : 1);
}

absl::StatusOr<RingCudaPlan> PlanRingCuda(const AttentionSpec& spec, const AttentionShape& shape,
                                          DType dtype, int ranks,
                                          const RingCudaPlanOptions& options) {
  if (options.q_chunks > 0 || options.kv_pieces > 0) {
    return PlanWith(spec, shape.tokens, ranks, options, std::max(1, options.q_chunks),
                    std::max(1, options.kv_pieces));
  }
  ATTN_ASSIGN_OR_RETURN(RingCudaPlan base, PlanWith(spec, shape.tokens, ranks, options, 1, 1));
  const int64_t budget = options.device_memory_budget;
  if (budget <= 0) return base;
  int64_t best_need = std::numeric_limits<int64_t>::max();
  auto consider = [&](const RingCudaPlan& plan) {
    int64_t need = 0;
    for (int p = 0; p < ranks; ++p) need = std::max(need, EstimateRingRankBytes(plan, p, shape, dtype));
    if (need < best_need) {
      best_need = need;
    }
    return need <= budget;
  };
  if (consider(base)) return base;
  constexpr int kMaxChunks = 64;
  const bool zigzag = base.split_kind == SplitKind::kZigzag;
  for (int qc = 1; qc <= kMaxChunks; qc *= 2) {
    for (int c = 1; c <= kMaxChunks; c *= 2) {
      if (qc == 1 && c == 1) continue;
      if (zigzag && c > 1 && c % 2 != 0) continue;
      if (!IsPow2(qc) || !IsPow2(c)) continue;
      // Cheap lower bound first; build (layouts) only when it may fit.
      if (EstimateRingRankBytes(base, shape, dtype, qc, c) > budget) continue;
      absl::StatusOr<RingCudaPlan> plan = PlanWith(spec, shape.tokens, ranks, options, qc, c);
      if (!plan.ok()) continue;
      if (consider(*plan)) return plan;
    }
  }
  // Smallest need over the candidates, for the message (lower bound of the leanest).
  const int64_t leanest = EstimateRingRankBytes(base, shape, dtype, kMaxChunks, kMaxChunks);
  return absl::ResourceExhaustedError(absl::StrCat(
      "ring: no schedule fits device_memory_budget = ", budget, " bytes per rank: (1, 1) needs ",
      EstimateRingRankBytes(base, 0, shape, dtype), " bytes on rank 0, the leanest candidate (",
      kMaxChunks, ", ", kMaxChunks, ") at least ", std::min(leanest, best_need),
      " bytes (", ranks, " ranks, ", shape.tokens, " tokens)"));
}

}  // namespace attnserve
