#include "core/util/flag_names.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(FlagNamesTest, RewritesOnlyTheNameOfDoubleDashArguments) {
  EXPECT_EQ(FlagArgWithUnderscores("--head-dim=64"), "--head_dim=64");
  EXPECT_EQ(FlagArgWithUnderscores("--chunk-bytes"), "--chunk_bytes");
  EXPECT_EQ(FlagArgWithUnderscores("--max_attempts=2"), "--max_attempts=2");
  EXPECT_EQ(FlagArgWithUnderscores(R"(--spec={"a-b": "c-d"})"), R"(--spec={"a-b": "c-d"})");
  EXPECT_EQ(FlagArgWithUnderscores("--x=a-b"), "--x=a-b");
  EXPECT_EQ(FlagArgWithUnderscores("-h"), "-h");
  EXPECT_EQ(FlagArgWithUnderscores("--"), "--");
  EXPECT_EQ(FlagArgWithUnderscores("q-file.npy"), "q-file.npy");
  EXPECT_EQ(FlagArgWithUnderscores("-1"), "-1");
}

TEST(FlagNamesTest, UnderscoredArgvKeepsProgramNameAndPositionalArguments) {
  std::vector<std::string> in = {"/opt/attn-serve", "--metrics-listen=0.0.0.0:9464",
                                 "value-with-dash", "--", "--not-a-flag"};
  std::vector<char*> argv;
  for (std::string& s : in) argv.push_back(s.data());
  argv.push_back(nullptr);
  UnderscoredArgv out(static_cast<int>(in.size()), argv.data());
  ASSERT_EQ(out.argc(), 5);
  EXPECT_STREQ(out.argv()[0], "/opt/attn-serve");
  EXPECT_STREQ(out.argv()[1], "--metrics_listen=0.0.0.0:9464");
  EXPECT_STREQ(out.argv()[2], "value-with-dash");
  EXPECT_STREQ(out.argv()[3], "--");
  EXPECT_STREQ(out.argv()[4], "--not-a-flag");
  EXPECT_EQ(out.argv()[5], nullptr);
}

}  // namespace
}  // namespace attnserve
