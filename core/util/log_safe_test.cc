#include "core/util/log_safe.h"

#include <string>

#include "core/util/json.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(SanitizeForLogTest, KeepsPrintableAsciiAndEscapesEverythingElse) {
  EXPECT_EQ(SanitizeForLog("req-42 ok"), "req-42 ok");
  EXPECT_EQ(SanitizeForLog("a\nb"), "a\\x0ab");
  EXPECT_EQ(SanitizeForLog("a\r\n2026-01-01 [info] forged"), "a\\x0d\\x0a2026-01-01 [info] forged");
  EXPECT_EQ(SanitizeForLog(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(SanitizeForLog("\x1b[31m"), "\\x1b[31m");
  EXPECT_EQ(SanitizeForLog("\x7f\x80\xff"), "\\x7f\\x80\\xff");
  // A backslash is escaped too, so "\x0a" written by the client cannot pass for an escape.
  EXPECT_EQ(SanitizeForLog("a\\x0ab"), "a\\\\x0ab");
  EXPECT_EQ(SanitizeForLog(""), "");
}

TEST(SanitizeForLogTest, TruncatesAndSaysHowLongTheInputWas) {
  EXPECT_EQ(SanitizeForLog("abcdef", 4), "abcd...(6 bytes)");
  EXPECT_EQ(SanitizeForLog("abcd", 4), "abcd");
  const std::string huge(1 << 20, '\n');
  const std::string out = SanitizeForLog(huge, 128);
  EXPECT_EQ(out.find('\n'), std::string::npos);
  EXPECT_LE(out.size(), 4 * 128 + 32);
  EXPECT_NE(out.find("...(1048576 bytes)"), std::string::npos) << out;
}

TEST(SanitizeForLogTest, OutputIsAlwaysPrintableAndBounded) {
  // Every byte value, alone and in a long run.
  for (int b = 0; b < 256; ++b) {
    const std::string s(300, static_cast<char>(b));
    const std::string out = SanitizeForLog(s, 100);
    EXPECT_EQ(FindUnprintable(out), std::string::npos) << "byte " << b;
    EXPECT_LE(out.size(), 4 * 100 + 32) << "byte " << b;
  }
}

TEST(LogValueTest, BareTokensStayBareOthersAreQuoted) {
  EXPECT_EQ(LogValue("req-5c1e09a2-000001"), "req-5c1e09a2-000001");
  EXPECT_EQ(LogValue(""), "\"\"");
  EXPECT_EQ(LogValue("x code=OK"), "\"x code=OK\"");
  EXPECT_EQ(LogValue("a=b"), "\"a=b\"");
  EXPECT_EQ(LogValue("say \"hi\""), "\"say \\\"hi\\\"\"");
  EXPECT_EQ(LogValue("a\nb"), "\"a\\x0ab\"");
  EXPECT_EQ(LogValue("back\\slash"), "\"back\\\\slash\"");
  EXPECT_EQ(LogValue("abcdef", 3), "\"abc...(6 bytes)\"");
}

TEST(FindUnprintableTest, FindsTheFirstOffendingByte) {
  EXPECT_EQ(FindUnprintable("abc"), std::string::npos);
  EXPECT_EQ(FindUnprintable("ab\tc"), 2u);
  EXPECT_EQ(FindUnprintable("\xc3\xa9"), 0u);
  EXPECT_EQ(FindUnprintable(" ~"), std::string::npos);
}

// JsonQuote (core/util/json.h) writes what the JSON log lines carry.
TEST(JsonQuoteTest, EscapesControlCharactersQuotesAndBackslashes) {
  EXPECT_EQ(JsonQuote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonQuote("l1\nl2\r\t"), "\"l1\\nl2\\u000d\\t\"");
  EXPECT_EQ(JsonQuote(std::string("\0\x1f", 2)), "\"\\u0000\\u001f\"");
}

TEST(JsonQuoteTest, KeepsWellFormedUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(JsonQuote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  EXPECT_EQ(JsonQuote("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(JsonQuote("a\xc3"), "\"a\\ufffd\"");                      // truncated sequence
  EXPECT_EQ(JsonQuote("\xc0\xaf"), "\"\\ufffd\\ufffd\"");             // overlong '/'
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  EXPECT_EQ(JsonQuote("\x80x"), "\"\\ufffdx\"");                      // stray continuation byte
}

}  // namespace
}  // namespace attnserve
