// Exact figures of dense and window specs, for the runs whose kernels do not report them (cuDNN):
// the admitted (query, key) pairs (the FLOPs) and the block sparsity the own kernels' layout of the
// same spec would report. O(n) or O(n / block), no layout built. Internal to core/cuda.
#ifndef ATTNSERVE_CORE_CUDA_BAND_FIGURES_H_
#define ATTNSERVE_CORE_CUDA_BAND_FIGURES_H_

#include <algorithm>
#include <cstdint>
#include <variant>

#include "core/spec/attention_spec.h"

namespace attnserve {

// Largest |i - j| admitted by a dense or window spec over n tokens.
inline int64_t BandWidth(const AttentionSpec& spec, int64_t n) {
  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) return std::min(w->size, n);
  return n;
}

// Admitted (query, key) pairs of a dense or window spec over n tokens, exactly (O(n)).
inline double BandPairs(const AttentionSpec& spec, int64_t n) {
  if (std::holds_alternative<DenseSpec>(spec.pattern)) {
    const double dn = static_cast<double>(n);
    return spec.causal ? dn * (dn + 1) / 2 : dn * dn;
  }
  const int64_t ws = BandWidth(spec, n);
  int64_t pairs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - ws);
    const int64_t hi = spec.causal ? i : std::min(n - 1, i + ws);
    pairs += hi - lo + 1;
  }
  return static_cast<double>(pairs);
}

// Fraction of (query block, key block) pairs with no admitted pair, blocks of `block` tokens: what
// the own kernels' layout of the same spec reports (O(n / block)).
inline double BandSparsity(const AttentionSpec& spec, int64_t n, int64_t block) {
  const int64_t nb = NumBlocks(n, block);
  if (nb == 0) return 0;
  const int64_t ws = BandWidth(spec, n);
  int64_t kept = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t q0 = i * block, q1 = std::min(n, q0 + block) - 1;
    const int64_t k_lo = std::max<int64_t>(0, q0 - ws);
    const int64_t k_hi = spec.causal ? q1 : std::min(n - 1, q1 + ws);
    kept += k_hi / block - k_lo / block + 1;
  }
  return 1.0 - static_cast<double>(kept) / (static_cast<double>(nb) * static_cast<double>(nb));
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_BAND_FIGURES_H_
