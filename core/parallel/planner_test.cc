#include "core/parallel/planner.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A stand-in for Device::EstimateBytes: Q, K, V and O in the dtype plus a float32 LSE.
int64_t Estimate(const AttentionSpec&, const AttentionShape& s, DType dtype) {
  const int64_t e = static_cast<int64_t>(DTypeSize(dtype));
  return s.batch * s.tokens * (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim * e +
         s.batch * s.q_heads * s.tokens * 4;
}

PlannerInput Input(AttentionShape shape, std::vector<int64_t> free,
                   PlacementHint hint = PlacementHint::kAuto) {
  PlannerInput in;
  in.shape = shape;
  in.dtype = DType::kBF16;
  in.free_bytes = std::move(free);
  in.hint = hint;
  in.estimate = Estimate;
  return in;
}

TEST(PlannerTest, SmallRequestStaysOnTheFreestDevice) {
  auto plan = PlanPlacement(Input({1, 1024, 8, 8, 64}, {10 * kGiB, 40 * kGiB, 20 * kGiB}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement, Placement::kSingle);
  EXPECT_EQ(plan->devices, std::vector<int>{1});
  EXPECT_EQ(plan->bytes_per_device, Estimate({}, {1, 1024, 8, 8, 64}, DType::kBF16));
}

TEST(PlannerTest, LargeBatchGoesDataParallel) {
  // 4 x 8 = 32 units over 4 devices; large work.
  auto plan = PlanPlacement(Input({4, 32768, 32, 8, 128}, std::vector<int64_t>(4, 80 * kGiB)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement, Placement::kDataParallel);
  EXPECT_EQ(plan->devices.size(), 4u);
  EXPECT_EQ(plan->kv_heads_per_unit, 1);
}

TEST(PlannerTest, SequenceTooLongForOneDeviceGoesRing) {
  // 4 units for 8 devices; 4M tokens x (2 x 40 + 2 x 4) heads x 128 x 2 bytes = 88 GiB: no single
  // device holds it.
  const AttentionShape shape{1, 4 << 20, 40, 4, 128};
  auto plan = PlanPlacement(Input(shape, std::vector<int64_t>(8, 80 * kGiB)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement, Placement::kRing);
  EXPECT_EQ(plan->devices.size(), 8u);
  EXPECT_NE(plan->reason.find("too long"), std::string::npos) << plan->reason;
}

TEST(PlannerTest, RingDropsADeviceTooSmallForItsShard) {
  const AttentionShape shape{1, 4 << 20, 32, 8, 128};
  auto plan = PlanPlacement(Input(shape, {100 * kGiB, 100 * kGiB, 100 * kGiB, 1 * kGiB}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement, Placement::kRing);
  EXPECT_EQ(plan->devices, (std::vector<int>{0, 1, 2}));
}

TEST(PlannerTest, LargeSingleUnitRequestUsesRingEvenWhenItFits) {
  auto plan = PlanPlacement(Input({1, 65536, 8, 1, 128}, {80 * kGiB, 80 * kGiB}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement, Placement::kRing);
}

TEST(PlannerTest, HintsAreHonouredWhenFeasible) {
  const AttentionShape shape{2, 4096, 8, 4, 64};
  auto single = PlanPlacement(Input(shape, {kGiB, 2 * kGiB}, PlacementHint::kSingle));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->placement, Placement::kSingle);
  EXPECT_EQ(single->devices, std::vector<int>{1});
  auto dp = PlanPlacement(Input(shape, {kGiB, 2 * kGiB}, PlacementHint::kDataParallel));
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ(dp->placement, Placement::kDataParallel);
  auto ring = PlanPlacement(Input(shape, {kGiB, 2 * kGiB, kGiB}, PlacementHint::kRing));
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->placement, Placement::kRing);
  EXPECT_EQ(ring->devices.size(), 3u);
}

TEST(PlannerTest, InfeasibleHintsExplainWhy) {
  const AttentionShape one_unit{1, 4096, 8, 1, 64};
  auto ring1 = PlanPlacement(Input(one_unit, {kGiB}, PlacementHint::kRing));
  EXPECT_EQ(ring1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ring1.status().message().find("ring needs >= 2 devices"), std::string::npos);
  auto dp = PlanPlacement(Input(one_unit, {kGiB, kGiB}, PlacementHint::kDataParallel));
  EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dp.status().message().find("1 units"), std::string::npos) << dp.status();
  auto single =
      PlanPlacement(Input({1, 1 << 22, 32, 8, 128}, {kGiB, kGiB}, PlacementHint::kSingle));
  EXPECT_EQ(single.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PlannerTest, NothingFits) {
  auto plan = PlanPlacement(Input({1, 1 << 22, 32, 8, 128}, {kGiB / 4, kGiB / 4}));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("bytes per device"), std::string::npos);
}

TEST(PlannerTest, RejectsMissingDevicesAndEstimate) {
  EXPECT_EQ(PlanPlacement(Input({1, 64, 1, 1, 8}, {})).status().code(),
            absl::StatusCode::kInvalidArgument);
  PlannerInput in = Input({1, 64, 1, 1, 8}, {kGiB});
  in.estimate = nullptr;
  EXPECT_EQ(PlanPlacement(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlannerTest, DilatedDataParallelUnitsKeepHeadOffsets) {
  PlannerInput in = Input({1, 65536, 16, 4, 64}, std::vector<int64_t>(2, 80 * kGiB),
                          PlacementHint::kDataParallel);
  in.spec.pattern = DilatedSpec{{4096}, {8}};
  auto plan = PlanPlacement(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_heads_per_unit, 2);  // 2 KV heads x 4 query heads each = 8 = the rate
}

// Requests that are not square (keys of another length, a query offset, packed sequences) stay
// on one device: no split handles them yet. This one would otherwise go data parallel.
TEST(PlannerTest, NonSquareRequestsRunOnOneDevice) {
  AttentionShape shape{4, 32768, 32, 8, 128};
  shape.kv_tokens = 32769;
  auto plan = PlanPlacement(Input(shape, std::vector<int64_t>(4, 80 * kGiB)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement, Placement::kSingle);
  EXPECT_EQ(plan->devices.size(), 1u);
  EXPECT_NE(plan->reason.find("not square"), std::string::npos) << plan->reason;
  // A square shape with an offset, and a packed one, alike.
  PlannerInput offset = Input({4, 32768, 32, 8, 128}, std::vector<int64_t>(4, 80 * kGiB));
  offset.spec.q_offset = 10;
  ASSERT_TRUE(PlanPlacement(offset).ok());
  EXPECT_EQ(PlanPlacement(offset)->placement, Placement::kSingle);
  PlannerInput packed = Input({1, 32768, 32, 8, 128}, std::vector<int64_t>(4, 80 * kGiB));
  packed.spec.cu_seqlens_q = {0, 16384, 32768};
  packed.spec.cu_seqlens_k = {0, 16384, 32768};
  EXPECT_EQ(PlanPlacement(packed)->placement, Placement::kSingle);
  // Splits asked for by name are not there yet; one that fits nowhere is out of memory.
  for (PlacementHint hint : {PlacementHint::kRing, PlacementHint::kDataParallel}) {
    auto hinted = PlanPlacement(Input(shape, std::vector<int64_t>(4, 80 * kGiB), hint));
    EXPECT_EQ(hinted.status().code(), absl::StatusCode::kUnimplemented) << hinted.status();
    EXPECT_NE(hinted.status().message().find("Nq != Nkv"), std::string::npos);
  }
  shape.tokens = 4 << 20;
  EXPECT_EQ(PlanPlacement(Input(shape, std::vector<int64_t>(8, 80 * kGiB))).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(PlannerTest, RingBytesShrinkWithRanks) {
  PlannerInput in = Input({1, 1 << 20, 8, 8, 128}, {kGiB});
  EXPECT_GT(RingBytesPerRank(in, 2), RingBytesPerRank(in, 4));
  EXPECT_GT(RingBytesPerRank(in, 4), Estimate({}, {1, 1 << 18, 8, 8, 128}, DType::kBF16));
}

}  // namespace
}  // namespace attnserve
