#include "core/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/reference/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::ExpectOutputsClose;
using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::MatchesReference;
using ::attnserve::testing::SpecOf;

// Data parallel over batch x KV-head units equals one device, for a plain and a dilated spec (where
// units must keep h mod r).
TEST(DataParallelTest, MatchesSingleDevice) {
  const uint64_t seed = FreshSeed();
  const AttentionShape shape{2, 70, 8, 2, 16};
  DeviceAttentionFn cpu = [](int, const AttentionSpec& spec, const HostTensor& q,
                             const HostTensor& k,
                             const HostTensor& v) { return CpuAttention(spec, q, k, v); };
  std::vector<AttentionSpec> specs = {AttentionSpec{}, SpecOf(WindowSpec{5}),
                                      SpecOf(DilatedSpec{{16, 70}, {1, 2}}),
                                      SpecOf(DilatedSpec{{16, 64}, {2, 8}})};
  specs[1].causal = true;
  for (const AttentionSpec& spec : specs) {
    SCOPED_TRACE(absl::StrCat(std::string(PatternName(spec.pattern)), " seed=", seed));
    testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, seed);
    auto single = CpuAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(single.ok()) << single.status();
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok());
    for (int P : {1, 2, 3, 5}) {
      SCOPED_TRACE(P);
      auto dp = DataParallelAttention(spec, in.q, in.k, in.v, P, cpu);
      ASSERT_TRUE(dp.ok()) << dp.status();
      ExpectOutputsClose(*dp, *single, 1e-6);
      EXPECT_TRUE(MatchesReference(*ref, dp->o, &dp->lse, DType::kF32));
    }
  }
}

// Shares copy the same token rows of q, k and v: requests that are not square are refused.
TEST(DataParallelTest, NonSquareRequestsAreUnimplemented) {
  DeviceAttentionFn cpu = [](int, const AttentionSpec& spec, const HostTensor& q,
                             const HostTensor& k,
                             const HostTensor& v) { return CpuAttention(spec, q, k, v); };
  testing::QkvInputs in = MakeRandomInputs(AttentionShape{2, 16, 4, 2, 8}, DType::kF32, 1);
  testing::QkvInputs longer = MakeRandomInputs(AttentionShape{2, 40, 4, 2, 8}, DType::kF32, 2);
  auto dp = DataParallelAttention(AttentionSpec{}, in.q, longer.k, longer.v, 2, cpu);
  EXPECT_EQ(dp.status().code(), absl::StatusCode::kUnimplemented) << dp.status();
  AttentionSpec offset;
  offset.q_offset = 16;
  dp = DataParallelAttention(offset, in.q, in.k, in.v, 2, cpu);
  EXPECT_EQ(dp.status().code(), absl::StatusCode::kUnimplemented) << dp.status();
  const DataParallelSplit split = SplitDataParallel(AttentionSpec{}, AttentionShape{2, 16, 4, 2, 8}, 2);
  EXPECT_EQ(GatherShare(split, split.per_device[0], in.q, longer.k, longer.v, nullptr, nullptr)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
}

TEST(DataParallelTest, UnitsRespectGqaAndDilation) {
  const AttentionShape shape{3, 64, 8, 2, 16};
  DataParallelSplit plain = SplitDataParallel(AttentionSpec{}, shape, 4);
  EXPECT_EQ(plain.kv_heads_per_unit, 1);
  EXPECT_EQ(plain.units, 6);
  ASSERT_EQ(plain.per_device.size(), 4u);
  EXPECT_EQ(plain.per_device[0].size(), 2);
  EXPECT_EQ(plain.per_device[3].size(), 1);
  // g = 4 query heads per KV head: rate 8 needs 2 KV heads per unit.
  DataParallelSplit dil = SplitDataParallel(SpecOf(DilatedSpec{{16}, {8}}), shape, 4);
  EXPECT_EQ(dil.kv_heads_per_unit, 2);
  EXPECT_EQ(dil.units, 3);
}

}  // namespace
}  // namespace attnserve
