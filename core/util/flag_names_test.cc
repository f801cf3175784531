#include "core/util/flag_names.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, flag_names_test_address, "127.0.0.1:0",
          "an address for the help test, with a description long enough to be wrapped onto a "
          "second line of the help text that DashedFlagsHelp writes");
ABSL_FLAG(int, flag_names_test_count, 3, "a count");

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

std::vector<std::string> Rewritten(std::vector<std::string> in) {
  std::vector<char*> argv;
  for (std::string& s : in) argv.push_back(s.data());
  argv.push_back(nullptr);
  UnderscoredArgv out(static_cast<int>(in.size()), argv.data());
  EXPECT_EQ(out.argv()[out.argc()], nullptr);
  return std::vector<std::string>(out.argv(), out.argv() + out.argc());
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Flagfiles may spell names with dashes: their flags take the --flagfile argument's place,
// rewritten like the command line's (nested flagfiles, lists and the two-argument form too).
TEST(FlagNamesTest, FlagfilesAreReadAndRewritten) {
  const std::string inner = WriteFile("flag_names_inner.flags", "--max-queue=8\n");
  const std::string outer = WriteFile("flag_names_outer.flags",
                                      "# server flags\n\n  --metrics-listen=127.0.0.1:9464  \n"
                                      "--flagfile=" +
                                          inner + "\n--spec={\"a-b\": 1}\n");
  const std::string other = WriteFile("flag_names_other.flags", "--log-level=debug\n");
  EXPECT_EQ(
      Rewritten({"attnserve", "--backend=cpu", "--flagfile=" + outer, "--port-file=p"}),
      (std::vector<std::string>{"attnserve", "--backend=cpu", "--metrics_listen=127.0.0.1:9464",
                                "--max_queue=8", "--spec={\"a-b\": 1}", "--port_file=p"}));
  EXPECT_EQ(Rewritten({"attnserve", "--flagfile", inner + "," + other}),
            (std::vector<std::string>{"attnserve", "--max_queue=8", "--log_level=debug"}));
}

// What absl must report itself stays a --flagfile argument: a missing file, a file with a
// positional argument, a flagfile that names itself (past the nesting limit).
TEST(FlagNamesTest, FlagfilesAbslRefusesAreLeftToIt) {
  const std::string missing = ::testing::TempDir() + "/flag_names_missing.flags";
  const std::string positional = WriteFile("flag_names_positional.flags", "--a-b=1\nvalue\n");
  EXPECT_EQ(
      Rewritten({"attnserve", "--flagfile=" + missing, "--flag-file-after=1"}),
      (std::vector<std::string>{"attnserve", "--flagfile=" + missing, "--flag_file_after=1"}));
  EXPECT_EQ(Rewritten({"attnserve", "--flagfile=" + positional}),
            (std::vector<std::string>{"attnserve", "--flagfile=" + positional}));
  const std::string self = ::testing::TempDir() + "/flag_names_self.flags";
  WriteFile("flag_names_self.flags", "--x-y=1\n--flagfile=" + self + "\n");
  const std::vector<std::string> out = Rewritten({"attnserve", "--flagfile=" + self});
  EXPECT_EQ(out.back(), "--flagfile=" + self);
  EXPECT_EQ(out[1], "--x_y=1");
}

// Help lists this file's flags with dashes, sorted, with their defaults and wrapped descriptions.
TEST(FlagNamesTest, DashedFlagsHelpListsAFilesFlags) {
  EXPECT_EQ(DashedFlagName("metrics_listen"), "--metrics-listen");
  const std::string help = DashedFlagsHelp("core/util/flag_names_test.cc");
  EXPECT_EQ(help,
            "  --flag-names-test-address (default \"127.0.0.1:0\")\n"
            "      an address for the help test, with a description long enough to be wrapped "
            "onto a second line\n"
            "      of the help text that DashedFlagsHelp writes\n"
            "  --flag-names-test-count (default 3)\n"
            "      a count\n");
  EXPECT_EQ(DashedFlagsHelp("no/such/file.cc"), "");
}

// Arguments after "--" are positional, even one that looks like a flagfile.
TEST(FlagNamesTest, NoFlagfileAfterDoubleDash) {
  EXPECT_EQ(Rewritten({"attnctl", "--", "--flagfile=/nonexistent"}),
            (std::vector<std::string>{"attnctl", "--", "--flagfile=/nonexistent"}));
}

}  // namespace
}  // namespace attnserve
