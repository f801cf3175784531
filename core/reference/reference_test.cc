#include "core/reference/reference.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;

constexpr double kInf = std::numeric_limits<double>::infinity();

double Dot(const HostTensor& a, int64_t a_off, const HostTensor& b, int64_t b_off, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += double{a.GetFloat(a_off + i)} * b.GetFloat(b_off + i);
  return s;
}

void ExpectNear(const ReferenceResult& a, const ReferenceResult& b, double tol) {
  ASSERT_EQ(a.o.size(), b.o.size());
  ASSERT_EQ(a.lse.size(), b.lse.size());
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], tol) << "o[" << i << "]";
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(a.lse[i]) || std::isinf(b.lse[i])) {
      ASSERT_EQ(a.lse[i], b.lse[i]) << "lse[" << i << "]";
    } else {
      ASSERT_NEAR(a.lse[i], b.lse[i], tol) << "lse[" << i << "]";
    }
  }
}

class ReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = FreshSeed();
    RecordProperty("seed", std::to_string(seed_));
    std::printf("seed %llu (replay with ATTN_TEST_SEED)\n", static_cast<unsigned long long>(seed_));
  }
  uint64_t seed_ = 0;
};

// A causal row 0 sees only key 0: O = v0, LSE = scale * q0 . k0; with one token the same holds
// for every spec.
TEST_F(ReferenceTest, CausalRowZeroSeesOneKey) {
  const AttentionShape s{1, 37, 2, 1, 32};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec spec;
  spec.causal = true;
  spec.scale = 0.3f;
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (int64_t h = 0; h < 2; ++h) {
    const double expected = 0.3f * Dot(in.q, h * 32, in.k, 0, 32);
    EXPECT_NEAR(ref->lse[h * 37], expected, 1e-12);
    for (int64_t d = 0; d < 32; ++d) EXPECT_DOUBLE_EQ(ref->o[h * 32 + d], in.v.GetFloat(d));
  }
}

TEST_F(ReferenceTest, DefaultScaleIsInverseSqrtHeadDim) {
  const AttentionShape s{1, 1, 1, 1, 64};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  auto ref = ReferenceAttention(AttentionSpec{}, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_NEAR(ref->lse[0], Dot(in.q, 0, in.k, 0, 64) / 8.0, 1e-12);
}

// Two keys with known scores: the softmax by hand.
TEST_F(ReferenceTest, TwoKeysByHand) {
  auto q = *HostTensor::Create(DType::kF32, {1, 2, 1, 1});
  auto k = *HostTensor::Create(DType::kF32, {1, 2, 1, 1});
  auto v = *HostTensor::Create(DType::kF32, {1, 2, 1, 1});
  q.SetFloat(0, 1.f), q.SetFloat(1, 2.f);
  k.SetFloat(0, 0.5f), k.SetFloat(1, -1.f);
  v.SetFloat(0, 3.f), v.SetFloat(1, 7.f);
  AttentionSpec spec;
  spec.scale = 1.f;
  auto ref = ReferenceAttention(spec, q, k, v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  // Row 1: scores 1 and -2.
  const double p0 = std::exp(1.0), p1 = std::exp(-2.0);
  EXPECT_NEAR(ref->o[1], (3 * p0 + 7 * p1) / (p0 + p1), 1e-12);
  EXPECT_NEAR(ref->lse[1], std::log(p0 + p1), 1e-12);
}

TEST_F(ReferenceTest, WindowCoveringEverythingEqualsDense) {
  const AttentionShape s{2, 50, 2, 2, 16};
  auto in = MakeRandomInputs(s, DType::kBF16, seed_);
  for (bool causal : {false, true}) {
    AttentionSpec dense, win;
    dense.causal = win.causal = causal;
    win.pattern = WindowSpec{49};
    ExpectNear(*ReferenceAttention(dense, in.q, in.k, in.v),
               *ReferenceAttention(win, in.q, in.k, in.v), 1e-12);
  }
}

TEST_F(ReferenceTest, WindowZeroSeesOnlyItself) {
  const AttentionShape s{1, 20, 1, 1, 8};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec spec;
  spec.pattern = WindowSpec{0};
  auto ref = *ReferenceAttention(spec, in.q, in.k, in.v);
  for (int64_t i = 0; i < 20; ++i) {
    for (int64_t d = 0; d < 8; ++d) EXPECT_DOUBLE_EQ(ref.o[i * 8 + d], in.v.GetFloat(i * 8 + d));
  }
}

// Query head h reads kv head h / g: with kv heads duplicated explicitly the result is the same.
TEST_F(ReferenceTest, GqaEqualsRepeatedKvHeads) {
  const AttentionShape s{1, 30, 4, 2, 8};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  auto k4 = *HostTensor::Create(DType::kF32, {1, 30, 4, 8});
  auto v4 = *HostTensor::Create(DType::kF32, {1, 30, 4, 8});
  for (int64_t n = 0; n < 30; ++n) {
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t d = 0; d < 8; ++d) {
        k4.SetFloat((n * 4 + h) * 8 + d, in.k.GetFloat((n * 2 + h / 2) * 8 + d));
        v4.SetFloat((n * 4 + h) * 8 + d, in.v.GetFloat((n * 2 + h / 2) * 8 + d));
      }
    }
  }
  AttentionSpec spec;
  spec.causal = true;
  ExpectNear(*ReferenceAttention(spec, in.q, in.k, in.v), *ReferenceAttention(spec, in.q, k4, v4),
             0);
}

