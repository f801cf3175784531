// Specs and shapes drawn from fuzz bytes (FuzzedDataProvider), shared by the spec and request
// assembler targets. Values are mostly small, so that valid specs come up often, with the edges
// (negative, zero, int64 extremes, NaN) drawn on purpose; the shape is capped by the caller so
// one input stays fast and memory-bounded.
#ifndef ATTNSERVE_TESTS_FUZZ_FUZZ_SPEC_GEN_H_
#define ATTNSERVE_TESTS_FUZZ_FUZZ_SPEC_GEN_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/spec/attention_spec.h"

namespace attnserve::fuzz {

// A count or size: usually in [-2, small_max], at times an edge of int64.
inline int64_t FuzzInt(FuzzedDataProvider& p, int64_t small_max) {
  switch (p.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return std::numeric_limits<int64_t>::max();
    case 1:
      return std::numeric_limits<int64_t>::min();
    case 2:
      return p.ConsumeIntegral<int64_t>();
    case 3:
      return (int64_t{1} << p.ConsumeIntegralInRange<int>(0, 62)) +
             p.ConsumeIntegralInRange<int64_t>(-1, 1);
    default:
      return p.ConsumeIntegralInRange<int64_t>(-2, std::max<int64_t>(small_max, -2));
  }
}

inline std::vector<int64_t> FuzzInts(FuzzedDataProvider& p, int max_count, int64_t small_max) {
  std::vector<int64_t> out(p.ConsumeIntegralInRange<int>(0, max_count));
  for (int64_t& x : out) x = FuzzInt(p, small_max);
  return out;
}

// Non-decreasing from 0 to `total` in `parts` steps (valid packed offsets), or raw values.
// `total` may be anything (a header's raw tokens); only the last entry is then out of range.
inline std::vector<int64_t> FuzzCuSeqlens(FuzzedDataProvider& p, int parts, int64_t total) {
  const int64_t top = std::clamp<int64_t>(total, 0, int64_t{1} << 20);
  if (p.ConsumeIntegralInRange<int>(0, 7) == 0) return FuzzInts(p, parts + 1, top + 1);
  std::vector<int64_t> cu(parts + 1, 0);
  for (int i = 1; i < parts; ++i) {
    cu[i] = p.ConsumeIntegralInRange<int64_t>(cu[i - 1], top);
  }
  cu[parts] = total;
  return cu;
}

inline float FuzzScale(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return -1.f;
    case 3:
      return p.ConsumeFloatingPoint<float>();
    default:
      return 0.f;
  }
}

inline BlockGenerator FuzzGenerator(FuzzedDataProvider& p, int64_t max_blocks) {
  switch (p.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      return LocalWindowGen{FuzzInt(p, max_blocks)};
    case 1:
      return DilatedSparseGen{FuzzInts(p, 6, max_blocks)};
    case 2:
      return GlobalLocalGen{FuzzInt(p, max_blocks), FuzzInt(p, max_blocks)};
    case 3:
      return StridedGen{FuzzInt(p, max_blocks), FuzzInt(p, max_blocks)};
    case 4: {
      double keep = p.ConsumeProbability<double>();
      switch (p.ConsumeIntegralInRange<int>(0, 7)) {
        case 0:
          keep = std::numeric_limits<double>::quiet_NaN();
          break;
        case 1:
          keep = -keep;
          break;
        case 2:
          keep = 1.0 + keep;
          break;
        default:
          break;
      }
      return RandomGen{keep, p.ConsumeIntegral<uint64_t>()};
    }
    default: {
      // A valid layout of nb rows most of the time, so that compilation is reached.
      CsrGen g;
      const int64_t nb = p.ConsumeIntegralInRange<int64_t>(0, max_blocks + 1);
      g.row_ptr.push_back(0);
      for (int64_t i = 0; i < nb; ++i) {
        int64_t c = p.ConsumeIntegralInRange<int64_t>(-1, 2);
        while (c < nb && p.ConsumeBool()) {
          if (c >= 0) g.col_idx.push_back(c);
          c += p.ConsumeIntegralInRange<int64_t>(1, 3);
        }
        g.row_ptr.push_back(static_cast<int64_t>(g.col_idx.size()));
      }
      if (p.ConsumeIntegralInRange<int>(0, 7) == 0 && !g.row_ptr.empty()) {
        g.row_ptr[p.ConsumeIntegralInRange<size_t>(0, g.row_ptr.size() - 1)] = FuzzInt(p, nb);
      }
      return g;
    }
  }
}

// The pattern, causal and scale of a spec whose sequences hold up to `max_len` positions.
inline AttentionPattern FuzzPattern(FuzzedDataProvider& p, int64_t max_len) {
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return DenseSpec{};
    case 1:
      return WindowSpec{FuzzInt(p, max_len)};
    case 2: {
      DilatedSpec d;
      const int branches = p.ConsumeIntegralInRange<int>(0, 4);
      for (int k = 0; k < branches; ++k) {
        d.segment_lengths.push_back(FuzzInt(p, max_len));
        d.dilation_rates.push_back(FuzzInt(p, 16));
      }
      if (p.ConsumeIntegralInRange<int>(0, 15) == 0) d.dilation_rates.push_back(1);
      return d;
    }
    default: {
      BlockSparseSpec b;
      switch (p.ConsumeIntegralInRange<int>(0, 4)) {
        case 0:
          b.block_size = p.ConsumeIntegral<int32_t>();
          break;
        case 1:
        case 2:
          b.block_size = 64;
          break;
        default:
          b.block_size = 128;
          break;
      }
      b.generator = FuzzGenerator(p, max_len / 64 + 1);
      return b;
    }
  }
}

}  // namespace attnserve::fuzz

#endif  // ATTNSERVE_TESTS_FUZZ_FUZZ_SPEC_GEN_H_
