// Per-subcommand command lines over absl flags. absl flags are process-global, so each
// subcommand names the flags it accepts (FlagUse); ParseCommandFlags sets those flags from the
// subcommand's arguments and refuses the others, and FlagsHelp lists them. Values are parsed by
// absl (absl::CommandLineFlag::ParseFrom); this layer only finds the flag of each argument, so
// that a usage error is reported (exit code 2, see common.h) instead of ending the process the
// way absl::ParseCommandLine does.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_FLAG_PARSER_H_
#define ATTNSERVE_CLIENT_ATTNCTL_FLAG_PARSER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnserve::attnctl {

// One flag a subcommand accepts.
struct FlagUse {
  // The absl name ("chunk_bytes"); the command line spells it --chunk-bytes or --chunk_bytes.
  absl::string_view name;
  // What the value looks like in help ("HOST:PORT"); empty for boolean flags.
  absl::string_view value_name;
  // Shown as the default instead of the flag's own, for a subcommand whose default differs (its
  // code applies that default when the flag is absent: FlagSet::Has); "-" shows none (a required
  // flag, or one whose absence means something its help says).
  absl::string_view default_text = {};
};

// The flags given on one command line.
class FlagSet {
 public:
  // True when the flag (absl name) was on the command line, even with its default value.
  bool Has(absl::string_view name) const { return present_.count(std::string(name)) > 0; }
  // The default the subcommand's help shows for the flag (its FlagUse::default_text; "" when it
  // keeps the flag's own).
  std::string DefaultText(absl::string_view name) const {
    const auto it = default_texts_.find(std::string(name));
    return it == default_texts_.end() ? "" : it->second;
  }
  // The arguments that are not flags (a context's NAME), in command-line order.
  const std::vector<std::string>& operands() const { return operands_; }

 private:
  friend absl::StatusOr<FlagSet> ParseCommandFlags(const std::vector<FlagUse>& accepted,
                                                   const std::vector<std::string>& args,
                                                   int max_operands);
  std::set<std::string> present_;
  std::map<std::string, std::string> default_texts_;
  std::vector<std::string> operands_;
};

// Parses "--name value", "--name=value" and bare boolean "--name" (or "--name=true|false") for
// the flags in `accepted`, dashes or underscores in the name, and up to `max_operands` arguments
// that are not flags (before, between or after the flags). INVALID_ARGUMENT naming the argument
// for anything else: a positional argument past `max_operands`, an unknown flag, a missing or
// malformed value. Flags not given keep their defaults.
absl::StatusOr<FlagSet> ParseCommandFlags(const std::vector<FlagUse>& accepted,
                                          const std::vector<std::string>& args,
                                          int max_operands = 0);

// "  --chunk-bytes N   <help> (default 4194304)" for each flag, wrapped for a terminal.
std::string FlagsHelp(const std::vector<FlagUse>& flags);

// The command-line spelling of an absl flag name: "chunk_bytes" -> "--chunk-bytes".
std::string DashedFlag(absl::string_view name);

// A flag's value checked against the bound its subcommand needs; INVALID_ARGUMENT
// "--requests: expected an integer >= 1, got 0" otherwise.
absl::StatusOr<int64_t> IntAtLeast(const absl::Flag<int64_t>& flag, int64_t min);
absl::StatusOr<double> NonNegative(const absl::Flag<double>& flag);
absl::StatusOr<absl::Duration> PositiveDuration(const absl::Flag<absl::Duration>& flag);

// A comma-separated list given to the flag named `name` (absl name): "1,2,4" -> {1, 2, 4}, each
// an integer in [min, max]; INVALID_ARGUMENT "--concurrency: expected a comma-separated list of
// integers 1..1024 such as 1,2,4,8, got '1,,2'" otherwise (also for an empty list).
absl::StatusOr<std::vector<int64_t>> IntList(absl::string_view name, absl::string_view text,
                                             int64_t min, int64_t max);
// The same for numbers in (0, max]: "10,20.5" -> {10, 20.5}.
absl::StatusOr<std::vector<double>> PositiveList(absl::string_view name, absl::string_view text,
                                                 double max);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_FLAG_PARSER_H_
