#include "core/spec/block_layout.h"

#include <algorithm>
#include <cstdint>

namespace attnserve {
namespace {

// Pairs (q, k) with q in [q0, q1] and k in [k0, k1] (inclusive) that `rule` admits. One O(1) step
// per query row, so O(block_size) per block: only kPartial blocks come here, and every layout the
// compiler builds has O(num_blocks) of them (they sit on the window's edges).
int64_t CountRulePairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1, const TokenRule& rule) {
  int64_t pairs = 0;
  for (int64_t q = q0; q <= q1; ++q) {
    int64_t lo = k0;
    int64_t hi = k1;
    if (rule.causal) hi = std::min(hi, q);
    if (rule.window) {
      const int64_t w = *rule.window;
      lo = std::max(lo, q - w);
      // Written to avoid q + w overflowing for "unbounded" windows.
      if (w < hi - q) hi = q + w;
    }
    if (hi >= lo) pairs += hi - lo + 1;
  }
  return pairs;
}

}  // namespace

double BlockLayout::sparsity() const {
  if (num_blocks == 0) return 0.0;
  const double total = static_cast<double>(num_blocks) * static_cast<double>(num_blocks);
  return 1.0 - static_cast<double>(kept_blocks()) / total;
}

int64_t BlockLayout::AdmittedPairs() const {
  int64_t pairs = 0;
  for (int64_t i = 0; i < num_blocks; ++i) {
    const int64_t q0 = i * block_size;
    const int64_t q1 = std::min<int64_t>(q0 + block_size, seq_len) - 1;
    const int64_t q_len = q1 - q0 + 1;
    for (int64_t e = row_ptr[i]; e < row_ptr[i + 1]; ++e) {
      const int64_t j = col_idx[e];
      const int64_t k0 = j * block_size;
      const int64_t k1 = std::min<int64_t>(k0 + block_size, seq_len) - 1;
      const int64_t k_len = k1 - k0 + 1;
      switch (mask[e]) {
        case BlockMask::kFull:
          pairs += q_len * k_len;
          break;
        case BlockMask::kCausalDiagonal:
          // Key <= query on global positions; on the diagonal q_len == k_len.
          if (j < i) {
            pairs += q_len * k_len;
          } else if (j == i) {
            pairs += q_len * (q_len + 1) / 2;
          }
          break;
        case BlockMask::kPartial:
          pairs += CountRulePairs(q0, q1, k0, k1, rule);
          break;
      }
    }
  }
  return pairs;
}

int64_t BlockLayout::MemoryBytes() const {
  return static_cast<int64_t>(row_ptr.capacity() * sizeof(int64_t) +
                              col_idx.capacity() * sizeof(int32_t) +
                              mask.capacity() * sizeof(BlockMask));
}

}  // namespace attnserve
