// Dashed flag names on the command line (--head-dim, --metrics-listen) for absl flags, whose
// names cannot contain '-'. Shared by the command-line tools of this project (attnserve,
// attnctl, the benches).
#ifndef ATTNSERVE_CORE_UTIL_FLAG_NAMES_H_
#define ATTNSERVE_CORE_UTIL_FLAG_NAMES_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace attnserve {

// "--head-dim=64" -> "--head_dim=64", "--chunk-bytes" -> "--chunk_bytes": only the name part of
// an argument that starts with "--" changes; values ("--spec={"a-b": 1}"), positional arguments,
// "-h" and "--" come back unchanged.
std::string FlagArgWithUnderscores(absl::string_view arg);

// How users type a flag: "metrics_listen" -> "--metrics-listen".
std::string DashedFlagName(absl::string_view name);

// Help for the flags defined in source files whose path contains `file_part` (e.g.
// "server/main.cc"), sorted by name, spelled with dashes as users type them:
//   --metrics-listen (default "0.0.0.0:9464")
//       Prometheus /metrics address host:port (port 0: a free port); empty disables it
// absl's own --helpfull lists them with underscores.
std::string DashedFlagsHelp(absl::string_view file_part);

// argv with every flag name rewritten by FlagArgWithUnderscores, for absl::ParseCommandLine.
// Flagfiles (--flagfile=FILE[,FILE], --flagfile FILE, nested ones too) are read here and their
// flags put in place of the --flagfile argument, rewritten the same way, so that a flagfile may
// spell names with dashes as well; a file that cannot be read or that absl would refuse stays a
// --flagfile argument for absl to report. Arguments after a bare "--" are positional and stay as
// they are. The object owns the strings that argv() points into: keep it alive while the
// pointers are used.
class UnderscoredArgv {
 public:
  UnderscoredArgv(int argc, char** argv);
  UnderscoredArgv(const UnderscoredArgv&) = delete;
  UnderscoredArgv& operator=(const UnderscoredArgv&) = delete;

  int argc() const { return static_cast<int>(args_.size()); }
  // Null-terminated, like main's argv.
  char** argv() { return pointers_.data(); }

 private:
  void AddFlags(const std::vector<std::string>& flags, int depth);

  std::vector<std::string> args_;
  std::vector<char*> pointers_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_FLAG_NAMES_H_
