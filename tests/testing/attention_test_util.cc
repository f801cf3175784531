#include "tests/testing/attention_test_util.h"

#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace attnserve::testing {

uint64_t FreshSeed() {
  if (const char* env = std::getenv("ATTN_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 10);
  }
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

QkvInputs MakeRandomInputs(const AttentionShape& s, DType dtype, uint64_t seed) {
  QkvInputs in;
  in.q = *HostTensor::Create(dtype, {s.batch, s.tokens, s.q_heads, s.head_dim});
  in.k = *HostTensor::Create(dtype, {s.batch, s.tokens, s.kv_heads, s.head_dim});
  in.v = *HostTensor::Create(dtype, {s.batch, s.tokens, s.kv_heads, s.head_dim});
  // Distinct streams per tensor; q and k span [-2, 2) so the softmax is far from uniform.
  FillUniform(in.q, seed * 3 + 1, -2.f, 2.f);
  FillUniform(in.k, seed * 3 + 2, -2.f, 2.f);
  FillUniform(in.v, seed * 3 + 3, -1.f, 1.f);
  return in;
}

HostTensor PoisonedOutput(const AttentionShape& s, DType dtype) {
  HostTensor t = *HostTensor::Create(dtype, {s.batch, s.tokens, s.q_heads, s.head_dim});
  t.FillBytes(0xFF);
  return t;
}

HostTensor PoisonedLse(const AttentionShape& s) {
  HostTensor t = *HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens});
  t.FillBytes(0xFF);
  return t;
}

::testing::AssertionResult MatchesReference(const ReferenceResult& ref, const HostTensor& o,
                                            const HostTensor* lse, DType dtype) {
  const ErrorStats st = CompareToReference(ref, o, lse);
  const std::string figures =
      absl::StrCat("o_rel=", st.o_rel, " (tol ", OTolerance(dtype), "), o_max_abs=", st.o_max_abs,
                   ", lse_max_abs=", st.lse_max_abs, " (tol ", kLseTolerance,
                   "), nonfinite=", st.nonfinite, ", checked=", st.checked);
  if (st.checked == 0 || st.nonfinite != 0 || !(st.o_rel <= OTolerance(dtype)) ||
      (lse != nullptr && !(st.lse_max_abs <= kLseTolerance))) {
    return ::testing::AssertionFailure() << figures;
  }
  return ::testing::AssertionSuccess() << figures;
}

std::string ShapeString(const AttentionShape& s, DType dtype) {
  return absl::StrCat("[B=", s.batch, ", N=", s.tokens, ", Hq=", s.q_heads, ", Hkv=", s.kv_heads,
                      ", D=", s.head_dim, "] ", std::string(DTypeName(dtype)));
}

}  // namespace attnserve::testing
