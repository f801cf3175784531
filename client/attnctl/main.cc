// attnctl: command-line client of attnserve. `attnctl help` lists the subcommands, every flag and
// the exit codes; `attnctl <command> --help` one subcommand's flags. The context commands form a
// group: `attnctl context create NAME ...` (`attnctl context --help` lists them).
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/attnctl/common.h"

namespace attnserve::attnctl {
namespace {

constexpr absl::string_view kContextGroup = "context";

std::vector<Command> Commands() {
  std::vector<Command> commands = {RunCommand(), BenchCommand(), HealthCommand(),
                                   DescribeCommand()};
  for (Command& c : ContextCommands()) commands.push_back(std::move(c));
  return commands;
}

const Command* FindCommand(const std::vector<Command>& commands, absl::string_view name) {
  for (const Command& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

bool InContextGroup(const Command& c) {
  return absl::StartsWith(c.name, absl::StrCat(kContextGroup, " "));
}

// The subcommands' --timeout defaults side by side, from their flags: the flag's own default,
// then each other default with the subcommands that have it ("5m; health 5s; describe, ... 10s").
std::string TimeoutDefaults(const std::vector<Command>& commands) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag("timeout");
  const std::string base = flag == nullptr ? "" : flag->DefaultValue();
  std::vector<std::pair<std::string, std::vector<std::string>>> others;  // default, commands
  for (const Command& c : commands) {
    for (const FlagUse& use : c.flags) {
      if (use.name != "timeout" || use.default_text.empty() || use.default_text == base) continue;
      auto it = std::find_if(others.begin(), others.end(),
                             [&](const auto& o) { return o.first == use.default_text; });
      if (it == others.end()) it = others.insert(others.end(), {std::string(use.default_text), {}});
      it->second.emplace_back(c.name);
    }
  }
  std::string out = base;
  for (const auto& [text, names] : others) {
    absl::StrAppend(&out, "; ", absl::StrJoin(names, ", "), " ", text);
  }
  return out;
}

// Every subcommand's usage and summary, then every flag once, then the exit codes.
std::string OverviewHelp(const std::vector<Command>& commands) {
  std::string usage = "attnctl: command-line client of attnserve.\n\nUsage:\n";
  std::string summaries;
  const std::string timeout_defaults = TimeoutDefaults(commands);
  std::vector<FlagUse> flags;
  for (const Command& c : commands) {
    absl::StrAppend(&usage, "  attnctl ", c.synopsis, "\n");
    absl::StrAppend(
        &summaries, c.name, ":\n  ",
        absl::StrReplaceAll(absl::StripTrailingAsciiWhitespace(c.summary), {{"\n", "\n  "}}),
        "\n\n");
    for (const FlagUse& use : c.flags) {
      const bool listed = std::any_of(flags.begin(), flags.end(),
                                      [&](const FlagUse& f) { return f.name == use.name; });
      if (listed) continue;
      flags.push_back(use);
      // The subcommands' own defaults, side by side.
      if (use.name == "timeout") flags.back().default_text = timeout_defaults;
    }
  }
  absl::StrAppend(&usage, "  attnctl help [COMMAND]    (or attnctl COMMAND --help)\n\n", summaries);
  absl::StrAppend(&usage, "Flags (each subcommand takes those its usage line shows):\n",
                  FlagsHelp(flags), "\n", kExitCodesHelp);
  return usage;
}

// `attnctl context --help`: the group's usage lines and summaries.
std::string ContextGroupHelp(const std::vector<Command>& commands) {
  std::string usage = "Usage:\n";
  std::string summaries;
  for (const Command& c : commands) {
    if (!InContextGroup(c)) continue;
    absl::StrAppend(&usage, "  attnctl ", c.synopsis, "\n");
    absl::StrAppend(
        &summaries, c.name, ":\n  ",
        absl::StrReplaceAll(absl::StripTrailingAsciiWhitespace(c.summary), {{"\n", "\n  "}}),
        "\n\n");
  }
  return absl::StrCat(usage,
                      "\nContexts are K and V rows the server keeps between requests, so that a "
                      "decode step\nsends only its query rows.\n\n",
                      summaries, "attnctl context COMMAND --help lists a command's flags.\n");
}

std::string ContextCommandNames(const std::vector<Command>& commands) {
  std::vector<std::string> names;
  for (const Command& c : commands) {
    if (InContextGroup(c)) names.emplace_back(c.name.substr(kContextGroup.size() + 1));
  }
  return absl::StrJoin(names, ", ");
}

bool IsHelp(absl::string_view arg) { return arg == "--help" || arg == "-h"; }

int Main(int argc, char** argv) {
  const std::vector<Command> commands = Commands();
  if (argc < 2) {
    std::fputs(OverviewHelp(commands).c_str(), stderr);
    return kExitUsage;
  }
  std::vector<std::string> words(argv + 1, argv + argc);
  // "attnctl help X" and "attnctl X --help" (-h) ask for X's help.
  const bool help_command = words[0] == "help";
  if (help_command) words.erase(words.begin());
  const bool help_flag = std::any_of(words.begin(), words.end(), IsHelp);
  words.erase(std::remove_if(words.begin(), words.end(), IsHelp), words.end());
  const bool help_asked = help_command || help_flag;
  if (words.empty()) {  // attnctl help, attnctl --help
    std::fputs(OverviewHelp(commands).c_str(), stdout);
    return kExitOk;
  }
  std::string name = words[0];
  words.erase(words.begin());
  if (name == kContextGroup) {
    if (words.empty() || words[0].rfind("-", 0) == 0) {  // no context subcommand named
      const std::string help = ContextGroupHelp(commands);
      if (help_asked) {
        std::fputs(help.c_str(), stdout);
        return kExitOk;
      }
      std::fprintf(stderr,
                   "attnctl: context: name a subcommand (%s); attnctl context --help describes "
                   "them\n",
                   ContextCommandNames(commands).c_str());
      return kExitUsage;
    }
    name = absl::StrCat(kContextGroup, " ", words[0]);
    words.erase(words.begin());
  }
  const Command* command = FindCommand(commands, name);
  if (command == nullptr) {
    if (help_flag && !help_command) {
      std::fputs(OverviewHelp(commands).c_str(), stdout);
      return kExitOk;
    }
    if (absl::StartsWith(name, absl::StrCat(kContextGroup, " "))) {
      std::fprintf(stderr, "attnctl: unknown context subcommand '%s' (%s)\n",
                   name.substr(kContextGroup.size() + 1).c_str(),
                   ContextCommandNames(commands).c_str());
    } else {
      std::fprintf(stderr,
                   "attnctl: unknown subcommand '%s' (run, bench, health, describe, context)\n",
                   name.c_str());
    }
    return kExitUsage;
  }
  if (help_asked) {
    std::fputs(CommandHelp(*command).c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<FlagSet> flags = ParseCommandFlags(command->flags, words, command->operands);
  if (!flags.ok()) return UsageError(command->name, flags.status());
  return command->main(*flags);
}

}  // namespace
}  // namespace attnserve::attnctl

int main(int argc, char** argv) { return attnserve::attnctl::Main(argc, argv); }
