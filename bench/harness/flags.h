// Command-line parsing shared by the bench binaries: absl flags, spelled with dashes or
// underscores. Each binary defines its own flags (ABSL_FLAG) in its main file, so that a library
// linked into two binaries never drags one binary's flags into the other.
#ifndef ATTNSERVE_BENCH_HARNESS_FLAGS_H_
#define ATTNSERVE_BENCH_HARNESS_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::bench {

// Flags keep the spellings the scripts and docs use (--head-dim, --memory-budget-gib, and the
// older --max_run_s); absl names cannot hold '-', so flag names are rewritten to underscores
// before parsing (core/util/flag_names.h, as attnserve and attnctl do). Handles
// --help (lists the flags of bench/ files), exits with absl's message on an unknown flag or a bad
// value, and returns INVALID_ARGUMENT for positional arguments, which no bench takes. `usage` is
// the first line(s) of --help. Call once, first thing in main.
absl::Status ParseBenchFlags(int argc, char** argv, absl::string_view usage);

// A bench binary's main: ParseBenchFlags, then `run`; a failure is printed as "NAME: status" on
// stderr and gives exit code 1, success 0.
int BenchMain(int argc, char** argv, absl::string_view usage, absl::string_view name,
              absl::Status (*run)());

// The command line as given (before the rewrite), arguments with spaces, quotes or braces in
// single quotes, for the results' "command" field. Empty before ParseBenchFlags.
const std::string& BenchCommandLine();

// `args` joined by spaces, those with spaces, quotes or braces in single quotes: how
// BenchCommandLine writes a command line (attnctl bench writes its own with it).
std::string ShellCommandLine(const std::vector<std::string>& args);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_HARNESS_FLAGS_H_
