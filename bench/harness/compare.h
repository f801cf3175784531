// Cross-checks of one run's output against another's (the benches compare, e.g., chunked prefill
// with one call, or the decode kernel with the prefill kernels, on the host).
#ifndef ATTNSERVE_BENCH_HARNESS_COMPARE_H_
#define ATTNSERVE_BENCH_HARNESS_COMPARE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor/dtype.h"

namespace attnserve::bench {

struct Bf16Agreement {
  double max_rel_diff = 0;  // max |got - ref| / max |ref|
  int64_t nonfinite = 0;    // elements of `got` that are NaN or infinite
};

// Two bf16 tensors of the same size, element by element.
inline Bf16Agreement CompareBf16(const std::vector<uint16_t>& got,
                                 const std::vector<uint16_t>& ref) {
  double max_ref = 0, max_diff = 0;
  Bf16Agreement a;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double x = Bf16ToFloat(got[i]), y = Bf16ToFloat(ref[i]);
    if (!std::isfinite(x)) ++a.nonfinite;
    max_ref = std::max(max_ref, std::abs(y));
    max_diff = std::max(max_diff, std::abs(x - y));
  }
  a.max_rel_diff = max_diff / std::max(max_ref, 1e-30);
  return a;
}

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_HARNESS_COMPARE_H_