TEST_F(ReferenceTest, DilatedOneBranchOverEverythingEqualsDense) {
  const AttentionShape s{1, 45, 3, 1, 8};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  for (bool causal : {false, true}) {
    AttentionSpec dense, dil;
    dense.causal = dil.causal = causal;
    dil.pattern = DilatedSpec{{45}, {1}};
    ExpectNear(*ReferenceAttention(dense, in.q, in.k, in.v),
               *ReferenceAttention(dil, in.q, in.k, in.v), 1e-12);
  }
}

// Two identical branches: the same O, and the denominators add (LSE + log 2).
TEST_F(ReferenceTest, DilatedIdenticalBranchesAddDenominators) {
  const AttentionShape s{1, 40, 2, 2, 8};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec one, two;
  one.pattern = DilatedSpec{{16}, {2}};
  two.pattern = DilatedSpec{{16, 16}, {2, 2}};
  auto a = *ReferenceAttention(one, in.q, in.k, in.v);
  auto b = *ReferenceAttention(two, in.q, in.k, in.v);
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], 1e-12);
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (a.lse[i] == -kInf) {
      ASSERT_EQ(b.lse[i], -kInf);
    } else {
      ASSERT_NEAR(a.lse[i] + std::log(2.0), b.lse[i], 1e-12);
    }
  }
}

// Rate 4 with 2 heads: head h covers positions p with (p mod w) = h mod 4 (mod 4) only; the rest
// get O = 0, LSE = -inf. Segment 10 does not divide N = 25.
TEST_F(ReferenceTest, DilatedCoverageFollowsOffsets) {
  const AttentionShape s{1, 25, 2, 1, 4};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec spec;
  spec.pattern = DilatedSpec{{10}, {4}};
  auto ref = *ReferenceAttention(spec, in.q, in.k, in.v);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t p = 0; p < 25; ++p) {
      const bool covered = (p % 10) >= h && ((p % 10) - h) % 4 == 0;
      EXPECT_EQ(std::isfinite(ref.lse[h * 25 + p]), covered) << "h=" << h << " p=" << p;
      if (!covered) {
        EXPECT_EQ(ref.o[(p * 2 + h) * 4], 0.0);
      }
    }
  }
  // Position 20 (segment 2 = [20, 25), offset 0) of head 0 attends to 20 and 24 only.
  auto single = [&](int64_t j) { return 0.5 * Dot(in.q, (20 * 2) * 4, in.k, j * 4, 4); };
  const double l = std::log(std::exp(single(20)) + std::exp(single(24)));
  EXPECT_NEAR(ref.lse[20], l, 1e-12);
}

// Block size 64, segment 64, rate 1 is block-diagonal attention: the same as a block_sparse
// local_window(0) (which is exactly the diagonal blocks), last block short.
TEST_F(ReferenceTest, DilatedRateOneEqualsBlockDiagonal) {
  const AttentionShape s{1, 150, 2, 2, 8};
  auto in = MakeRandomInputs(s, DType::kF16, seed_);
  for (bool causal : {false, true}) {
    AttentionSpec dil, bs;
    dil.causal = bs.causal = causal;
    dil.pattern = DilatedSpec{{64}, {1}};
    bs.pattern = BlockSparseSpec{64, LocalWindowGen{0}};
    ExpectNear(*ReferenceAttention(dil, in.q, in.k, in.v),
               *ReferenceAttention(bs, in.q, in.k, in.v), 1e-12);
  }
}

TEST_F(ReferenceTest, BlockSparseAllBlocksEqualsDense) {
  const AttentionShape s{1, 200, 2, 1, 16};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec dense, bs;
  dense.causal = bs.causal = true;
  bs.pattern = BlockSparseSpec{64, GlobalLocalGen{4, 0}};
  ExpectNear(*ReferenceAttention(dense, in.q, in.k, in.v),
             *ReferenceAttention(bs, in.q, in.k, in.v), 1e-12);
}

