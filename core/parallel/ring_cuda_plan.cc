#include "core/parallel/ring_cuda_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/parallel/ring.h"
#include "core/spec/pattern_compiler.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

int64_t DiagonalPairs(int64_t s) { return s * (s + 1) / 2; }

bool IsPow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }

// The slot policy of (qc, c): see ring_cuda_plan.h.
RingSlotPolicy CudaSlotPolicy(int qc, int c) {
  return qc == 1 && c == 1 ? RingSlotPolicy::kKeepHome : RingSlotPolicy::kRestoreHome;
}

// The token-sized part of a rank's buffer table: shard tensors, the chunk accumulator, the K/V
// slots and the cuDNN scratch (layouts are added by the caller).
RingRankBuffers TokenBuffers(const AttentionShape& shape, DType dtype, int64_t shard_tokens,
                             int64_t q_chunk_tokens, const std::vector<int64_t>& slot_tokens,
                             int64_t cudnn_rows) {
  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  // Token buffers are never smaller than 256 bytes (an empty shard still gets a valid pointer).
  auto at_least = [](int64_t bytes) { return std::max<int64_t>(bytes, 256); };
  RingRankBuffers t;
  t.q = at_least(b * shard_tokens * hq * d * es);
  t.o = at_least(b * shard_tokens * hq * d * es);
  t.lse = at_least(b * hq * shard_tokens * 4);
  t.o_acc = at_least(b * q_chunk_tokens * hq * d * 4);
  for (int64_t tokens : slot_tokens) t.kv_slots.push_back(at_least(2 * b * tokens * hkv * d * es));
  if (cudnn_rows > 0) {
    t.cudnn_o = at_least(b * cudnn_rows * hq * d * es);
    t.cudnn_lse = at_least(b * hq * cudnn_rows * 4);
  }
  return t;
}

