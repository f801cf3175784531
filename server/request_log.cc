#include "server/request_log.h"

#include <atomic>
#include <memory>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "core/util/json.h"
#include "core/util/log_safe.h"
#include "spdlog/formatter.h"

namespace attnserve {

std::string SpecSummary(const AttentionSpec& spec) {
  std::string s(PatternName(spec.pattern));
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    absl::StrAppend(&s, "/", std::string(GeneratorName(bs->generator)), "/b", bs->block_size);
  }
  if (spec.causal) absl::StrAppend(&s, "+causal");
  return s;
}
namespace {

// A LogEvent's payload in JSON mode: kMark, its JSON members, kMark, the message. No other
// payload starts with kMark: server messages are our own text, and client text in them is
// sanitized (no control characters).
constexpr char kMark = '\x1e';

std::atomic<LogFormat> g_format{LogFormat::kText};

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string_view payload(msg.payload.data(), msg.payload.size());
    std::string_view members;
    if (!payload.empty() && payload.front() == kMark) {
      const size_t end = payload.find(kMark, 1);
      if (end != std::string_view::npos) {
        members = payload.substr(1, end - 1);
        payload = payload.substr(end + 1);
      }
    }
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    std::string line = absl::StrCat(
        "{\"time\":\"",
        absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::FromChrono(msg.time), absl::UTCTimeZone()),
        "\",\"level\":", JsonQuote(std::string_view(level.data(), level.size())),
        ",\"message\":", JsonQuote(payload), members.empty() ? "" : ",", std::string(members),
        "}\n");
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// A sanitized value (printable ASCII, '\' already doubled) on a text line: bare when it is a
// plain token, else quoted with '"' escaped.
std::string TextValue(const std::string& sanitized) {
  bool bare = !sanitized.empty();
  for (const char c : sanitized) {
    bare = bare && c != ' ' && c != '"' && c != '\\' && c != '=';
  }
  if (bare) return sanitized;
  std::string out = "\"";
  for (const char c : sanitized) {
    if (c == '"') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-format: must be text or json, got \"", SanitizeForLog(name, 64), "\""));
}

void SetLogFormat(LogFormat format) {
  g_format.store(format);
  if (format == LogFormat::kJson) {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  } else {
    spdlog::set_pattern("%+");  // spdlog's default
  }
}

LogEvent& LogEvent::Str(std::string_view key, std::string_view value, size_t max_bytes) {
  const std::string safe = SanitizeForLog(value, max_bytes);
  fields_.push_back({std::string(key), TextValue(safe), std::string(key), JsonQuote(safe)});
  return *this;
}

LogEvent& LogEvent::Int(std::string_view key, int64_t value) {
  fields_.push_back({std::string(key), absl::StrCat(value), std::string(key), absl::StrCat(value)});
  return *this;
}

LogEvent& LogEvent::Seconds(std::string_view key, double seconds) {
  fields_.push_back({std::string(key), absl::StrFormat("%.3fs", seconds),
                     absl::StrCat(std::string(key), "_seconds"), absl::StrFormat("%.6f", seconds)});
  return *this;
}

LogEvent& LogEvent::Custom(std::string_view text_key, std::string text, std::string_view json_key,
                           std::string json) {
  fields_.push_back(
      {std::string(text_key), std::move(text), std::string(json_key), std::move(json)});
  return *this;
}

std::string LogEvent::Text() const {
  std::string out = event_;
  for (const Field& f : fields_) absl::StrAppend(&out, " ", f.text_key, "=", f.text);
  return out;
}

std::string LogEvent::JsonMembers() const {
  std::string out;
  for (const Field& f : fields_) {
    absl::StrAppend(&out, out.empty() ? "" : ",", JsonQuote(f.json_key), ":", f.json);
  }
  return out;
}

void LogEvent::Log(spdlog::level::level_enum level) const {
  if (!spdlog::should_log(level)) return;
  if (g_format.load() == LogFormat::kJson) {
    spdlog::log(level, "{}",
                absl::StrCat(std::string(1, kMark), JsonMembers(), std::string(1, kMark), event_));
  } else {
    spdlog::log(level, "{}", Text());
  }
}

}  // namespace attnserve
