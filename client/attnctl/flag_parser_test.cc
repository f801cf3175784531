#include "client/attnctl/flag_parser.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int64_t, test_count, 3, "a count");
ABSL_FLAG(bool, test_switch, false, "a switch");
ABSL_FLAG(std::string, test_text, "x", "some text");
ABSL_FLAG(absl::Duration, test_wait, absl::Seconds(1), "a wait");
ABSL_FLAG(double, test_bound, 0, "a bound");

namespace attnserve::attnctl {
namespace {

class FlagParserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_test_count, 3);
    absl::SetFlag(&FLAGS_test_switch, false);
    absl::SetFlag(&FLAGS_test_text, "x");
    absl::SetFlag(&FLAGS_test_wait, absl::Seconds(1));
    absl::SetFlag(&FLAGS_test_bound, 0);
  }
  const std::vector<FlagUse> accepted_ = {{"test_count", "N"},
                                          {"test_switch", ""},
                                          {"test_text", "TEXT"},
                                          {"test_wait", "DURATION", "2s"}};
};

TEST_F(FlagParserTest, DashesUnderscoresSeparateAndJoinedValues) {
  absl::StatusOr<FlagSet> set = ParseCommandFlags(
      accepted_, {"--test-count", "7", "--test_switch", "--test-text=a-b=c", "--test-wait=500ms"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_text), "a-b=c");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_wait), absl::Milliseconds(500));
  EXPECT_TRUE(set->Has("test_count"));
  EXPECT_TRUE(set->Has("test_wait"));

  set = ParseCommandFlags(
      accepted_, {"--test-count=-2", "--test-switch=false", "--test-text", "--not-a-flag"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), -2);
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_text), "--not-a-flag");  // a value, taken as given
  EXPECT_FALSE(set->Has("test_wait"));
}

TEST_F(FlagParserTest, UsageErrorsNameTheArgument) {
  auto error = [&](std::vector<std::string> args) {
    absl::StatusOr<FlagSet> set = ParseCommandFlags(accepted_, args);
    EXPECT_FALSE(set.ok());
    return set.ok() ? std::string() : std::string(set.status().message());
  };
  EXPECT_EQ(error({"--no-such-flag"}), "unknown flag --no-such-flag");
  // Defined, but not one this subcommand accepts.
  EXPECT_EQ(error({"--test-bound=1"}), "unknown flag --test-bound");
  EXPECT_EQ(error({"positional"}), "unexpected argument 'positional'");
  EXPECT_EQ(error({"--test-count"}), "--test-count needs a value");
  EXPECT_EQ(error({"--test-switch=maybe"}), "--test-switch takes no value");
  EXPECT_EQ(error({"--test-count=many"}), "--test-count: expected an integer, got 'many'");
  EXPECT_EQ(error({"--test-wait", "soon"}),
            "--test-wait: expected a duration such as 500ms, 30s or 5m, got 'soon'");
}

TEST_F(FlagParserTest, OperandsAnywhereUpToTheLimit) {
  absl::StatusOr<FlagSet> set =
      ParseCommandFlags(accepted_, {"--test-count", "7", "ctx-1", "--test-switch"}, 1);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->operands(), std::vector<std::string>{"ctx-1"});
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);  // a flag's value is never an operand
  set = ParseCommandFlags(accepted_, {"a", "--test-text=t"}, 2);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->operands(), std::vector<std::string>{"a"});
  set = ParseCommandFlags(accepted_, {"a", "b"}, 1);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().message(), "unexpected argument 'b'");
  set = ParseCommandFlags(accepted_, {"-x"}, 1);  // a single dash is no operand
  EXPECT_FALSE(set.ok());
}

TEST_F(FlagParserTest, RangeChecks) {
  absl::SetFlag(&FLAGS_test_count, 0);
  EXPECT_EQ(IntAtLeast(FLAGS_test_count, 1).status().message(),
            "--test-count: expected an integer >= 1, got 0");
  EXPECT_EQ(*IntAtLeast(FLAGS_test_count, 0), 0);
  absl::SetFlag(&FLAGS_test_wait, absl::ZeroDuration());
  EXPECT_FALSE(PositiveDuration(FLAGS_test_wait).ok());
  absl::SetFlag(&FLAGS_test_wait, absl::InfiniteDuration());  // no deadline
  EXPECT_TRUE(PositiveDuration(FLAGS_test_wait).ok());
  absl::SetFlag(&FLAGS_test_bound, -1e-3);
  EXPECT_FALSE(NonNegative(FLAGS_test_bound).ok());
}

TEST_F(FlagParserTest, Lists) {
  EXPECT_EQ(*IntList("concurrency", "1,2,4,8,16", 1, 1024), (std::vector<int64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(*IntList("concurrency", "3", 1, 1024), std::vector<int64_t>{3});
  for (const char* bad : {"", "0", "1,,2", "1,2,", "2000", "x", "1;2", "1.5"}) {
    absl::StatusOr<std::vector<int64_t>> list = IntList("concurrency", bad, 1, 1024);
    ASSERT_FALSE(list.ok()) << bad;
    EXPECT_EQ(list.status().message(),
              std::string("--concurrency: expected a comma-separated list of integers 1..1024 "
                          "such as 1,2,4,8, got '") +
                  bad + "'");
  }
  EXPECT_EQ(*PositiveList("rate", "20,0.5", 1e6), (std::vector<double>{20, 0.5}));
  for (const char* bad : {"", "0", "-1", "fast", "2e6", "nan", "inf", "10,"}) {
    absl::StatusOr<std::vector<double>> list = PositiveList("rate", bad, 1e6);
    ASSERT_FALSE(list.ok()) << bad;
    EXPECT_EQ(list.status().message(),
              std::string("--rate: expected a comma-separated list of numbers > 0 and <= 1e+06 "
                          "such as 10,20.5, got '") +
                  bad + "'");
  }
}

TEST_F(FlagParserTest, HelpListsEachFlagWithItsDefault) {
  const std::string help = FlagsHelp(accepted_);
  EXPECT_NE(help.find("--test-count N"), std::string::npos) << help;
  EXPECT_NE(help.find("a count (default 3)"), std::string::npos) << help;
  EXPECT_NE(help.find("--test-switch "), std::string::npos) << help;
  EXPECT_NE(help.find("a wait (default 2s)"), std::string::npos) << help;  // the override
  EXPECT_EQ(help.find("test-bound"), std::string::npos) << help;
  // "-": no default shown.
  const std::string bound = FlagsHelp({{"test_bound", "B", "-"}});
  EXPECT_NE(bound.find("a bound"), std::string::npos) << bound;
  EXPECT_EQ(bound.find("default"), std::string::npos) << bound;
  EXPECT_EQ(DashedFlag("max_attempts"), "--max-attempts");
}

}  // namespace
}  // namespace attnserve::attnctl