absl::Status ClassifyPiece(const AttentionSpec& spec, const IntervalRule& rule,
                           const std::optional<BlockLayout>& global, int32_t block_size,
                           RingPiece& piece) {
  const bool dense = std::holds_alternative<DenseSpec>(spec.pattern);
  const TokenRange q = piece.q, k = piece.k;
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
      ATTN_ASSIGN_OR_RETURN(piece.layout, SliceBlockLayout(*global, q.begin, q.end, k.begin, k.end));
    } else {
      piece.layout = RectLayoutFromRule(rule, q.begin, q.end, k.begin, k.end, block_size);
    }
    if (piece.layout.rule.segment_starts != nullptr) {
      return absl::InternalError("ring: segmented rules are not supported on CUDA");
    }
    piece.admitted_pairs = piece.layout.AdmittedPairs();
  }
  return absl::OkStatus();
}

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
  std::optional<BlockLayout> global;  // block_sparse only
  IntervalRule rule;                  // dense / window
  rule.causal = spec.causal;
  rule.window = WindowWithin(spec, n);  // the kernels add it to a position difference
  int32_t block_size = options.block_size;
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    CompileOptions compile;
    compile.block_size = bs->block_size;
    compile.max_kept_blocks = options.max_kept_blocks;
    ATTN_ASSIGN_OR_RETURN(global, CompileValidatedBlockLayout(spec, n, compile));
    block_size = global->block_size;
  }
  if (block_size != 64 && block_size != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: block size must be 64 or 128, got ", block_size));
  }
  const SplitKind kind = SplitKindFor(spec);
  RingScheduleOptions so;
  so.q_chunks = qc;
  so.kv_pieces = c;
  so.unit = block_size;
  so.slots = CudaSlotPolicy(qc, c);
  ATTN_ASSIGN_OR_RETURN(RingSchedule schedule,
                        MakeRingSchedule(SplitSequence(n, ranks, kind, block_size), kind, so));
  RingCudaPlan plan;
  static_cast<RingSchedule&>(plan) = std::move(schedule);
  plan.seq_len = n;
  plan.block_size = block_size;
  plan.steps.assign(ranks, std::vector<RingStep>(plan.ticks()));
  plan.admitted_pairs.assign(ranks, 0);
  for (int p = 0; p < ranks; ++p) {
    for (int64_t t = 0; t < plan.ticks(); ++t) {
      RingStep& step = plan.steps[p][t];
      for (const RingPair& pair : plan.rank_ticks[p][t].pairs) {
        RingPiece piece;
        static_cast<RingPair&>(piece) = pair;
        ATTN_RETURN_IF_ERROR(ClassifyPiece(spec, rule, global, block_size, piece));
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
  return plan;
}

// Largest chunk of an m-way cut of every rank's shard, per rank, without building a plan.
absl::StatusOr<std::vector<int64_t>> MaxChunkTokens(const RingCudaPlan& plan, int m, bool mirror) {
  std::vector<int64_t> mx(plan.ranks, 0);
  for (int p = 0; p < plan.ranks; ++p) {
    ATTN_ASSIGN_OR_RETURN(std::vector<RingChunk> cs,
                          CutShard(plan.split[p], m, plan.block_size, "chunks", mirror));
    for (const RingChunk& c : cs) mx[p] = std::max(mx[p], c.tokens);
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

int64_t RingRankBuffers::RoundedTotal() const {
  int64_t total = 0;
  for (int64_t x : {q, o, lse, o_acc, cudnn_o, cudnn_lse, row_ptr, col_idx, mask, reverse_rows}) {
    if (x > 0) total += RingAllocRound(x);
  }
  for (int64_t x : kv_slots) total += RingAllocRound(x);
  return total;
}

RingRankBuffers RingRankBufferTable(const RingCudaPlan& plan, int rank,
                                    const AttentionShape& shape, DType dtype) {
  RingRankBuffers t =
      TokenBuffers(shape, dtype, plan.shard_tokens[rank], plan.MaxQChunkTokens(rank),
                   plan.slot_tokens[rank], plan.cudnn_scratch_rows);
  int64_t row_ptr = 0, col_idx = 0, max_q_blocks = 1;
  for (const RingStep& step : plan.steps[rank]) {
    for (const RingPiece& piece : step.pieces) {
      max_q_blocks = std::max(max_q_blocks, NumBlocks(piece.q.size(), plan.block_size));
      if (piece.kind != RingPieceKind::kLayout) continue;
      row_ptr += static_cast<int64_t>(piece.layout.row_ptr.size());
      col_idx += static_cast<int64_t>(piece.layout.col_idx.size());
    }
  }
  t.row_ptr = std::max<int64_t>(1, row_ptr) * 8;
  t.col_idx = std::max<int64_t>(1, col_idx) * 4;
  t.mask = std::max<int64_t>(1, col_idx);
  t.reverse_rows = max_q_blocks * 4;
  return t;
}

int64_t EstimateRingRankBytes(const RingCudaPlan& plan, int rank, const AttentionShape& shape,
                              DType dtype) {
  return RingRankBufferTable(plan, rank, shape, dtype).RoundedTotal();
}

int64_t EstimateRingRankBytes(const RingCudaPlan& plan, const AttentionShape& shape, DType dtype,
                              int q_chunks, int kv_pieces) {
  const bool zigzag = plan.split_kind == SplitKind::kZigzag;
  absl::StatusOr<std::vector<int64_t>> mq = MaxChunkTokens(plan, q_chunks, zigzag);
  absl::StatusOr<std::vector<int64_t>> mk = MaxChunkTokens(plan, kv_pieces, false);
  if (!mq.ok() || !mk.ok()) return std::numeric_limits<int64_t>::max();
  const int64_t max_q = *std::max_element(mq->begin(), mq->end());
  const int64_t max_piece = *std::max_element(mk->begin(), mk->end());
  int64_t worst = 0;
  for (int p = 0; p < plan.ranks; ++p) {
    const std::vector<int64_t> slots =
        RingSlotTokens(CudaSlotPolicy(q_chunks, kv_pieces), /*circulate=*/true, plan.ranks,
                       kv_pieces, plan.shard_tokens[p], plan.max_shard_tokens, max_piece);
    // A piece's query rows lie in one chunk: the largest chunk bounds the cuDNN scratch.
    RingRankBuffers t = TokenBuffers(shape, dtype, plan.shard_tokens[p], (*mq)[p], slots,
                                     plan.cudnn_scratch_rows > 0 ? max_q : 0);
    t.row_ptr = t.col_idx = t.mask = t.reverse_rows = 256;  // layouts, at least
    worst = std::max(worst, t.RoundedTotal());
  }
  return worst;
}

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
    best_need = std::min(best_need, need);
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

absl::StatusOr<std::vector<std::vector<TokenRange>>> SplitDilatedForRingCuda(
    const AttentionSpec& spec, int64_t n, int ranks) {
  const auto* dil = std::get_if<DilatedSpec>(&spec.pattern);
  if (dil == nullptr) return absl::InvalidArgumentError("ring: not a dilated spec");
  // Shards cut on multiples of lcm(segment lengths) hold whole segments of every branch, and a
  // segment's queries attend only to its own keys. Segment structure is preserved: a range
  // starting at a multiple of every w_k sees segment t of the range as global segment
  // t + begin / w_k, with the same head offsets; only the range ending at N has short segments,
  // exactly where the global sequence has them.
  int64_t unit = 1;
  for (int64_t w : dil->segment_lengths) {
    unit = std::lcm(unit, w);
    if (unit > n) break;
  }
  if (NumBlocks(n, unit) < ranks) {
    return absl::UnimplementedError(absl::StrCat(
        "placement ring: the dilated branches' segments (lcm of segment_lengths = ", unit,
        " tokens) do not fit ", ranks, " shards of ", n,
        " tokens, and the CUDA ring does not move dilated segments between GPUs; use the "
        "single-GPU or data-parallel placement"));
  }
  return SplitSequence(n, ranks, SplitKindFor(spec), unit);
}

int64_t EstimateDilatedRankBytes(const std::vector<TokenRange>& ranges,
                                 const AttentionShape& shape, DType dtype) {
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  int64_t total = 0;
  for (const TokenRange& r : ranges) {
    const int64_t nq = shape.batch * r.size() * shape.q_heads * shape.head_dim * es;
    const int64_t nkv = shape.batch * r.size() * shape.kv_heads * shape.head_dim * es;
    total = std::max(total, 2 * RingAllocRound(nq) + 2 * RingAllocRound(nkv) +
                                RingAllocRound(shape.batch * shape.q_heads * r.size() * 4));
  }
  return total;
}

absl::StatusOr<int64_t> EstimateRingCudaBytesPerRank(const AttentionSpec& spec,
                                                     const AttentionShape& shape, DType dtype,
                                                     int ranks,
                                                     const RingCudaPlanOptions& options) {
  const DType compute = dtype == DType::kF32 ? DType::kBF16 : dtype;
  int64_t need = 0;
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    ATTN_ASSIGN_OR_RETURN(auto split, SplitDilatedForRingCuda(spec, shape.tokens, ranks));
    for (const std::vector<TokenRange>& r : split) {
      need = std::max(need, EstimateDilatedRankBytes(r, shape, compute));
    }
    return need;
  }
  ATTN_ASSIGN_OR_RETURN(RingCudaPlan plan, PlanRingCuda(spec, shape, compute, ranks, options));
  for (int p = 0; p < ranks; ++p) {
    need = std::max(need, EstimateRingRankBytes(plan, p, shape, compute));
  }
  return need;
}

}  // namespace attnserve
