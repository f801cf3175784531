#include "core/spec/pattern_compiler.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/spec/row_generator.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// ceil(n / d) for n >= 0, d >= 1 without the overflow of (n + d - 1) / d: dilated segment lengths
// and rates may be as large as int64 allows.
int64_t CeilDiv(int64_t n, int64_t d) { return n == 0 ? 0 : 1 + (n - 1) / d; }

// First and last token (inclusive) of block `i`.
struct TokenRange {
  int64_t first;
  int64_t last;
  int64_t size() const { return last - first + 1; }
};
TokenRange BlockTokens(int64_t i, int64_t block_size, int64_t seq_len) {
  const int64_t first = i * block_size;
  return {first, std::min(first + block_size, seq_len) - 1};
}

// Builds the CSR row by row. Rows must be appended in order and columns ascend within a row.
class LayoutBuilder {
 public:
  LayoutBuilder(int64_t seq_len, int32_t block_size, TokenRule rule,
                std::optional<int64_t> max_kept_blocks)
      : max_kept_blocks_(max_kept_blocks) {
    layout_.seq_len = seq_len;
    layout_.block_size = block_size;
    layout_.num_blocks = NumBlocks(seq_len, block_size);
    layout_.rule = rule;
    layout_.row_ptr.reserve(layout_.num_blocks + 1);
    layout_.row_ptr.push_back(0);
  }

  int64_t num_blocks() const { return layout_.num_blocks; }

  // For layouts whose size is known before building: fails before allocating when it exceeds the
  // limit, and otherwise sizes the arrays once (no regrowth, no slack to trim).
  absl::Status Reserve(int64_t kept_blocks) {
    if (max_kept_blocks_ && kept_blocks > *max_kept_blocks_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "layout: ", kept_blocks, " kept blocks exceed the limit of ", *max_kept_blocks_, " (",
          layout_.seq_len, " tokens at block size ", layout_.block_size, ")"));
    }
    layout_.col_idx.reserve(kept_blocks);
    layout_.mask.reserve(kept_blocks);
    return absl::OkStatus();
  }

  void Add(int64_t col, BlockMask mask) {
    layout_.col_idx.push_back(static_cast<int32_t>(col));
    layout_.mask.push_back(mask);
  }

  // Closes the current row. Checking once per row bounds the overshoot by one row (<= nb blocks).
  absl::Status EndRow() {
    const int64_t kept = layout_.kept_blocks();
    if (max_kept_blocks_ && kept > *max_kept_blocks_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("layout: more than ", *max_kept_blocks_, " kept blocks (", layout_.seq_len,
                       " tokens at block size ", layout_.block_size, ", reached ", kept, " after ",
                       layout_.row_ptr.size(), " of ", layout_.num_blocks, " block rows)"));
    }
    layout_.row_ptr.push_back(kept);
    return absl::OkStatus();
  }

  BlockLayout Finish() && {
    // Growth by doubling leaves up to 2x slack; a layout lives as long as its request.
    layout_.col_idx.shrink_to_fit();
    layout_.mask.shrink_to_fit();
    return std::move(layout_);
  }

 private:
  BlockLayout layout_;
  std::optional<int64_t> max_kept_blocks_;
};

