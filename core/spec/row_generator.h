// One query block row of a block_sparse generator at a time: what the pattern compiler (square
// layouts) and the rectangular builder (rect_pattern.h) both emit rows from. Internal to core/spec.
#ifndef ATTNSERVE_CORE_SPEC_ROW_GENERATOR_H_
#define ATTNSERVE_CORE_SPEC_ROW_GENERATOR_H_

#include <cstdint>
#include <vector>

#include "core/spec/attention_spec.h"

namespace attnserve {

// Produces one query block row of a generator over `num_blocks` blocks: the kept key blocks
// <= `last_col`, ascending and distinct. `last_col` is nb - 1, or the row itself under causal so
// that causal rows never generate the blocks they would drop (no other value is supported). Each
// call is O(columns emitted), except random (O(k log k)) and dilated_sparse (O(rates)). The
// generator must be valid for num_blocks (a csr one needs num_blocks + 1 row pointers) and must
// outlive this object.
class RowGenerator {
 public:
  RowGenerator(const BlockGenerator& generator, int64_t num_blocks);

  void Row(int64_t i, int64_t last_col, std::vector<int64_t>& cols) const;

 private:
  const BlockGenerator& generator_;
  int64_t nb_;
  std::vector<int64_t> rates_;  // dilated_sparse only
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_SPEC_ROW_GENERATOR_H_
