#include "core/dist/ring_cuda_plan.h"

#include <algorithm>
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

absl::StatusOr<RingCudaPlan> PlanRingCuda(const AttentionSpec& spec, int64_t n, int ranks,
                                          const RingCudaPlanOptions& options) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring: ranks must be >= 1, got ", ranks));
  }
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    return absl::UnimplementedError(
        "placement ring: dilated specs are not implemented by the CUDA ring; use the single-GPU "
        "or data-parallel placement");
  }
  RingCudaPlan plan;
  plan.ranks = ranks;
  plan.seq_len = n;
  plan.block_size = options.block_size;
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
  }
  plan.steps.assign(ranks, std::vector<RingStep>(ranks));
  plan.admitted_pairs.assign(ranks, 0);
  for (int p = 0; p < ranks; ++p) {
    for (int t = 0; t < ranks; ++t) {
      RingStep& step = plan.steps[p][t];
      step.source = ((p - t) % ranks + ranks) % ranks;
      const std::vector<TokenRange>& src = plan.split[step.source];
      for (const TokenRange& q : plan.split[p]) {
        for (const TokenRange& k : src) {
          if (q.size() == 0 || k.size() == 0) continue;
          RingPiece piece;
          piece.q = q;
          piece.k = k;
          piece.q_row = LocalRow(plan.split[p], q.begin);
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
          step.pieces.push_back(std::move(piece));
        }
      }
    }
  }
  return plan;
}

}  // namespace attnserve
