// The float64 oracle: every spec computed straight from the math, token by token (no blocks, no
// tiling, no online softmax). O(N^2 * D) time, O(N) extra memory: small sizes only.
#ifndef ATTNSERVE_CORE_REFERENCE_REFERENCE_H_
#define ATTNSERVE_CORE_REFERENCE_REFERENCE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

struct ReferenceResult {
  std::vector<double> o;    // [B, Nq, Hq, D]
  std::vector<double> lse;  // [B, Hq, Nq]; -inf for rows with no admissible key (their O is 0)
};

// q: [B, Nq, Hq, D], k and v: [B, Nkv, Hkv, D], any dtype (read exactly), with the spec's query
// offset and packed sequences (DESIGN "The math"). Validates shape and spec.
absl::StatusOr<ReferenceResult> ReferenceAttention(const AttentionSpec& spec, const HostTensor& q,
                                                   const HostTensor& k, const HostTensor& v);

// Whether key block j is kept for query block i by a block_sparse spec's generator (not causal:
// the caller applies causal at token level). Straight from the generator formulas.
bool ReferenceBlockKept(const BlockSparseSpec& bs, int64_t num_blocks, int64_t i, int64_t j);

// Comparison of a backend's outputs against the reference, as the tests and attnbench report it.
struct ErrorStats {
  double o_max_abs = 0;      // max |o - ref|
  double o_ref_max_abs = 0;  // max |ref|
  double o_rel = 0;          // o_max_abs / max(o_ref_max_abs, 1e-30)
  double lse_max_abs = 0;    // max |lse - ref| over rows with finite ref LSE
  int64_t nonfinite = 0;     // outputs that are NaN/inf where the reference is finite, or
                             // LSE not -inf where the reference is -inf
  int64_t checked = 0;       // elements compared
};
// Acceptance bounds of a float32-accumulating backend (the CPU backend) against the reference:
// ErrorStats::o_rel by input dtype (f32 1e-5, f16 2e-3, bf16 1e-2), and ErrorStats::lse_max_abs.
double ReferenceOTolerance(DType input_dtype);
inline constexpr double kReferenceLseTolerance = 1e-4;

// o: [B, N, Hq, D] in any dtype, lse: [B, Hq, N] f32 (lse may be null to skip it).
ErrorStats CompareToReference(const ReferenceResult& ref, const HostTensor& o,
                              const HostTensor* lse);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_REFERENCE_REFERENCE_H_
