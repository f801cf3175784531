// spec + sequence length -> BlockLayout (and, for dilated specs, the gather plans per branch).
#ifndef ATTNSERVE_CORE_SPEC_PATTERN_COMPILER_H_
#define ATTNSERVE_CORE_SPEC_PATTERN_COMPILER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "core/spec/block_layout.h"

namespace attnserve {

struct CompileOptions {
  // Block size used for dense, window and dilated patterns (block_sparse carries its own).
  int32_t block_size = 128;
  // When set, compiling a layout with more kept blocks than this fails with RESOURCE_EXHAUSTED
  // (checked while building, before the excess is allocated). Dense-like specs keep O(blocks^2)
  // blocks by nature; servers set this from their memory budget.
  std::optional<int64_t> max_kept_blocks;
};

// One dilated branch for one head offset o = h mod rate: the positions it gathers, cut into
// segments. A query at positions[s] (in segment t) attends to the keys positions[seg_start[t] ..
// seg_start[t+1]) (and only to those at or before it when causal). Positions ascend.
struct DilatedGroup {
  int64_t offset = 0;
  std::vector<int64_t> positions;  // gathered global positions, ascending
  // segments + 1 entries into positions. Segment t covers [t * segment_length, (t + 1) *
  // segment_length) for every t with t * segment_length < N; one holding no position of this
  // offset (a short last segment) is kept, empty, so segment numbers match t.
  std::vector<int64_t> seg_start;
};

struct DilatedBranch {
  int64_t segment_length = 0;
  int64_t rate = 0;
  // groups[o] for o in [0, min(rate, q_heads)): head h uses groups[h % rate]. Offsets no head uses
  // are not built. Each group holds at most N positions, so a branch is O(N * min(rate, heads)).
  std::vector<DilatedGroup> groups;
};

// The query heads that use offset `offset` of a branch of rate `rate` (h % rate == offset,
// h < q_heads), ascending. The step stops before h + rate could pass int64: a rate may be as large
// as INT64_MAX (the wire takes any rate >= 1), and `h += rate` past it wrapped to a negative head.
std::vector<int64_t> DilatedGroupHeads(int64_t q_heads, int64_t rate, int64_t offset);

struct DilatedPlan {
  std::vector<DilatedBranch> branches;
  int64_t MemoryBytes() const;
};

// A compiled spec. For dense/window/block_sparse `layout` is the whole computation. For dilated,
// `layout` is the layout of ONE segment of the longest gathered length (dense, causal-diagonal
// when causal), used per segment; `dilated` lists the branches.
struct CompiledPattern {
  BlockLayout layout;
  std::optional<DilatedPlan> dilated;
};

// Compiles `spec` for sequence length `seq_len` and `q_heads` heads: a library entry point, so it
// validates the spec first (ValidateSpecForSeqLen) and returns INVALID_ARGUMENT naming the field.
// Time and memory are O(num_blocks + kept blocks).
absl::StatusOr<CompiledPattern> CompilePattern(const AttentionSpec& spec, int64_t seq_len,
                                               int64_t q_heads, const CompileOptions& options = {});

// Compiles just the block layout of a non-dilated spec (dense, window, block_sparse); validates
// like CompilePattern.
absl::StatusOr<BlockLayout> CompileBlockLayout(const AttentionSpec& spec, int64_t seq_len,
                                               const CompileOptions& options = {});

// The same for a spec already validated where the request entered (devices, plans, rings): the
// validation is asserted, not repeated. Only the compile options are checked here.
absl::StatusOr<CompiledPattern> CompileValidatedPattern(const AttentionSpec& spec, int64_t seq_len,
                                                        int64_t q_heads,
                                                        const CompileOptions& options = {});
absl::StatusOr<BlockLayout> CompileValidatedBlockLayout(const AttentionSpec& spec, int64_t seq_len,
                                                        const CompileOptions& options = {});

// Dense (causal when `causal`) layout over n tokens at block size b.
BlockLayout DenseLayout(int64_t n, int32_t block_size, bool causal);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_SPEC_PATTERN_COMPILER_H_
