#include "client/attnctl/flag_parser.h"

#include <algorithm>
#include <optional>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/util/flag_names.h"

namespace attnserve::attnctl {
namespace {

// What a malformed value of this flag should have looked like.
std::string ExpectedValue(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<int64_t>() || flag.IsOfType<int32_t>()) return "an integer";
  if (flag.IsOfType<double>()) return "a number";
  if (flag.IsOfType<absl::Duration>()) return "a duration such as 500ms, 30s or 5m";
  return "a valid value";
}

// `text` wrapped at `width` columns, every line after the first indented by `indent`.
std::string Wrap(absl::string_view text, size_t first_column, size_t indent, size_t width) {
  std::string out;
  size_t column = first_column;
  bool first_word = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first_word && column + 1 + word.size() > width) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
    } else if (!first_word) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    first_word = false;
  }
  return out;
}

}  // namespace

std::string DashedFlag(absl::string_view name) {
  std::string out = absl::StrCat("--", name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

absl::StatusOr<FlagSet> ParseCommandFlags(const std::vector<FlagUse>& accepted,
                                          const std::vector<std::string>& args, int max_operands) {
  FlagSet set;
  for (const FlagUse& use : accepted) {
    if (!use.default_text.empty()) {
      set.default_texts_[std::string(use.name)] = std::string(use.default_text);
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const bool operand = args[i].rfind("-", 0) != 0 && !args[i].empty();
    if (operand && static_cast<int>(set.operands_.size()) < max_operands) {
      set.operands_.push_back(args[i]);
      continue;
    }
    if (args[i].rfind("--", 0) != 0 || args[i].size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
    }
    // --chunk-bytes and --chunk_bytes name the same absl flag, chunk_bytes.
    const std::string arg = FlagArgWithUnderscores(args[i]);
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::optional<std::string> value;
    if (eq != std::string::npos) value = arg.substr(eq + 1);
    const bool known = std::any_of(accepted.begin(), accepted.end(),
                                   [&](const FlagUse& use) { return use.name == name; });
    absl::CommandLineFlag* flag = known ? absl::FindCommandLineFlag(name) : nullptr;
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", DashedFlag(name)));
    }
    if (flag->IsOfType<bool>()) {
      if (value && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(absl::StrCat(DashedFlag(name), " takes no value"));
      }
      value = value.value_or("true");
    } else if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(DashedFlag(name), " needs a value"));
      }
      value = args[++i];
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(DashedFlag(name), ": expected ",
                                                     ExpectedValue(*flag), ", got '", *value,
                                                     "'"));
    }
    set.present_.insert(name);
  }
  return set;
}

std::string FlagsHelp(const std::vector<FlagUse>& flags) {
  constexpr size_t kHelpColumn = 26;
  constexpr size_t kWidth = 99;
  std::string out;
  for (const FlagUse& use : flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(use.name);
    if (flag == nullptr) continue;  // a FlagUse without its ABSL_FLAG: nothing to describe
    std::string left = absl::StrCat("  ", DashedFlag(use.name));
    if (!use.value_name.empty()) absl::StrAppend(&left, " ", use.value_name);
    if (left.size() + 2 > kHelpColumn) {
      absl::StrAppend(&left, "\n");
      left.append(kHelpColumn, ' ');
    } else {
      left.resize(kHelpColumn, ' ');
    }
    std::string help = flag->Help();
    const std::string default_text =
        use.default_text.empty() ? flag->DefaultValue() : std::string(use.default_text);
    if (!flag->IsOfType<bool>() && !default_text.empty() && default_text != "-") {
      absl::StrAppend(&help, " (default ", default_text, ")");
    }
    absl::StrAppend(&out, left, Wrap(help, kHelpColumn, kHelpColumn, kWidth), "\n");
  }
  return out;
}

absl::StatusOr<int64_t> IntAtLeast(const absl::Flag<int64_t>& flag, int64_t min) {
  const int64_t v = absl::GetFlag(flag);
  if (v < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(DashedFlag(absl::GetFlagReflectionHandle(flag).Name()),
                     ": expected an integer >= ", min, ", got ", v));
  }
  return v;
}

absl::StatusOr<double> NonNegative(const absl::Flag<double>& flag) {
  const double v = absl::GetFlag(flag);
  if (!(v >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(DashedFlag(absl::GetFlagReflectionHandle(flag).Name()),
                     ": expected a number >= 0, got ", v));
  }
  return v;
}

absl::StatusOr<absl::Duration> PositiveDuration(const absl::Flag<absl::Duration>& flag) {
  const absl::Duration d = absl::GetFlag(flag);
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        DashedFlag(absl::GetFlagReflectionHandle(flag).Name()),
        ": expected a positive duration such as 500ms, 30s or 5m, got ", absl::FormatDuration(d)));
  }
  return d;
}

absl::StatusOr<std::vector<int64_t>> IntList(absl::string_view name, absl::string_view text,
                                             int64_t min, int64_t max) {
  std::vector<int64_t> values;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v) || v < min || v > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(DashedFlag(name), ": expected a comma-separated list of integers ", min,
                       "..", max, " such as 1,2,4,8, got '", text, "'"));
    }
    values.push_back(v);
  }
  return values;
}

absl::StatusOr<std::vector<double>> PositiveList(absl::string_view name, absl::string_view text,
                                                 double max) {
  std::vector<double> values;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(item, &v) || !(v > 0) || v > max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: expected a comma-separated list of numbers > 0 and <= %g such as 10,20.5, got "
          "'%s'",
          DashedFlag(name), max, text));
    }
    values.push_back(v);
  }
  return values;
}

}  // namespace attnserve::attnctl
