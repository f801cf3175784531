#include "core/cpu/merge.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "core/cpu/cpu_backend.h"
#include "core/reference/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(MergePartialRowsTest, MinusInfinityHandling) {
  // Row 0: both empty. Row 1: only the input has keys. Row 2: only the accumulator has keys.
  std::vector<float> o_acc = {0, 0, 0, 0, 5, 6};
  std::vector<float> lse_acc = {kNegInf, kNegInf, 1.5f};
  const std::vector<float> o_in = {0, 0, 3, 4, 9, 9};
  const std::vector<float> lse_in = {kNegInf, 0.25f, kNegInf};
  MergePartialRows(3, 2, o_acc.data(), 2, lse_acc.data(), 1, o_in.data(), 2, lse_in.data(), 1);
  EXPECT_EQ(lse_acc[0], kNegInf);
  EXPECT_EQ(o_acc[0], 0.f);
  EXPECT_EQ(o_acc[1], 0.f);
  EXPECT_EQ(lse_acc[1], 0.25f);
  EXPECT_EQ(o_acc[2], 3.f);
  EXPECT_EQ(o_acc[3], 4.f);
  EXPECT_EQ(lse_acc[2], 1.5f);
  EXPECT_EQ(o_acc[4], 5.f);
  EXPECT_EQ(o_acc[5], 6.f);
}

TEST(MergePartialRowsTest, WeightsByDenominators) {
  float o_acc[2] = {1.f, 2.f}, lse_acc[1] = {std::log(3.f)};
  const float o_in[2] = {5.f, -2.f}, lse_in[1] = {std::log(1.f)};
  MergePartialRows(1, 2, o_acc, 2, lse_acc, 1, o_in, 2, lse_in, 1);
  EXPECT_NEAR(lse_acc[0], std::log(4.f), 1e-6);
  EXPECT_NEAR(o_acc[0], 0.75f * 1.f + 0.25f * 5.f, 1e-6);
  EXPECT_NEAR(o_acc[1], 0.75f * 2.f + 0.25f * -2.f, 1e-6);
}

TEST(MergePartialRowsTest, ExtremeLseNeitherOverflowsNorMakesNan) {
  float o_acc[1] = {1.f}, lse_acc[1] = {1000.f};
  const float o_in[1] = {-1.f}, lse_in[1] = {-1000.f};
  MergePartialRows(1, 1, o_acc, 1, lse_acc, 1, o_in, 1, lse_in, 1);
  EXPECT_EQ(lse_acc[0], 1000.f);
  EXPECT_EQ(o_acc[0], 1.f);
  float o2[1] = {1.f}, l2[1] = {-80.f};
  const float oi2[1] = {3.f}, li2[1] = {80.f};
  MergePartialRows(1, 1, o2, 1, l2, 1, oi2, 1, li2, 1);
  EXPECT_EQ(l2[0], 80.f);
  EXPECT_EQ(o2[0], 3.f);
}

TEST(MergePartialsTest, RejectsMismatchedShapes) {
  auto o = *HostTensor::Create(DType::kF32, {1, 8, 2, 4});
  auto lse = *HostTensor::Create(DType::kF32, {1, 2, 8});
  auto o_bad = *HostTensor::Create(DType::kF32, {1, 8, 2, 8});
  auto lse_bad = *HostTensor::Create(DType::kF32, {1, 8, 2});
  auto o_bf16 = *HostTensor::Create(DType::kBF16, {1, 8, 2, 4});
  EXPECT_EQ(MergePartials(o, lse, o_bad, lse).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MergePartials(o, lse, o, lse_bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MergePartials(o, lse, o_bf16, lse).code(), absl::StatusCode::kInvalidArgument);
}

// Attention over a split of the keys, merged by LSE, equals attention over all of them: run a
// csr layout keeping the left key blocks and one keeping the right ones, merge, compare to the
// dense reference. Causal rows of the left blocks have no right keys (-inf partials).
TEST(MergePartialsTest, MergingASplitOfTheKeysEqualsTheWhole) {
  const uint64_t seed = testing::FreshSeed();
  std::printf("seed %llu (replay with ATTN_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  const AttentionShape shape{2, 300, 4, 2, 64};
  const auto in = testing::MakeRandomInputs(shape, DType::kF32, seed);
  const int64_t nb = NumBlocks(shape.tokens, 64);  // 5 blocks, the last short
  const int64_t split = 2;                         // left: blocks [0, 2), right: [2, 5)
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    CsrGen left, right;
    left.row_ptr = right.row_ptr = {0};
    for (int64_t i = 0; i < nb; ++i) {
      for (int64_t j = 0; j < nb; ++j) (j < split ? left : right).col_idx.push_back(j);
      left.row_ptr.push_back(static_cast<int64_t>(left.col_idx.size()));
      right.row_ptr.push_back(static_cast<int64_t>(right.col_idx.size()));
    }
    AttentionSpec l_spec, r_spec, dense;
    l_spec.causal = r_spec.causal = dense.causal = causal;
    l_spec.pattern = BlockSparseSpec{64, left};
    r_spec.pattern = BlockSparseSpec{64, right};
    auto a = CpuAttention(l_spec, in.q, in.k, in.v);
    auto b = CpuAttention(r_spec, in.q, in.k, in.v);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    ASSERT_TRUE(MergePartials(a->o, a->lse, b->o, b->lse).ok());
    EXPECT_TRUE(testing::MatchesReference(*ReferenceAttention(dense, in.q, in.k, in.v), a->o,
                                          &a->lse, DType::kF32));
  }
}

}  // namespace
}  // namespace attnserve
