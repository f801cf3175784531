#include "core/spec/rect_layout.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnserve {

// No bound is the type's extreme, not a stand-in such as INT64_MAX / 4 that a position could pass
// (a key shard's reach 2^60 + tokens); window ends saturate instead.
int64_t IntervalRule::Lo(int64_t i) const {
  int64_t lo = std::numeric_limits<int64_t>::min();
  if (window && i >= lo + *window) lo = i - *window;
  if (segment_starts != nullptr) {
    auto it = std::upper_bound(segment_starts->begin(), segment_starts->end(), i);
    lo = std::max(lo, *(it - 1));
  }
  return lo;
}

int64_t IntervalRule::Hi(int64_t i) const {
  int64_t hi = std::numeric_limits<int64_t>::max();
  if (causal) hi = std::min(hi, i);
  if (window && i <= hi - *window) hi = i + *window;
  if (segment_starts != nullptr) {
    auto it = std::upper_bound(segment_starts->begin(), segment_starts->end(), i);
    if (it != segment_starts->end()) hi = std::min(hi, *it - 1);
  }
  return hi;
}

IntervalRule ToIntervalRule(const TokenRule& rule) {
  IntervalRule out;
  out.causal = rule.causal;
  out.window = rule.window;
  return out;
}

int64_t RectLayout::AdmittedPairs() const {
  int64_t pairs = 0;
  for (int64_t qt = 0; qt < num_q_tiles(); ++qt) {
    const int64_t q0 = q_begin + qt * tile;
    const int64_t q1 = std::min(q0 + tile, q_begin + q_len);
    for (int64_t e = row_ptr[qt]; e < row_ptr[qt + 1]; ++e) {
      const int64_t k0 = k_begin + static_cast<int64_t>(col_idx[e]) * tile;
      const int64_t k1 = std::min(k0 + tile, k_begin + k_len);
      for (int64_t i = q0; i < q1; ++i) {
        int64_t lo = k0;
        int64_t hi = k1 - 1;
        if (mask[e] == BlockMask::kCausalDiagonal) hi = std::min(hi, i);
        if (mask[e] == BlockMask::kPartial) {
          lo = std::max(lo, rule.Lo(i));
          hi = std::min(hi, rule.Hi(i));
        }
        pairs += std::max<int64_t>(0, hi - lo + 1);
      }
    }
  }
  return pairs;
}

absl::StatusOr<RectLayout> SliceBlockLayout(const BlockLayout& layout, int64_t q_begin,
                                            int64_t q_end, int64_t k_begin, int64_t k_end) {
  const int64_t b = layout.block_size;
  const int64_t n = layout.seq_len;
  auto check = [&](const char* what, int64_t begin, int64_t end) -> absl::Status {
    if (begin < 0 || begin > end || end > n || begin % b != 0 || (end % b != 0 && end != n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SliceBlockLayout: ", what, " range [", begin, ", ", end, ") must lie in [0, ", n,
          ") on block boundaries of ", b, " (or end at ", n, ")"));
    }
    return absl::OkStatus();
  };
  if (b < 1) return absl::InvalidArgumentError("SliceBlockLayout: block_size must be >= 1");
  if (absl::Status s = check("query", q_begin, q_end); !s.ok()) return s;
  if (absl::Status s = check("key", k_begin, k_end); !s.ok()) return s;

  RectLayout out;
  out.q_begin = q_begin;
  out.q_len = q_end - q_begin;
  out.k_begin = k_begin;
  out.k_len = k_end - k_begin;
  out.tile = static_cast<int32_t>(b);
  out.rule = ToIntervalRule(layout.rule);
  const int64_t first_q = q_begin / b;
  const int64_t first_k = k_begin / b;
  const int64_t end_k = (k_end + b - 1) / b;  // one past the last key block of the range
  out.row_ptr.reserve(out.num_q_tiles() + 1);
  out.row_ptr.push_back(0);
  for (int64_t qt = 0; qt < out.num_q_tiles(); ++qt) {
    const int64_t row = first_q + qt;
    const auto row_begin = layout.col_idx.begin() + layout.row_ptr[row];
    const auto row_end = layout.col_idx.begin() + layout.row_ptr[row + 1];
    auto it = std::lower_bound(row_begin, row_end, static_cast<int32_t>(first_k));
    for (; it != row_end && *it < end_k; ++it) {
      out.col_idx.push_back(static_cast<int32_t>(*it - first_k));
      out.mask.push_back(layout.mask[it - layout.col_idx.begin()]);
    }
    out.row_ptr.push_back(static_cast<int64_t>(out.col_idx.size()));
  }
  return out;
}

RectLayout RectLayoutFromRule(const IntervalRule& rule, int64_t q_begin, int64_t q_end,
                              int64_t k_begin, int64_t k_end, int32_t tile) {
  RectLayout out;
  out.q_begin = q_begin;
  out.q_len = q_end - q_begin;
  out.k_begin = k_begin;
  out.k_len = k_end - k_begin;
  out.tile = tile;
  out.rule = rule;
  out.row_ptr.reserve(out.num_q_tiles() + 1);
  out.row_ptr.push_back(0);
  for (int64_t qt = 0; qt < out.num_q_tiles(); ++qt) {
    const int64_t a = q_begin + qt * tile;            // first query of the tile
    const int64_t z = std::min(a + tile, q_end) - 1;  // last query of the tile
    // Every query admits itself and the intervals' ends never decrease, so the keys admitted by
    // some query of the tile form the interval [Lo(a), Hi(z)], and those admitted by all of
    // them [Lo(z), Hi(a)].
    const int64_t any_lo = std::max(rule.Lo(a), k_begin);
    const int64_t any_hi = std::min(rule.Hi(z), k_end - 1);
    const int64_t all_lo = rule.Lo(z);
    const int64_t all_hi = rule.Hi(a);
    if (any_lo <= any_hi) {
      for (int64_t kt = (any_lo - k_begin) / tile; kt <= (any_hi - k_begin) / tile; ++kt) {
        const int64_t c = k_begin + kt * tile;
        const int64_t d = std::min(c + tile, k_end) - 1;
        out.col_idx.push_back(static_cast<int32_t>(kt));
        out.mask.push_back(c >= all_lo && d <= all_hi ? BlockMask::kFull : BlockMask::kPartial);
      }
    }
    out.row_ptr.push_back(static_cast<int64_t>(out.col_idx.size()));
  }
  return out;
}

}  // namespace attnserve
