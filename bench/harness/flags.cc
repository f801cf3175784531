#include "bench/harness/flags.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/flag_names.h"

namespace attnserve::bench {
namespace {

std::string& CommandLineStorage() {
  static std::string* command = new std::string;
  return *command;
}

std::string QuoteForShell(const std::string& arg) {
  if (arg.find_first_of(" {\"'") == std::string::npos) return arg;
  return absl::StrCat("'", arg, "'");
}

// absl's --help lists the flags of the "main" file, which it guesses from the binary's name;
// attnbench_cuda's flags live in cuda_bench_main.cc, so say which files are ours instead.
bool IsBenchFile(absl::string_view path) { return absl::StrContains(path, "bench/"); }

}  // namespace

absl::Status ParseBenchFlags(int argc, char** argv, absl::string_view usage) {
  CommandLineStorage() = ShellCommandLine(std::vector<std::string>(argv, argv + argc));

  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsBenchFile;
  config.contains_help_flags = IsBenchFile;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);

  UnderscoredArgv args(argc, argv);
  const std::vector<char*> positional = absl::ParseCommandLine(args.argc(), args.argv());
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", positional[1], "' (flags are --name=value or --name value)"));
  }
  return absl::OkStatus();
}

const std::string& BenchCommandLine() { return CommandLineStorage(); }

std::string ShellCommandLine(const std::vector<std::string>& args) {
  std::vector<std::string> quoted;
  for (const std::string& arg : args) quoted.push_back(QuoteForShell(arg));
  return absl::StrJoin(quoted, " ");
}

int BenchMain(int argc, char** argv, absl::string_view usage, absl::string_view name,
              absl::Status (*run)()) {
  absl::Status s = ParseBenchFlags(argc, argv, usage);
  if (s.ok()) s = run();
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", std::string(name).c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace attnserve::bench
