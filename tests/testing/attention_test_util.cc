#include "tests/testing/attention_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>

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
  in.k = *HostTensor::Create(dtype, {s.batch, s.kv_len(), s.kv_heads, s.head_dim});
  in.v = *HostTensor::Create(dtype, {s.batch, s.kv_len(), s.kv_heads, s.head_dim});
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

AttentionSpec SpecOf(AttentionPattern pattern, bool causal) {
  AttentionSpec s;
  s.pattern = std::move(pattern);
  s.causal = causal;
  return s;
}

AttentionSpec SparseCase(int32_t block, BlockGenerator generator, bool causal) {
  BlockSparseSpec bs;
  bs.block_size = block;
  bs.generator = std::move(generator);
  return SpecOf(bs, causal);
}

void ExpectOutputsClose(const AttentionOutputs& a, const AttentionOutputs& b, double o_tol) {
  ASSERT_EQ(a.o.dims(), b.o.dims());
  ASSERT_EQ(a.lse.dims(), b.lse.dims());
  double o_err = 0, lse_err = 0;
  for (int64_t i = 0; i < a.o.numel(); ++i) {
    o_err = std::max(o_err, std::abs(double(a.o.GetFloat(i)) - b.o.GetFloat(i)));
  }
  for (int64_t i = 0; i < a.lse.numel(); ++i) {
    const float x = a.lse.GetFloat(i), y = b.lse.GetFloat(i);
    if (std::isinf(x) || std::isinf(y)) {
      ASSERT_EQ(x, y) << "lse " << i;
    } else {
      lse_err = std::max(lse_err, std::abs(double(x) - y));
    }
  }
  EXPECT_LE(o_err, o_tol);
  EXPECT_LE(lse_err, 1e-4);
}

}  // namespace attnserve::testing
