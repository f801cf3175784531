// Shared helpers for attention tests on every backend: fresh seeded random inputs, poisoned
// outputs, and the comparison against the float64 reference with per-dtype tolerances.
#ifndef ATTNSERVE_TESTS_TESTING_ATTENTION_TEST_UTIL_H_
#define ATTNSERVE_TESTS_TESTING_ATTENTION_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>

#include "core/engine/types.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

namespace attnserve::testing {

// A fresh seed per call: ATTN_TEST_SEED if set (to replay a failure), else from
// std::random_device. Tests print it (SCOPED_TRACE) so any failure can be replayed.
uint64_t FreshSeed();

struct QkvInputs {
  HostTensor q;  // [B, N, Hq, D]
  HostTensor k;  // [B, N, Hkv, D]
  HostTensor v;  // [B, N, Hkv, D]
};

// Uniform [-1, 1) inputs in `dtype` (rounded to it, so the reference reads the same values),
// from seeds derived from `seed`. Never zeros.
QkvInputs MakeRandomInputs(const AttentionShape& shape, DType dtype, uint64_t seed);

// Outputs filled with 0xFF bytes (NaN in every dtype), so an element a backend forgets to write
// fails the comparison: o [B, N, Hq, D] in `dtype`, lse [B, Hq, N] f32.
HostTensor PoisonedOutput(const AttentionShape& shape, DType dtype);
HostTensor PoisonedLse(const AttentionShape& shape);

// Max relative error of O (max |o - ref| / max |ref|) accepted per dtype: f32 1e-5 (accumulation
// order), f16 2e-3 and bf16 1e-2 (one output rounding of 2^-11 / 2^-8 plus accumulation).
inline double OTolerance(DType dtype) { return ReferenceOTolerance(dtype); }
// Max absolute LSE error: LSE is f32 in every dtype and the inputs are exact, so one bound.
inline constexpr double kLseTolerance = kReferenceLseTolerance;

// Success when no output is non-finite where the reference is finite (and -inf LSE rows match),
// O is within OTolerance(dtype) and LSE within kLseTolerance. The message carries the figures.
::testing::AssertionResult MatchesReference(const ReferenceResult& ref, const HostTensor& o,
                                            const HostTensor* lse, DType dtype);

// "[B=1, N=300, Hq=4, Hkv=2, D=64] bf16" for test names and traces.
std::string ShapeString(const AttentionShape& shape, DType dtype);

// Spec builders, so tests state a case in one line.
AttentionSpec SpecOf(AttentionPattern pattern, bool causal = false);
// The same with the queries at q_offset among the keys (requests that are not square).
inline AttentionSpec SpecAt(AttentionPattern pattern, bool causal, int64_t q_offset) {
  AttentionSpec s = SpecOf(std::move(pattern), causal);
  s.q_offset = q_offset;
  return s;
}
inline AttentionSpec DenseCase(bool causal) { return SpecOf(DenseSpec{}, causal); }
inline AttentionSpec WindowCase(int64_t w, bool causal) { return SpecOf(WindowSpec{w}, causal); }
// Block-sparse with `generator` at `block` (64 or 128).
AttentionSpec SparseCase(int32_t block, BlockGenerator generator, bool causal);

// Two runs' outputs agree: equal shapes, O within `o_tol` (absolute), LSE within 1e-4 with -inf
// exactly where the other has -inf.
void ExpectOutputsClose(const AttentionOutputs& a, const AttentionOutputs& b, double o_tol);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_ATTENTION_TEST_UTIL_H_