// Dense and window layouts: the admissible pairs are those with q - k in [lo, hi] (a band), so a
// query block's kept key blocks form one contiguous range and each block's mask follows from the
// range of q - k over it, in O(1) per block.
absl::StatusOr<BlockLayout> BandLayout(int64_t seq_len, int32_t block_size, bool causal,
                                       std::optional<int64_t> window,
                                       std::optional<int64_t> max_kept_blocks) {
  LayoutBuilder builder(seq_len, block_size, TokenRule{causal, window}, max_kept_blocks);
  // |q - k| <= seq_len - 1 always, so clamping the window to seq_len changes nothing but keeps the
  // arithmetic below far from overflow.
  const int64_t w = window ? std::min(*window, seq_len) : seq_len;
  const int64_t lo = causal ? 0 : -w;
  const int64_t hi = w;
  // Key blocks of row i: those holding a key some query of the block admits, k in
  // [q.first - hi, q.last - lo]. Never empty, as lo <= 0 <= hi admits k = q.
  const auto row_columns = [&](int64_t i) {
    const TokenRange q = BlockTokens(i, block_size, seq_len);
    const int64_t k_min = std::max<int64_t>(0, q.first - hi);
    const int64_t k_max = std::min<int64_t>(seq_len - 1, q.last - lo);
    return std::pair<int64_t, int64_t>(k_min / block_size, k_max / block_size);
  };
  int64_t kept = 0;
  for (int64_t i = 0; i < builder.num_blocks(); ++i) {
    const auto [first, last] = row_columns(i);
    kept += last - first + 1;
  }
  ATTN_RETURN_IF_ERROR(builder.Reserve(kept));
  for (int64_t i = 0; i < builder.num_blocks(); ++i) {
    const TokenRange q = BlockTokens(i, block_size, seq_len);
    const auto [first, last] = row_columns(i);
    for (int64_t j = first; j <= last; ++j) {
      const TokenRange k = BlockTokens(j, block_size, seq_len);
      const int64_t d_min = q.first - k.last;
      const int64_t d_max = q.last - k.first;
      BlockMask mask = BlockMask::kPartial;
      if (d_min >= lo && d_max <= hi) {
        mask = BlockMask::kFull;
      } else if (causal && i == j && d_max <= hi) {
        // Only the causal cut goes through the block: exactly the diagonal mask.
        mask = BlockMask::kCausalDiagonal;
      }
      builder.Add(j, mask);
    }
    ATTN_RETURN_IF_ERROR(builder.EndRow());
  }
  return std::move(builder).Finish();
}

absl::StatusOr<BlockLayout> BlockSparseLayout(const BlockSparseSpec& spec, bool causal,
                                              int64_t seq_len,
                                              std::optional<int64_t> max_kept_blocks) {
  LayoutBuilder builder(seq_len, spec.block_size, TokenRule{causal, std::nullopt}, max_kept_blocks);
  const int64_t nb = builder.num_blocks();
  RowGenerator generator(spec.generator, nb);
  std::vector<int64_t> cols;
  for (int64_t i = 0; i < nb; ++i) {
    generator.Row(i, causal ? i : nb - 1, cols);
    // A one-token diagonal block (a ragged last block) has the single pair (q, q): full.
    const bool diagonal_is_full = BlockTokens(i, spec.block_size, seq_len).size() == 1;
    for (int64_t j : cols) {
      builder.Add(
          j, causal && j == i && !diagonal_is_full ? BlockMask::kCausalDiagonal : BlockMask::kFull);
    }
    ATTN_RETURN_IF_ERROR(builder.EndRow());
  }
  return std::move(builder).Finish();
}

absl::Status CheckBlockCount(int64_t seq_len, int64_t block_size) {
  if (CeilDiv(seq_len, block_size) > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("shape.tokens: ", seq_len,
                                                   " tokens at block size ", block_size,
                                                   " make more than 2^31 - 1 blocks"));
  }
  return absl::OkStatus();
}

// Gathered positions of one (branch, offset): for each segment t (t * w < n) the positions
// t * w + o + m * r (m >= 0) below min((t + 1) * w, n). Every segment gets a seg_start entry, even
// one left empty (a short last segment with no more than o positions), so segment t of the group
// is always seg_start[t] .. seg_start[t + 1].
DilatedGroup BuildGroup(int64_t n, int64_t w, int64_t r, int64_t o) {
  DilatedGroup group;
  group.offset = o;
  const int64_t segments = CeilDiv(n, w);
  // Each segment holds at most ceil(its length / r) positions.
  group.positions.reserve(std::min(n, n / r + segments));
  group.seg_start.reserve(segments + 1);
  for (int64_t t = 0; t < segments; ++t) {
    group.seg_start.push_back(static_cast<int64_t>(group.positions.size()));
    // t * w < n, so (t + 1) * w < 2n cannot overflow for t >= 1; for t == 0 it is w.
    const int64_t end = std::min((t + 1) * w, n);
    // Steps stop at `end` rather than adding r past it: p + r may not fit in int64.
    for (int64_t p = t * w + o; p<end; p = end - p> r ? p + r : end) {
      group.positions.push_back(p);
    }
  }
  group.seg_start.push_back(static_cast<int64_t>(group.positions.size()));
  return group;
}

}  // namespace

std::vector<int64_t> DilatedGroupHeads(int64_t q_heads, int64_t rate, int64_t offset) {
  std::vector<int64_t> heads;
  for (int64_t h = offset; h < q_heads; h += rate) {
    heads.push_back(h);
    if (rate >= q_heads - h) break;
  }
  return heads;
}

