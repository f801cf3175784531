#include "core/util/flag_names.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace attnserve {
namespace {

// Nested flagfiles deeper than this are left to absl (a file that names itself stops here).
constexpr int kMaxFlagfileDepth = 8;

// The flags of a flagfile, as absl reads it: one flag a line, surrounding whitespace dropped,
// blank lines and lines starting with '#' skipped. nullopt when the file cannot be read or holds
// a line absl would refuse (a positional argument, "--"): absl then reads it and says why.
std::optional<std::vector<std::string>> FlagfileFlags(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::vector<std::string> flags;
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view flag = absl::StripAsciiWhitespace(line);
    if (flag.empty() || flag[0] == '#') continue;
    if (flag[0] != '-' || flag == "--") return std::nullopt;
    flags.emplace_back(flag);
  }
  return flags;
}

// "--flagfile=a,b" or "-flagfile=a,b" -> "a,b".
std::optional<std::string> FlagfileValue(absl::string_view arg) {
  absl::ConsumePrefix(&arg, "-");
  absl::ConsumePrefix(&arg, "-");
  if (!absl::ConsumePrefix(&arg, "flagfile=")) return std::nullopt;
  return std::string(arg);
}

bool IsBareFlagfile(absl::string_view arg) { return arg == "--flagfile" || arg == "-flagfile"; }

// `text` in lines of at most `width` columns, each starting with `indent` spaces.
std::string Wrapped(absl::string_view text, size_t indent, size_t width) {
  std::string out;
  std::string line(indent, ' ');
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > indent && line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, line, "\n");
      line.assign(indent, ' ');
    }
    absl::StrAppend(&line, line.size() > indent ? " " : "", word);
  }
  if (line.size() > indent) absl::StrAppend(&out, line, "\n");
  return out;
}

}  // namespace

std::string FlagArgWithUnderscores(absl::string_view arg) {
  std::string out(arg);
  if (out.size() < 3 || out.compare(0, 2, "--") != 0) return out;
  const size_t end = std::min(out.find('='), out.size());
  std::replace(out.begin() + 2, out.begin() + end, '-', '_');
  return out;
}

std::string DashedFlagName(absl::string_view name) {
  std::string out = absl::StrCat("--", name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

std::string DashedFlagsHelp(absl::string_view file_part) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), file_part)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out;
  for (const absl::CommandLineFlag* flag : flags) {
    std::string value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) value = absl::StrCat("\"", value, "\"");
    absl::StrAppend(&out, "  ", DashedFlagName(flag->Name()), " (default ", value, ")\n",
                    Wrapped(flag->Help(), 6, 99));
  }
  return out;
}

UnderscoredArgv::UnderscoredArgv(int argc, char** argv) {
  std::vector<std::string> flags;
  int i = 0;
  for (; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (i == 0) {
      args_.emplace_back(arg);
    } else if (arg == "--") {
      break;
    } else {
      flags.emplace_back(arg);
    }
  }
  AddFlags(flags, /*depth=*/0);
  // Arguments after a bare "--" are positional and stay as they are.
  for (; i < argc; ++i) args_.emplace_back(argv[i]);
  for (std::string& a : args_) pointers_.push_back(a.data());
  pointers_.push_back(nullptr);
}

void UnderscoredArgv::AddFlags(const std::vector<std::string>& flags, int depth) {
  for (size_t i = 0; i < flags.size(); ++i) {
    std::optional<std::string> files = FlagfileValue(flags[i]);
    if (!files && IsBareFlagfile(flags[i]) && i + 1 < flags.size()) files = flags[++i];
    if (!files || files->empty()) {
      args_.push_back(FlagArgWithUnderscores(flags[i]));
      continue;
    }
    for (absl::string_view path : absl::StrSplit(*files, ',', absl::SkipEmpty())) {
      std::optional<std::vector<std::string>> inner;
      if (depth < kMaxFlagfileDepth) inner = FlagfileFlags(std::string(path));
      if (inner) {
        AddFlags(*inner, depth + 1);
      } else {
        args_.push_back(absl::StrCat("--flagfile=", path));
      }
    }
  }
}

}  // namespace attnserve
