// BlockLayout: the compiled form of a spec that every backend executes. A CSR over query blocks of
// the kept key blocks, each with a mask kind. Memory is O(query blocks + kept blocks), never
// O(blocks^2).
#ifndef ATTNSERVE_CORE_SPEC_BLOCK_LAYOUT_H_
#define ATTNSERVE_CORE_SPEC_BLOCK_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace attnserve {

enum class BlockMask : uint8_t {
  kFull = 0,            // every (query, key) pair in the block is admissible: no mask work
  kCausalDiagonal = 1,  // admissible iff key position <= query position (blocks on the diagonal)
  kPartial = 2,         // admissible iff TokenRule::Admits(query, key)
};

// The token-level rule applied inside kPartial blocks (and implied by the others).
struct TokenRule {
  bool causal = false;
  std::optional<int64_t> window;  // |i - j| <= window

  bool Admits(int64_t q, int64_t k) const {
    if (causal && k > q) return false;
    if (window && (q - k > *window || k - q > *window)) return false;
    return true;
  }
};

struct BlockLayout {
  int64_t seq_len = 0;      // tokens (query and key positions share one axis)
  int32_t block_size = 0;   // tokens per block; the last block may be short
  int64_t num_blocks = 0;   // NumBlocks(seq_len, block_size)
  TokenRule rule;           // what kPartial blocks evaluate
  std::vector<int64_t> row_ptr;  // num_blocks + 1 entries, row_ptr[0] = 0
  std::vector<int32_t> col_idx;  // kept key block per entry, ascending within a row
  std::vector<BlockMask> mask;   // one per entry of col_idx

  int64_t kept_blocks() const { return static_cast<int64_t>(col_idx.size()); }
  // Fraction of (query block, key block) pairs skipped: 1 - kept / num_blocks^2.
  double sparsity() const;
  // Admissible (query, key) token pairs: sum over kept blocks of the pairs its mask admits.
  // Used for FLOP counts (4 * D * pairs per head) and reported by benches.
  int64_t AdmittedPairs() const;
  // Bytes held by the CSR arrays.
  int64_t MemoryBytes() const;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_SPEC_BLOCK_LAYOUT_H_
