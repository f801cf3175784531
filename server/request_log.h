// The server's log lines: text (spdlog's default pattern) or JSON (one object per line), and the
// one line each finished call writes (LogEvent). Client-supplied text on a line is always
// sanitized (core/util/log_safe.h): a request can neither start a new line nor make one huge.
#ifndef ATTNSERVE_SERVER_REQUEST_LOG_H_
#define ATTNSERVE_SERVER_REQUEST_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "spdlog/spdlog.h"

namespace attnserve {

enum class LogFormat { kText, kJson };

// A spec as the request line shows it: "dense", "block_sparse/random/b64+causal", ...
std::string SpecSummary(const AttentionSpec& spec);

// "text" or "json"; INVALID_ARGUMENT naming --log-format otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

// Installs `format` on spdlog's default logger. kJson: every line is one JSON object,
// {"time": "2026-01-02T03:04:05.123456Z", "level": "info", "message": "...", ...}, with a
// request line's fields (LogEvent) as further members.
void SetLogFormat(LogFormat format);

// One event (a finished call) with its fields, in the order added. Text:
//   attend id=req-1 code=OK ... error="..."
// (values that are not a plain token are double-quoted, see LogValue); JSON: "message" is the
// event name and each field is a member.
class LogEvent {
 public:
  explicit LogEvent(std::string event) : event_(std::move(event)) {}

  // Text from the client or quoting it (ids, names, error messages): sanitized and cut to
  // `max_bytes` (SanitizeForLog). JSON: a string.
  LogEvent& Str(std::string_view key, std::string_view value, size_t max_bytes = 256);
  // An integer (JSON: a number).
  LogEvent& Int(std::string_view key, int64_t value);
  // Seconds: text "key=0.123s", JSON "key_seconds": 0.123456.
  LogEvent& Seconds(std::string_view key, double seconds);
  // A field with different text and JSON forms; `json` must be valid JSON, `text` a safe value.
  LogEvent& Custom(std::string_view text_key, std::string text, std::string_view json_key,
                   std::string json);

  std::string Text() const;
  // The JSON members without braces: "\"k\":v,\"k2\":v2".
  std::string JsonMembers() const;
  // Writes the event at `level` in the installed format.
  void Log(spdlog::level::level_enum level) const;

 private:
  struct Field {
    std::string text_key, text, json_key, json;
  };
  std::string event_;
  std::vector<Field> fields_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REQUEST_LOG_H_
