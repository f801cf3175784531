#include "client/attnctl/output.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnserve/v1/attnserve.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace attnserve::attnctl {
namespace {

// The spec echo writes int64 values as JSON numbers, not as the proto3 mapping's strings.
TEST(OutputTest, SpecJsonWritesInt64AsNumbers) {
  v1::AttentionSpec spec;
  spec.mutable_window()->set_size(256);
  spec.set_causal(true);
  EXPECT_EQ(SpecJson(spec), R"({"window": {"size": 256}, "causal": true})");

  spec.Clear();
  spec.mutable_dilated()->add_segment_lengths(64);
  spec.mutable_dilated()->add_segment_lengths(128);
  spec.mutable_dilated()->add_dilation_rates(1);
  spec.mutable_dilated()->add_dilation_rates(2);
  EXPECT_EQ(SpecJson(spec),
            R"({"dilated": {"segmentLengths": [64, 128], "dilationRates": [1, 2]}})");

  spec.Clear();
  spec.mutable_dense();
  EXPECT_EQ(SpecJson(spec), R"({"dense": {}})");
}

// What the echo prints is a spec --spec takes back, unchanged (uint64 exactly, too).
TEST(OutputTest, SpecJsonParsesBackToTheSameSpec) {
  v1::AttentionSpec spec;
  v1::BlockSparse* b = spec.mutable_block_sparse();
  b->set_block_size(64);
  b->mutable_random()->set_keep(0.25);
  b->mutable_random()->set_seed(std::numeric_limits<uint64_t>::max());
  spec.set_scale(0.125f);
  const std::string json = SpecJson(spec);
  EXPECT_NE(json.find("\"seed\": 18446744073709551615"), std::string::npos) << json;
  v1::AttentionSpec back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  EXPECT_EQ(back.SerializeAsString(), spec.SerializeAsString()) << json;
}

TEST(OutputTest, ProtoJsonEnumsByNameAndAllPrimitiveFields) {
  v1::AttendHeader h;
  h.set_dtype(v1::DTYPE_BF16);
  h.set_tokens(int64_t{1} << 40);
  EXPECT_EQ(ProtoJson(h).Dump(), R"({"dtype": "DTYPE_BF16", "tokens": 1099511627776})");
  const std::string all = ProtoJson(v1::Limits(), /*all_primitive_fields=*/true).Dump();
  EXPECT_EQ(all, R"({"maxRequestBytes": 0, "maxQueue": 0, "chunkBytes": 0, "maxChunkBytes": 0, )"
                 R"("blockSizes": [], "headDims": []})");
}

TEST(OutputTest, RangesAndCompactLists) {
  std::vector<int32_t> all;
  for (int d = 1; d <= 256; ++d) all.push_back(d);
  EXPECT_EQ(RangesJson(all).Dump(), R"([{"min": 1, "max": 256}])");
  EXPECT_EQ(CompactList(all), "1-256");
  const std::vector<int32_t> two = {64, 128};
  EXPECT_EQ(RangesJson(two).Dump(), R"([{"min": 64, "max": 64}, {"min": 128, "max": 128}])");
  EXPECT_EQ(CompactList(two), "64, 128");
  const std::vector<int32_t> mixed = {1, 2, 3, 5, 6, 9};
  EXPECT_EQ(CompactList(mixed), "1-3, 5, 6, 9");
  EXPECT_EQ(RangesJson(std::vector<int32_t>{}).Dump(), "[]");
}

}  // namespace
}  // namespace attnserve::attnctl
