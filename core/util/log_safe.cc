#include "core/util/log_safe.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnserve {
namespace {

bool Printable(unsigned char c) { return c >= 0x20 && c <= 0x7e; }

void AppendEscaped(std::string_view s, bool escape_quote, std::string* out) {
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      *out += "\\\\";
    } else if (escape_quote && c == '"') {
      *out += "\\\"";
    } else if (Printable(c)) {
      *out += ch;
    } else {
      absl::StrAppendFormat(out, "\\x%02x", c);
    }
  }
}

std::string Render(std::string_view s, size_t max_bytes, bool escape_quote) {
  const bool cut = s.size() > max_bytes;
  std::string out;
  out.reserve(std::min(s.size(), max_bytes) + 16);
  AppendEscaped(cut ? s.substr(0, max_bytes) : s, escape_quote, &out);
  if (cut) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

}  // namespace

std::string SanitizeForLog(std::string_view s, size_t max_bytes) {
  return Render(s, max_bytes, /*escape_quote=*/false);
}

std::string LogValue(std::string_view s, size_t max_bytes) {
  bool bare = !s.empty() && s.size() <= max_bytes;
  for (size_t i = 0; bare && i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    bare = c > 0x20 && c <= 0x7e && c != '"' && c != '\\' && c != '=';
  }
  if (bare) return std::string(s);
  return absl::StrCat("\"", Render(s, max_bytes, /*escape_quote=*/true), "\"");
}

size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((at(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (at(i + k) & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff)) {
    return 0;
  }
  return n;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t FindUnprintable(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (!Printable(static_cast<unsigned char>(s[i]))) return i;
  }
  return std::string_view::npos;
}

}  // namespace attnserve
