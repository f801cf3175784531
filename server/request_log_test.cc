#include "server/request_log.h"

#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace attnserve {
namespace {

LogEvent HostileEvent() {
  LogEvent e("attend");
  e.Str("id", "evil\n[2026-01-01] [info] forged");
  e.Str("plain", "req-1");
  e.Str("spaced", "x code=OK \"q\" \\");
  e.Int("bytes_in", 42);
  e.Seconds("total", 1.5);
  e.Custom("shape", "[1,2,3/1,4]", "shape", "[1,2,3,1,4]");
  e.Str("long", std::string(300, 'z'), 8);
  return e;
}

TEST(LogEventTest, TextQuotesAndEscapesClientText) {
  EXPECT_EQ(HostileEvent().Text(),
            "attend id=\"evil\\x0a[2026-01-01] [info] forged\" plain=req-1 "
            "spaced=\"x code=OK \\\"q\\\" \\\\\" bytes_in=42 total=1.500s shape=[1,2,3/1,4] "
            "long=\"zzzzzzzz...(300 bytes)\"");
}

TEST(LogEventTest, JsonMembersAreEscapedAndTyped) {
  EXPECT_EQ(HostileEvent().JsonMembers(),
            "\"id\":\"evil\\\\x0a[2026-01-01] [info] forged\",\"plain\":\"req-1\","
            "\"spaced\":\"x code=OK \\\"q\\\" \\\\\\\\\",\"bytes_in\":42,"
            "\"total_seconds\":1.500000,\"shape\":[1,2,3,1,4],"
            "\"long\":\"zzzzzzzz...(300 bytes)\"");
}

// The installed formats, through spdlog's default logger writing to a string.
TEST(LogFormatTest, JsonLinesAreOneObjectEachAndTextIsUnchanged) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  const std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);

  SetLogFormat(LogFormat::kJson);
  HostileEvent().Log(spdlog::level::warn);
  spdlog::info("plain \"message\"\twith\ncontrol \xff bytes");
  const std::string json = out.str();
  out.str("");
  SetLogFormat(LogFormat::kText);
  HostileEvent().Log(spdlog::level::info);
  const std::string text = out.str();
  spdlog::set_default_logger(previous);

  // Two lines, each one object: time, level, message first.
  const size_t first_end = json.find('\n');
  ASSERT_NE(first_end, std::string::npos);
  ASSERT_EQ(json.find('\n', first_end + 1), json.size() - 1) << json;
  const std::string line1 = json.substr(0, first_end);
  const std::string line2 = json.substr(first_end + 1, json.size() - first_end - 2);
  EXPECT_EQ(line1.rfind("{\"time\":\"", 0), 0u) << line1;
  EXPECT_NE(line1.find("Z\",\"level\":\"warning\",\"message\":\"attend\",\"id\":\"evil\\\\x0a"),
            std::string::npos)
      << line1;
  EXPECT_EQ(line1.back(), '}');
  EXPECT_NE(line2.find("\"level\":\"info\",\"message\":\"plain \\\"message\\\"\\twith\\ncontrol "
                       "\\ufffd bytes\"}"),
            std::string::npos)
      << line2;
  // Text: spdlog's default pattern, then the event's text.
  EXPECT_NE(text.find("] [info] attend id=\"evil\\x0a[2026-01-01] [info] forged\" plain=req-1"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
}

TEST(LogFormatTest, ParsesTheFlag) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  absl::StatusOr<LogFormat> bad = ParseLogFormat("xml\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--log-format: must be text or json, got \"xml\\x0a\"");
}

}  // namespace
}  // namespace attnserve
