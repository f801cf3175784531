// Shard layouts: a fixed capacity stays on one device when it fits and is split evenly over the
// fewest devices otherwise (or over as many as asked), spills pick the device with the most room,
// and appended rows are cut at the shard boundaries.
#include "server/contexts/shard_layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(ShardLayoutTest, FixedCapacityOnOneDeviceWhenItFits) {
  auto plan = PlanFixedShards({100, 400, 200}, /*row_bytes=*/4, /*capacity=*/100, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].device, 1u);  // the most room
  EXPECT_EQ((*plan)[0].rows, 100);
}

TEST(ShardLayoutTest, FixedCapacitySplitsEvenlyOverTheFewestDevices) {
  // 150 rows of 4 bytes: 600 bytes fit nowhere; 75 + 75 fit devices 1 and 2 (400, 300).
  auto plan = PlanFixedShards({100, 400, 300}, 4, 150, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].device, 1u);  // ascending device order
  EXPECT_EQ((*plan)[1].device, 2u);
  EXPECT_EQ((*plan)[0].rows, 75);
  EXPECT_EQ((*plan)[1].rows, 75);
  // An odd capacity: the first shard takes the extra row.
  plan = PlanFixedShards({400, 400}, 4, 151, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].rows, 76);
  EXPECT_EQ((*plan)[1].rows, 75);
}

TEST(ShardLayoutTest, AskedShardsAndLimits) {
  auto plan = PlanFixedShards({400, 400, 400}, 4, 30, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  for (const ShardRows& r : *plan) EXPECT_EQ(r.rows, 10);
  EXPECT_EQ(PlanFixedShards({400, 400}, 4, 30, 3).status().code(),
            absl::StatusCode::kInvalidArgument);  // more shards than devices
  EXPECT_EQ(PlanFixedShards({400, 400}, 4, 30, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFixedShards({400, 400}, 4, 1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // fewer rows than shards
  EXPECT_EQ(PlanFixedShards({400, 400}, 4, 300, 0).status().code(),
            absl::StatusCode::kResourceExhausted);  // 150 rows each need 600 bytes
  EXPECT_EQ(PlanFixedShards({400, 400}, 4, 150, 1).status().code(),
            absl::StatusCode::kResourceExhausted);  // one device asked, it does not fit
}

TEST(ShardLayoutTest, SpillGoesToTheDeviceWithTheMostRoomNotUsedYet) {
  EXPECT_EQ(SpillDevice({0, 100, 300}, 4, {2}), std::optional<size_t>(1));
  EXPECT_EQ(SpillDevice({0, 100, 300}, 4, {0}), std::optional<size_t>(2));
  EXPECT_EQ(SpillDevice({0, 2, 300}, 4, {2}), std::nullopt);  // not even a row
  EXPECT_EQ(SpillDevice({0, 100}, 4, {0, 1}), std::nullopt);
}

TEST(ShardLayoutTest, RowsAreCutAtShardBoundaries) {
  // Shards [0, 10), [10, 16), [16, 40).
  const std::vector<int64_t> starts = {0, 10, 16}, reserved = {10, 6, 24};
  std::vector<ShardPiece> p = SplitRows(starts, reserved, 7, 20);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].shard, 0u);
  EXPECT_EQ(p[0].local, 7);
  EXPECT_EQ(p[0].first, 0);
  EXPECT_EQ(p[0].rows, 3);
  EXPECT_EQ(p[1].shard, 1u);
  EXPECT_EQ(p[1].local, 0);
  EXPECT_EQ(p[1].first, 3);
  EXPECT_EQ(p[1].rows, 6);
  EXPECT_EQ(p[2].shard, 2u);
  EXPECT_EQ(p[2].local, 0);
  EXPECT_EQ(p[2].first, 9);
  EXPECT_EQ(p[2].rows, 4);
  p = SplitRows(starts, reserved, 11, 12);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].shard, 1u);
  EXPECT_EQ(p[0].local, 1);
  EXPECT_EQ(ShardTokens(10, 6, 12), 2);
  EXPECT_EQ(ShardTokens(10, 6, 30), 6);
  EXPECT_EQ(ShardTokens(10, 6, 10), 0);
}

}  // namespace
}  // namespace attnserve
