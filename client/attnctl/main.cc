// attnctl: command-line client of attnserve. `attnctl help` lists the subcommands, every flag and
// the exit codes; `attnctl <command> --help` one subcommand's flags.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "client/attnctl/common.h"

namespace attnserve::attnctl {
namespace {

std::vector<Command> Commands() {
  return {RunCommand(), BenchCommand(), HealthCommand(), DescribeCommand()};
}

const Command* FindCommand(const std::vector<Command>& commands, absl::string_view name) {
  for (const Command& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// Every subcommand's usage and summary, then every flag once, then the exit codes.
std::string OverviewHelp(const std::vector<Command>& commands) {
  std::string usage = "attnctl: command-line client of attnserve.\n\nUsage:\n";
  std::string summaries;
  std::vector<FlagUse> flags;
  for (const Command& c : commands) {
    absl::StrAppend(&usage, "  attnctl ", c.synopsis, "\n");
    absl::StrAppend(&summaries, c.name, ":\n  ",
                    absl::StrReplaceAll(absl::StripTrailingAsciiWhitespace(c.summary),
                                        {{"\n", "\n  "}}),
                    "\n\n");
    for (const FlagUse& use : c.flags) {
      const bool listed = std::any_of(flags.begin(), flags.end(),
                                      [&](const FlagUse& f) { return f.name == use.name; });
      if (listed) continue;
      flags.push_back(use);
      // The subcommands' own timeout defaults, side by side.
      if (use.name == "timeout") flags.back().default_text = "5m; health 5s, describe 10s";
    }
  }
  absl::StrAppend(&usage, "  attnctl help [COMMAND]    (or attnctl COMMAND --help)\n\n",
                  summaries);
  absl::StrAppend(&usage, "Flags (each subcommand takes those its usage line shows):\n",
                  FlagsHelp(flags), "\n", kExitCodesHelp);
  return usage;
}

bool IsHelp(absl::string_view arg) { return arg == "--help" || arg == "-h"; }

int Main(int argc, char** argv) {
  const std::vector<Command> commands = Commands();
  if (argc < 2) {
    std::fputs(OverviewHelp(commands).c_str(), stderr);
    return kExitUsage;
  }
  const std::string name = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  const bool help_asked = IsHelp(name) || name == "help" ||
                          std::any_of(args.begin(), args.end(), IsHelp);
  const Command* command = FindCommand(commands, name == "help" && !args.empty() ? args[0] : name);
  if (command == nullptr) {
    if (help_asked && (name != "help" || args.empty())) {
      std::fputs(OverviewHelp(commands).c_str(), stdout);
      return kExitOk;
    }
    std::fprintf(stderr, "attnctl: unknown subcommand '%s' (run, bench, health, describe)\n",
                 (name == "help" ? args[0] : name).c_str());
    return kExitUsage;
  }
  if (help_asked) {
    std::fputs(CommandHelp(*command).c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<FlagSet> flags = ParseCommandFlags(command->flags, args);
  if (!flags.ok()) return UsageError(command->name, flags.status());
  return command->main(*flags);
}

}  // namespace
}  // namespace attnserve::attnctl

int main(int argc, char** argv) { return attnserve::attnctl::Main(argc, argv); }
