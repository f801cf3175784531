// CheckHeaderSizes (request_assembler.h): the header's repeated fields against what the shape
// allows and --max-spec-entries, on the parsed proto, before the spec is converted.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/spec/attention_spec.h"
#include "core/util/status_macros.h"
#include "server/request_assembler.h"

namespace attnserve {
namespace {

// Saturating at INT64_MAX: a bound that large is no bound.
int64_t SatMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}
int64_t SatAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

// The bound of one repeated header field: INVALID_ARGUMENT past what the shape allows,
// RESOURCE_EXHAUSTED past --max-spec-entries.
absl::Status CheckEntries(absl::string_view field, int64_t count, int64_t shape_bound,
                          absl::string_view rule, int64_t max_entries) {
  if (count > shape_bound) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", count, " entries, more than ", rule, " (", shape_bound, ")"));
  }
  if (count > max_entries) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ": ", count,
                                                     " entries, above the limit "
                                                     "--max-spec-entries=",
                                                     max_entries));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckHeaderSizes(const v1::AttendHeader& header, int64_t kv_len,
                              int64_t max_entries) {
  // The positions the pattern spans (an upper bound of core/spec PatternExtent, which packed
  // sequences only shrink): every per-position or per-block list is bounded by it.
  const int64_t q_offset = header.has_q_offset() ? std::max<int64_t>(0, header.q_offset()) : 0;
  const int64_t extent = std::max(SatAdd(q_offset, header.tokens()), kv_len);
  const v1::AttentionSpec& spec = header.spec();
  int64_t total = 0;
  const auto count = [&](absl::string_view field, int64_t n, int64_t bound,
                         absl::string_view rule) {
    total = SatAdd(total, n);
    return CheckEntries(field, n, bound, rule, max_entries);
  };
  ATTN_RETURN_IF_ERROR(count("header.cu_seqlens_q", header.cu_seqlens_q_size(),
                             std::min(SatAdd(header.tokens(), 1), kMaxPackedSequences + 1),
                             "tokens + 1 and the packed sequence limit + 1"));
  ATTN_RETURN_IF_ERROR(count("header.cu_seqlens_k", header.cu_seqlens_k_size(),
                             std::min(SatAdd(kv_len, 1), kMaxPackedSequences + 1),
                             "kv tokens + 1 and the packed sequence limit + 1"));
  if (spec.has_dilated()) {
    ATTN_RETURN_IF_ERROR(count("spec.dilated.segment_lengths", spec.dilated().segment_lengths_size(),
                               extent, "one per position"));
    ATTN_RETURN_IF_ERROR(count("spec.dilated.dilation_rates", spec.dilated().dilation_rates_size(),
                               extent, "one per position"));
  }
  if (spec.has_block_sparse()) {
    const v1::BlockSparse& bs = spec.block_sparse();
    // An unsupported block size is ValidateSpec's to report; the smallest one bounds the blocks.
    const int32_t block = std::find(std::begin(kSupportedBlockSizes),
                                    std::end(kSupportedBlockSizes),
                                    bs.block_size()) != std::end(kSupportedBlockSizes)
                              ? bs.block_size()
                              : kSupportedBlockSizes[0];
    const int64_t nb = extent <= 0 ? 1 : 1 + (extent - 1) / block;
    if (bs.has_dilated_sparse()) {
      ATTN_RETURN_IF_ERROR(count("spec.block_sparse.dilated_sparse.rates",
                                 bs.dilated_sparse().rates_size(), nb, "one per key block"));
    }
    if (bs.has_csr()) {
      ATTN_RETURN_IF_ERROR(count("spec.block_sparse.csr.row_ptr", bs.csr().row_ptr_size(),
                                 SatAdd(nb, 1), "num_blocks + 1"));
      ATTN_RETURN_IF_ERROR(count("spec.block_sparse.csr.col_idx", bs.csr().col_idx_size(),
                                 SatMul(nb, nb), "one per (query block, key block) pair"));
    }
  }
  if (total > max_entries) {
    return absl::ResourceExhaustedError(
        absl::StrCat("header: the spec's lists and cu_seqlens hold ", total,
                     " entries together, above the limit --max-spec-entries=", max_entries));
  }
  return absl::OkStatus();
}

}  // namespace attnserve