TEST(ReferenceBlockKeptTest, GeneratorFormulas) {
  const int64_t nb = 8;
  auto kept = [&](const BlockGenerator& g, int64_t i, int64_t j) {
    return ReferenceBlockKept(BlockSparseSpec{64, g}, nb, i, j);
  };
  EXPECT_TRUE(kept(LocalWindowGen{1}, 3, 4));
  EXPECT_TRUE(kept(LocalWindowGen{1}, 4, 3));
  EXPECT_FALSE(kept(LocalWindowGen{1}, 3, 5));
  EXPECT_TRUE(kept(DilatedSparseGen{{2, 5}}, 6, 1));
  EXPECT_TRUE(kept(DilatedSparseGen{{2, 5}}, 6, 6));
  EXPECT_FALSE(kept(DilatedSparseGen{{2, 5}}, 6, 5));
  EXPECT_TRUE(kept(GlobalLocalGen{1, 0}, 0, 7));
  EXPECT_TRUE(kept(GlobalLocalGen{1, 0}, 7, 0));
  EXPECT_FALSE(kept(GlobalLocalGen{1, 0}, 7, 6));
  EXPECT_TRUE(kept(StridedGen{3, 0}, 1, 7));
  EXPECT_TRUE(kept(StridedGen{3, 0}, 7, 1));
  EXPECT_FALSE(kept(StridedGen{3, 0}, 7, 2));
  EXPECT_TRUE(kept(StridedGen{3, 1}, 7, 6));
  const CsrGen csr{{0, 1, 1, 3, 3, 3, 3, 3, 3}, {5, 0, 2}};
  EXPECT_TRUE(kept(csr, 0, 5));
  EXPECT_FALSE(kept(csr, 1, 1));
  EXPECT_TRUE(kept(csr, 2, 0));
  EXPECT_TRUE(kept(csr, 2, 2));
  EXPECT_FALSE(kept(csr, 2, 1));
  // Random: the diagonal plus exactly round(keep * nb) = 3 others per row.
  for (int64_t i = 0; i < nb; ++i) {
    int64_t count = 0;
    for (int64_t j = 0; j < nb; ++j) count += kept(RandomGen{0.375, 42}, i, j);
    EXPECT_TRUE(kept(RandomGen{0.375, 42}, i, i));
    EXPECT_EQ(count, 4) << "row " << i;
  }
}

// A csr row with no blocks gives O = 0, LSE = -inf on every row of that query block.
TEST_F(ReferenceTest, EmptyCsrRowGivesMinusInf) {
  const AttentionShape s{1, 100, 1, 1, 8};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec spec;
  spec.pattern = BlockSparseSpec{64, CsrGen{{0, 1, 1}, {0}}};
  auto ref = *ReferenceAttention(spec, in.q, in.k, in.v);
  for (int64_t i = 0; i < 64; ++i) EXPECT_TRUE(std::isfinite(ref.lse[i]));
  for (int64_t i = 64; i < 100; ++i) {
    EXPECT_EQ(ref.lse[i], -kInf);
    for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(ref.o[i * 8 + d], 0.0);
  }
}

TEST_F(ReferenceTest, RejectsBadShapesAndSpecs) {
  auto q = *HostTensor::Create(DType::kF32, {1, 16, 4, 8});
  auto k = *HostTensor::Create(DType::kF32, {1, 16, 3, 8});
  auto v = *HostTensor::Create(DType::kF32, {1, 16, 3, 8});
  auto r = ReferenceAttention(AttentionSpec{}, q, k, v);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  auto k2 = *HostTensor::Create(DType::kF32, {2, 8, 2, 8});  // another batch
  r = ReferenceAttention(AttentionSpec{}, q, k2, k2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  auto k3 = *HostTensor::Create(DType::kF32, {1, 16, 2, 8});
  AttentionSpec bad;
  bad.pattern = WindowSpec{-1};
  r = ReferenceAttention(bad, q, k3, k3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

TEST_F(ReferenceTest, CompareFlagsNanAndMissingMinusInf) {
  const AttentionShape s{1, 100, 1, 1, 8};
  auto in = MakeRandomInputs(s, DType::kF32, seed_);
  AttentionSpec spec;
  spec.pattern = BlockSparseSpec{64, CsrGen{{0, 1, 1}, {0}}};
  auto ref = *ReferenceAttention(spec, in.q, in.k, in.v);
  auto o = *HostTensor::Create(DType::kF32, {1, 100, 1, 8});
  auto lse = *HostTensor::Create(DType::kF32, {1, 1, 100});
  for (int64_t i = 0; i < o.numel(); ++i) o.SetFloat(i, static_cast<float>(ref.o[i]));
  for (int64_t i = 0; i < lse.numel(); ++i) lse.SetFloat(i, static_cast<float>(ref.lse[i]));
  ErrorStats st = CompareToReference(ref, o, &lse);
  EXPECT_EQ(st.nonfinite, 0);
  EXPECT_LT(st.o_rel, 1e-6);
  EXPECT_EQ(st.checked, 900);
  o.SetFloat(3, std::nanf(""));
  lse.SetFloat(70, 0.f);  // the reference says -inf there
  st = CompareToReference(ref, o, &lse);
  EXPECT_EQ(st.nonfinite, 2);
}

}  // namespace
}  // namespace attnserve
