#include "bench/spec_json.h"

#include <variant>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace attnserve::bench {
namespace {

TEST(SpecJsonTest, ParsesEveryPatternInCamelAndSnakeCase) {
  auto dense = ParseSpecJson(R"({"dense": {}})");
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_TRUE(std::holds_alternative<DenseSpec>(dense->pattern));
  EXPECT_FALSE(dense->causal);

  auto win = ParseSpecJson(R"({"window": {"size": 256}, "causal": true, "scale": 0.5})");
  ASSERT_TRUE(win.ok()) << win.status();
  EXPECT_EQ(std::get<WindowSpec>(win->pattern).size, 256);
  EXPECT_TRUE(win->causal);
  EXPECT_EQ(win->scale, 0.5f);

  for (const char* json :
       {R"({"dilated": {"segmentLengths": [2048, 4096], "dilationRates": [1, 2]}})",
        R"({"dilated": {"segment_lengths": ["2048", 4096], "dilation_rates": [1, 2]}})"}) {
    auto dil = ParseSpecJson(json);
    ASSERT_TRUE(dil.ok()) << dil.status();
    const auto& d = std::get<DilatedSpec>(dil->pattern);
    EXPECT_EQ(d.segment_lengths, (std::vector<int64_t>{2048, 4096}));
    EXPECT_EQ(d.dilation_rates, (std::vector<int64_t>{1, 2}));
  }

  auto rnd = ParseSpecJson(R"({"blockSparse": {"blockSize": 128, "random": {"keep": 0.1, "seed": 1}}})");
  ASSERT_TRUE(rnd.ok()) << rnd.status();
  const auto& bs = std::get<BlockSparseSpec>(rnd->pattern);
  EXPECT_EQ(bs.block_size, 128);
  EXPECT_DOUBLE_EQ(std::get<RandomGen>(bs.generator).keep, 0.1);
  EXPECT_EQ(std::get<RandomGen>(bs.generator).seed, 1u);

  auto lw = ParseSpecJson(R"({"block_sparse": {"block_size": 64, "local_window": {"width": 2}}})");
  ASSERT_TRUE(lw.ok()) << lw.status();
  EXPECT_EQ(std::get<LocalWindowGen>(std::get<BlockSparseSpec>(lw->pattern).generator).width, 2);

  auto gl = ParseSpecJson(
      R"({"blockSparse": {"blockSize": 64, "globalLocal": {"globalBlocks": 1, "width": 3}}})");
  ASSERT_TRUE(gl.ok()) << gl.status();
  auto st = ParseSpecJson(R"({"blockSparse": {"strided": {"stride": 4, "width": 1}}})");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(std::get<StridedGen>(std::get<BlockSparseSpec>(st->pattern).generator).stride, 4);
  auto ds = ParseSpecJson(R"({"blockSparse": {"dilatedSparse": {"rates": [2, 4]}}})");
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto csr = ParseSpecJson(R"({"blockSparse": {"csr": {"rowPtr": [0, 1, 2], "colIdx": [0, 1]}}})");
  ASSERT_TRUE(csr.ok()) << csr.status();
  EXPECT_EQ(std::get<CsrGen>(std::get<BlockSparseSpec>(csr->pattern).generator).col_idx,
            (std::vector<int64_t>{0, 1}));
}

TEST(SpecJsonTest, RoundTripsThroughSpecToJson) {
  for (const char* json :
       {R"({"dense": {}, "causal": true})", R"({"window": {"size": 7}})",
        R"({"dilated": {"segmentLengths": [16, 32], "dilationRates": [1, 4]}})",
        R"({"blockSparse": {"blockSize": 64, "random": {"keep": 0.25, "seed": "18446744073709551615"}}})"}) {
    auto a = ParseSpecJson(json);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = ParseSpecJson(SpecToJson(*a));
    ASSERT_TRUE(b.ok()) << b.status() << " " << SpecToJson(*a);
    EXPECT_EQ(SpecToJson(*a), SpecToJson(*b));
  }
}

TEST(SpecJsonTest, RejectsMalformedInput) {
  for (const char* json :
       {"", "{", R"({"dense": {}, "window": {"size": 1}})", R"({"dense": {"x": 1}})",
        R"({"window": {"size": "big"}})", R"({"causal": 1})", R"({"blockSparse": {"blockSize": 64}})",
        R"({"blockSparse": {"random": {}, "csr": {}}})", R"({"dense": {}} x)", R"([1, 2])",
        R"({"dilated": {"segmentLengths": [1.5]}})", R"({"unknown": {}})"}) {
    auto s = ParseSpecJson(json);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << json;
  }
  auto s = ParseSpecJson(R"({"blockSparse": {"random": {"keep": "x"}}})");
  EXPECT_NE(s.status().message().find("spec.blockSparse.random.keep"), std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace attnserve::bench
