#include "wire/convert.h"

#include <cmath>
#include <variant>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

// Round trip core -> proto -> core -> proto: the proto forms must be identical.
void ExpectRoundTrip(const AttentionSpec& spec) {
  const v1::AttentionSpec proto = SpecToProto(spec);
  absl::StatusOr<AttentionSpec> back = SpecFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SpecToProto(*back).SerializeAsString(), proto.SerializeAsString())
      << proto.DebugString();
  EXPECT_EQ(back->causal, spec.causal);
  EXPECT_EQ(back->scale, spec.scale);
  EXPECT_EQ(back->pattern.index(), spec.pattern.index());
  // And through JSON.
  absl::StatusOr<AttentionSpec> from_json = ParseSpecJson(SpecToJson(spec));
  ASSERT_TRUE(from_json.ok()) << from_json.status() << " " << SpecToJson(spec);
  EXPECT_EQ(SpecToProto(*from_json).SerializeAsString(), proto.SerializeAsString());
}

TEST(SpecConvertTest, RoundTripsEveryPatternAndGenerator) {
  ExpectRoundTrip(AttentionSpec{DenseSpec{}, true, 0.f});
  ExpectRoundTrip(AttentionSpec{WindowSpec{17}, false, 0.125f});
  ExpectRoundTrip(AttentionSpec{DilatedSpec{{2048, 4096}, {1, 2}}, true, 0.f});
  ExpectRoundTrip(AttentionSpec{BlockSparseSpec{64, LocalWindowGen{3}}, false, 0.f});
  ExpectRoundTrip(AttentionSpec{BlockSparseSpec{128, DilatedSparseGen{{2, 4, 8}}}, true, 0.f});
  ExpectRoundTrip(AttentionSpec{BlockSparseSpec{128, GlobalLocalGen{2, 1}}, false, 0.f});
  ExpectRoundTrip(AttentionSpec{BlockSparseSpec{64, StridedGen{4, 1}}, false, 0.f});
  ExpectRoundTrip(
      AttentionSpec{BlockSparseSpec{64, RandomGen{0.25, 18446744073709551557ull}}, false, 0.f});
  ExpectRoundTrip(AttentionSpec{BlockSparseSpec{64, CsrGen{{0, 1, 3}, {0, 0, 1}}}, true, 0.f});
}

TEST(SpecConvertTest, UnsetOneofsNameTheField) {
  v1::AttentionSpec p;
  absl::StatusOr<AttentionSpec> s = SpecFromProto(p);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "spec.pattern: one of dense, window, dilated, block_sparse must be set");
  p.mutable_block_sparse()->set_block_size(64);
  s = SpecFromProto(p);
  EXPECT_THAT(s.status().message(), HasSubstr("spec.block_sparse.generator: one of local_window"));
}

TEST(SpecConvertTest, ParsesTheDocumentedJson) {
  absl::StatusOr<AttentionSpec> s = ParseSpecJson(
      R"({"dilated": {"segmentLengths": [2048, 4096], "dilationRates": [1, 2]}, "causal": true})");
  ASSERT_TRUE(s.ok()) << s.status();
  const auto* d = std::get_if<DilatedSpec>(&s->pattern);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->segment_lengths, (std::vector<int64_t>{2048, 4096}));
  EXPECT_EQ(d->dilation_rates, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(s->causal);

  // snake_case names and 64-bit integers as strings are part of the proto3 JSON mapping.
  s = ParseSpecJson(
      R"({"block_sparse": {"block_size": 64, "random": {"keep": 0.1, "seed": "7"}}})");
  ASSERT_TRUE(s.ok()) << s.status();
  const auto* bs = std::get_if<BlockSparseSpec>(&s->pattern);
  ASSERT_NE(bs, nullptr);
  EXPECT_EQ(bs->block_size, 64);
  EXPECT_EQ(std::get<RandomGen>(bs->generator).seed, 7u);

  s = ParseSpecJson(R"({"dense": {}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(std::holds_alternative<DenseSpec>(s->pattern));
}

TEST(SpecConvertTest, JsonErrorsSayWhatIsWrong) {
  absl::StatusOr<AttentionSpec> s = ParseSpecJson(R"({"dense": {}, "window": {"size": 3}})");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);  // two members of one oneof
  EXPECT_THAT(s.status().message(), HasSubstr("spec:"));

  s = ParseSpecJson(R"({"dilatd": {}})");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("dilatd"));

  s = ParseSpecJson(R"({"window": {"size": "many"}})");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  s = ParseSpecJson("{not json");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  s = ParseSpecJson(R"({"causal": true})");
  EXPECT_EQ(s.status().message(),
            "spec.pattern: one of dense, window, dilated, block_sparse must be set");
}

// -0.0 is accepted where 0 is, but must not make a second wire message for the same spec: the
// JSON form prints it as -0, which parses back as +0 (found by fuzz_spec_json).
TEST(SpecConvertTest, NegativeZeroIsCanonicalised) {
  absl::StatusOr<AttentionSpec> spec = ParseSpecJson(
      R"({"scale": -0.0, "blockSparse": {"blockSize": 64, "random": {"keep": -0.00}}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(std::signbit(spec->scale));
  const auto& bs = std::get<BlockSparseSpec>(spec->pattern);
  EXPECT_FALSE(std::signbit(std::get<RandomGen>(bs.generator).keep));
  absl::StatusOr<AttentionSpec> again = ParseSpecJson(SpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(SpecToProto(*again).SerializeAsString(), SpecToProto(*spec).SerializeAsString());

  AttentionSpec core;  // a spec built in code with -0 goes out as +0 as well
  core.scale = -0.f;
  core.pattern = BlockSparseSpec{64, RandomGen{-0.0, 7}};
  EXPECT_FALSE(std::signbit(SpecToProto(core).scale()));
  EXPECT_FALSE(std::signbit(SpecToProto(core).block_sparse().random().keep()));
}

TEST(SpecConvertTest, DTypes) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    absl::StatusOr<DType> back = DTypeFromProto(DTypeToProto(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_THAT(DTypeFromProto(v1::DTYPE_UNSPECIFIED, "header.dtype").status().message(),
              HasSubstr("header.dtype: must be set"));
  EXPECT_THAT(DTypeFromProto(static_cast<v1::DType>(42), "header.dtype").status().message(),
              HasSubstr("unknown value 42"));
}

}  // namespace
}  // namespace attnserve