int64_t DilatedPlan::MemoryBytes() const {
  int64_t bytes = 0;
  for (const DilatedBranch& branch : branches) {
    for (const DilatedGroup& group : branch.groups) {
      bytes += static_cast<int64_t>((group.positions.capacity() + group.seg_start.capacity()) *
                                    sizeof(int64_t));
    }
  }
  return bytes;
}

BlockLayout DenseLayout(int64_t n, int32_t block_size, bool causal) {
  // Without a kept-block limit the band builder cannot fail.
  return *BandLayout(n, block_size, causal, std::nullopt, std::nullopt);
}

absl::StatusOr<BlockLayout> CompileBlockLayout(const AttentionSpec& spec, int64_t seq_len,
                                               const CompileOptions& options) {
  ATTN_RETURN_IF_ERROR(ValidateSpecForSeqLen(spec, seq_len));
  return CompileValidatedBlockLayout(spec, seq_len, options);
}

absl::StatusOr<CompiledPattern> CompilePattern(const AttentionSpec& spec, int64_t seq_len,
                                               int64_t q_heads, const CompileOptions& options) {
  ATTN_RETURN_IF_ERROR(ValidateSpecForSeqLen(spec, seq_len));
  return CompileValidatedPattern(spec, seq_len, q_heads, options);
}

absl::StatusOr<BlockLayout> CompileValidatedBlockLayout(const AttentionSpec& spec,
                                                        int64_t seq_len,
                                                        const CompileOptions& options) {
  ATTN_DCHECK_OK(ValidateSpecForSeqLen(spec, seq_len));
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    return BlockSparseLayout(*bs, spec.causal, seq_len, options.max_kept_blocks);
  }
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    return absl::InvalidArgumentError(
        "spec.dilated: a dilated spec has no single block layout; compile it with CompilePattern");
  }
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.block_size: must be >= 1, got ", options.block_size));
  }
  ATTN_RETURN_IF_ERROR(CheckBlockCount(seq_len, options.block_size));
  // (The layout's rule keeps the clamped window: the kernels add it to position differences.)
  return BandLayout(seq_len, options.block_size, spec.causal, WindowWithin(spec, seq_len),
                    options.max_kept_blocks);
}

absl::StatusOr<CompiledPattern> CompileValidatedPattern(const AttentionSpec& spec,
                                                        int64_t seq_len, int64_t q_heads,
                                                        const CompileOptions& options) {
  const auto* dilated = std::get_if<DilatedSpec>(&spec.pattern);
  if (dilated == nullptr) {
    ATTN_ASSIGN_OR_RETURN(BlockLayout layout, CompileValidatedBlockLayout(spec, seq_len, options));
    return CompiledPattern{std::move(layout), std::nullopt};
  }
  ATTN_DCHECK_OK(ValidateSpecForSeqLen(spec, seq_len));
  if (q_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shape.q_heads: must be >= 1, got ", q_heads));
  }
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.block_size: must be >= 1, got ", options.block_size));
  }
  ATTN_RETURN_IF_ERROR(CheckBlockCount(seq_len, options.block_size));

  DilatedPlan plan;
  int64_t longest = 0;  // most positions any group gathers into one segment
  for (size_t k = 0; k < dilated->segment_lengths.size(); ++k) {
    DilatedBranch branch;
    branch.segment_length = dilated->segment_lengths[k];
    branch.rate = dilated->dilation_rates[k];
    const int64_t w = branch.segment_length;
    const int64_t r = branch.rate;
    // Offset 0 of a full (or the only, possibly short) segment gathers the most.
    longest = std::max(longest, CeilDiv(std::min(w, seq_len), r));
    const int64_t groups = std::min(r, q_heads);
    branch.groups.reserve(groups);
    for (int64_t o = 0; o < groups; ++o) branch.groups.push_back(BuildGroup(seq_len, w, r, o));
    plan.branches.push_back(std::move(branch));
  }
  ATTN_ASSIGN_OR_RETURN(BlockLayout layout, BandLayout(longest, options.block_size, spec.causal,
                                                       std::nullopt, options.max_kept_blocks));
  return CompiledPattern{std::move(layout), std::move(plan)};
}

}  // namespace attnserve
