// Client-supplied text (request ids, context and region names, error messages that quote them)
// made safe to put on a log line: one line per event, however hostile the input. Every place
// that logs or echoes such text goes through these helpers.
#ifndef ATTNSERVE_CORE_UTIL_LOG_SAFE_H_
#define ATTNSERVE_CORE_UTIL_LOG_SAFE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace attnserve {

// The most input bytes one client-supplied field contributes to a log line by default.
inline constexpr size_t kMaxLoggedFieldBytes = 256;

// `s` rendered with nothing but printable ASCII: bytes 0x20..0x7e are kept except '\' (written
// "\\"), every other byte is written "\xNN". When `s` is longer than `max_bytes`, only its first
// `max_bytes` bytes are rendered, followed by "...(N bytes)" with N the full size. The result
// therefore never holds a newline or another control character and is at most
// 4 * max_bytes + 32 bytes long.
std::string SanitizeForLog(std::string_view s, size_t max_bytes = kMaxLoggedFieldBytes);

// `s` as the value of a key=value pair on a text log line: bare when it is a non-empty run of
// visible ASCII (0x21..0x7e) without '"', '\' or '=', else in double quotes with '"' written
// \" and the rest as SanitizeForLog. So a value can neither start a new line nor pose as
// another key=value pair.
std::string LogValue(std::string_view s, size_t max_bytes = kMaxLoggedFieldBytes);

// The length of the well-formed UTF-8 sequence starting at s[i], or 0 when there is none (a
// stray continuation byte, a truncated sequence, an overlong form, a surrogate, a code point
// above U+10FFFF). An ASCII byte is a sequence of 1.
size_t Utf8SequenceLength(std::string_view s, size_t i);
// Whether `s` is well-formed UTF-8 (what protobuf requires of a proto3 string field).
bool IsValidUtf8(std::string_view s);

// The offset of the first byte of `s` outside printable ASCII (0x20..0x7e), or npos.
size_t FindUnprintable(std::string_view s);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_LOG_SAFE_H_
