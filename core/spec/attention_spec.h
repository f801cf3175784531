// AttentionSpec: what to compute. Mirrors proto/attnserve/v1 AttentionSpec one to one; the math of
// every kind is written down in docs/DESIGN.md ("The math").
#ifndef ATTNSERVE_CORE_SPEC_ATTENTION_SPEC_H_
#define ATTNSERVE_CORE_SPEC_ATTENTION_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor/tensor.h"

namespace attnserve {

struct DenseSpec {};
// |i - j| <= size (with causal: 0 <= i - j <= size). size >= 0.
struct WindowSpec {
  int64_t size = 0;
};
// LongNet dilated attention: branch k has segment length segment_lengths[k] and dilation rate
// dilation_rates[k]; branches combine by their softmax denominators.
struct DilatedSpec {
  std::vector<int64_t> segment_lengths;
  std::vector<int64_t> dilation_rates;
};

// Block-sparse generators (i = query block, j = key block, nb = number of blocks).
struct LocalWindowGen {  // |i - j| <= width
  int64_t width = 0;
};
struct DilatedSparseGen {  // j == i or |i - j| in rates
  std::vector<int64_t> rates;
};
struct GlobalLocalGen {  // i < global_blocks or j < global_blocks or |i - j| <= width
  int64_t global_blocks = 0;
  int64_t width = 0;
};
struct StridedGen {  // |i - j| <= width or (i - j) mod stride == 0
  int64_t stride = 1;
  int64_t width = 0;
};
struct RandomGen {  // the diagonal plus round(keep * nb) distinct other blocks per row, seeded
  double keep = 0.0;
  uint64_t seed = 0;
};
struct CsrGen {  // the caller's layout: row_ptr has nb + 1 entries, col_idx sorted per row
  std::vector<int64_t> row_ptr;
  std::vector<int64_t> col_idx;
};
using BlockGenerator =
    std::variant<LocalWindowGen, DilatedSparseGen, GlobalLocalGen, StridedGen, RandomGen, CsrGen>;

struct BlockSparseSpec {
  int32_t block_size = 128;  // 64 or 128
  BlockGenerator generator;
};

using AttentionPattern = std::variant<DenseSpec, WindowSpec, DilatedSpec, BlockSparseSpec>;

struct AttentionSpec {
  AttentionPattern pattern = DenseSpec{};
  // Key position <= query position, on global positions, on top of the pattern.
  bool causal = false;
  // Softmax scale; 0 means 1 / sqrt(head_dim).
  float scale = 0.f;
  // Position of query row 0: query row i sits at q_offset + i, key row j at j, and every rule
  // (causal, window, blocks, segments) compares positions. 0 <= q_offset <= kv_len; 0 when packed.
  int64_t q_offset = 0;
  // Keys that are one piece of a longer key sequence (a context sharded by sequence over devices:
  // each device attends the queries to its own rows): key row j sits at position k_offset + j of
  // a sequence of kv_total keys, so 0 <= k_offset, k_offset + kv_len <= kv_total, and the queries
  // follow the whole sequence's rule 0 <= q_offset <= kv_total. kv_total 0: the keys are the whole
  // sequence (k_offset 0); kv_total <= 2^60. Dense and window specs only (block_sparse and dilated are defined over
  // the whole sequence's blocks and segments: UNIMPLEMENTED), never packed.
  int64_t k_offset = 0;
  int64_t kv_total = 0;
  // Packed sequences (FlashAttention's varlen cu_seqlens), both empty when not packed: batch 1,
  // sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and key rows
  // [cu_seqlens_k[s], cu_seqlens_k[s + 1]) and is its own attention problem, its queries
  // bottom-right aligned (query offset kv_len_s - q_len_s).
  // (The empty initialisers keep brace-initialised specs free of missing-initializer warnings.)
  std::vector<int64_t> cu_seqlens_q = {};
  std::vector<int64_t> cu_seqlens_k = {};
};

inline bool IsPacked(const AttentionSpec& spec) {
  return !spec.cu_seqlens_q.empty() || !spec.cu_seqlens_k.empty();
}

// True when the keys are a piece of a longer sequence (spec.kv_total set).
inline bool IsKeyShard(const AttentionSpec& spec) { return spec.kv_total > 0; }

// True for the one-length case every backend runs: kv_len() == tokens, q_offset == 0, not packed,
// not a key shard.
// Code that handles only that case refuses the others with this.
bool IsSquare(const AttentionSpec& spec, const AttentionShape& shape);

// The length whose blocks a block_sparse generator sees (nb = NumBlocks(extent, block_size)):
// max(q_offset + tokens, kv_len()) (kv_total for a key shard); packed, the longest sequence's key
// count (each sequence uses its own, no longer, extent). Valid for a validated (spec, shape).
int64_t PatternExtent(const AttentionSpec& spec, const AttentionShape& shape);

// A window spec's size clamped to `extent` positions, none for the other patterns. No two positions
// of `extent` are `extent` apart, so the clamp admits the same pairs, and it keeps position +
// window in int64 for a caller's "unlimited" window near INT64_MAX (the wire takes any size >= 0).
std::optional<int64_t> WindowWithin(const AttentionSpec& spec, int64_t extent);

// The scale actually applied.
float EffectiveScale(const AttentionSpec& spec, int64_t head_dim);

// "dense", "window", "dilated", "block_sparse".
std::string_view PatternName(const AttentionPattern& p);
// "local_window", "dilated_sparse", "global_local", "strided", "random", "csr".
std::string_view GeneratorName(const BlockGenerator& g);

// Supported head dims and block sizes (backends may support more; Describe reports these).
inline constexpr int32_t kSupportedBlockSizes[] = {64, 128};
inline constexpr int64_t kMaxHeadDim = 256;
// Each dilated branch costs O(tokens) of gather plan and a full attention pass, so the branch
// count is bounded to keep a request's memory and work proportional to its size.
inline constexpr int64_t kMaxDilatedBranches = 64;
// Packed sequences per request: validation and per-sequence plans stay O(sequences).
inline constexpr int64_t kMaxPackedSequences = int64_t{1} << 20;

// Checks the shape on its own: every dim >= 1 (kv_tokens >= 0), q_heads a multiple of kv_heads,
// head_dim <= kMaxHeadDim. INVALID_ARGUMENT naming the field ("shape.q_heads") and the rule.
absl::Status ValidateShape(const AttentionShape& shape);

// The shape of q [B, Nq, Hq, D], k and v [B, Nkv, Hkv, D]: rank 4 each, one dtype, k and v alike
// and matching q's batch and head dim; kv_tokens is set when Nkv != Nq. Then ValidateShape.
// INVALID_ARGUMENT names the tensor ("k: shape [1, 128, 4, 64] f32 does not match q's
// batch/head_dim ...").
absl::StatusOr<AttentionShape> AttentionShapeOf(const HostTensor& q, const HostTensor& k,
                                                const HostTensor& v);

// Checks the spec against the shape (q_offset and the packed sequences included). Returns
// INVALID_ARGUMENT whose message names the field in the proto's spelling (e.g.
// "spec.dilated.dilation_rates[1]", "spec.cu_seqlens_q[3]") and the rule it breaks.
absl::Status ValidateSpec(const AttentionSpec& spec, const AttentionShape& shape);

// The part of ValidateSpec that depends only on the sequence length (everything but the shape
// itself): the pattern compiler re-runs it, so a spec that skipped validation cannot make it
// divide by zero, index out of range or loop forever. Errors name "shape.tokens" for seq_len.
absl::Status ValidateSpecForSeqLen(const AttentionSpec& spec, int64_t seq_len);
// The same over `extent` positions (PatternExtent), with errors about the length naming
// `extent_field` instead.
absl::Status ValidateSpecForExtent(const AttentionSpec& spec, int64_t extent,
                                   absl::string_view extent_field);

// Number of blocks covering n tokens with block size b (the last may be short).
inline int64_t NumBlocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

// The random generator's choice for one query block row: round(keep * nb) distinct key blocks
// other than `row` (all of them when that count reaches nb - 1), ascending, from a generator seeded
// by (seed, row) alone, so any row can be produced on its own. The diagonal is NOT included.
// Shared by the pattern compiler and the reference so both see the same blocks.
std::vector<int64_t> RandomRowBlocks(int64_t row, int64_t num_blocks, double keep, uint64_t seed);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_SPEC_ATTENTION_SPEC_H_
