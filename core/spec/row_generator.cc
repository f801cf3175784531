#include "core/spec/row_generator.h"

#include <algorithm>
#include <variant>

namespace attnserve {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// Appends the ascending columns [first, last] (nothing when first > last).
void AppendRange(int64_t first, int64_t last, std::vector<int64_t>& cols) {
  for (int64_t c = first; c <= last; ++c) cols.push_back(c);
}

}  // namespace

RowGenerator::RowGenerator(const BlockGenerator& generator, int64_t num_blocks)
    : generator_(generator), nb_(num_blocks) {
  if (const auto* g = std::get_if<DilatedSparseGen>(&generator)) {
    // Distinct rates that can land inside the layout, ascending.
    for (int64_t r : g->rates) {
      if (r >= 1 && r < nb_) rates_.push_back(r);
    }
    std::sort(rates_.begin(), rates_.end());
    rates_.erase(std::unique(rates_.begin(), rates_.end()), rates_.end());
  }
}

void RowGenerator::Row(int64_t i, int64_t last_col, std::vector<int64_t>& cols) const {
  cols.clear();
  std::visit(
      Overloaded{
          [&](const LocalWindowGen& g) {
            const int64_t w = std::min(g.width, nb_);
            AppendRange(std::max<int64_t>(0, i - w), std::min(last_col, i + w), cols);
          },
          [&](const DilatedSparseGen&) {
            // i - r for descending r, then i, then i + r for ascending r: ascending overall.
            for (auto it = rates_.rbegin(); it != rates_.rend(); ++it) {
              if (*it <= i) cols.push_back(i - *it);
            }
            cols.push_back(i);
            for (int64_t r : rates_) {
              if (i + r > last_col) break;
              cols.push_back(i + r);
            }
          },
          [&](const GlobalLocalGen& g) {
            const int64_t globals = std::min(g.global_blocks, nb_);
            if (i < globals) {
              AppendRange(0, last_col, cols);
              return;
            }
            const int64_t w = std::min(g.width, nb_);
            const int64_t global_end = std::min(globals, last_col + 1);  // columns [0, end)
            const int64_t lo = std::max<int64_t>(0, i - w);
            const int64_t hi = std::min(last_col, i + w);
            if (lo <= global_end) {
              AppendRange(0, std::max(global_end - 1, hi), cols);
            } else {
              AppendRange(0, global_end - 1, cols);
              AppendRange(lo, hi, cols);
            }
          },
          [&](const StridedGen& g) {
            // Columns j with (i - j) mod s == 0 are j = i (mod s). For s >= nb that is only i
            // itself, so s = nb is equivalent and keeps j + s from overflowing.
            const int64_t s = std::min(g.stride, nb_);
            const int64_t w = std::min(g.width, nb_);
            const int64_t lo = std::max<int64_t>(0, i - w);
            const int64_t hi = std::min(last_col, i + w);
            const int64_t residue = i % s;
            for (int64_t c = residue; c < lo; c += s) cols.push_back(c);
            AppendRange(lo, hi, cols);
            // First column > hi congruent to i.
            const int64_t after = hi + 1;
            for (int64_t c = after + ((residue - after % s) % s + s) % s; c <= last_col; c += s) {
              cols.push_back(c);
            }
          },
          [&](const RandomGen& g) {
            cols = RandomRowBlocks(i, nb_, g.keep, g.seed);
            cols.insert(std::lower_bound(cols.begin(), cols.end(), i), i);
            cols.erase(std::upper_bound(cols.begin(), cols.end(), last_col), cols.end());
          },
          [&](const CsrGen& g) {
            for (int64_t e = g.row_ptr[i]; e < g.row_ptr[i + 1]; ++e) {
              if (g.col_idx[e] > last_col) break;
              cols.push_back(g.col_idx[e]);
            }
          },
      },
      generator_);
}

}  // namespace attnserve
