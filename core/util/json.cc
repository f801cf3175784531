#include "core/util/json.h"

#include <cmath>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/log_safe.h"

namespace attnserve {

Json Json::Object() {
  Json j;
  j.value_ = Members{};
  return j;
}

Json Json::Array() {
  Json j;
  j.value_ = Elements{};
  return j;
}

Json Json::Raw(std::string json) {
  Json j;
  j.value_ = RawText{std::move(json)};
  return j;
}

Json& Json::Set(std::string_view key, Json value) {
  Members& members = std::get<Members>(value_);
  for (auto& [k, v] : members) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  members.emplace_back(std::string(key), std::move(value));
  return *this;
}

Json& Json::Push(Json value) {
  std::get<Elements>(value_).push_back(std::move(value));
  return *this;
}

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      // JSON text is UTF-8: well-formed sequences pass, any other byte becomes U+FFFD.
      const size_t n = Utf8SequenceLength(s, i);
      if (n == 0) {
        out += "\\ufffd";
      } else {
        out.append(s.substr(i, n));
        i += n - 1;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void Json::DumpTo(std::string& out, int expand_depth, int level) const {
  const bool expand = level < expand_depth;
  const std::string inner = expand ? absl::StrCat("\n", std::string(2 * (level + 1), ' ')) : "";
  const std::string close = expand ? absl::StrCat("\n", std::string(2 * level, ' ')) : "";
  const char* separator = expand ? "," : ", ";
  if (const auto* members = std::get_if<Members>(&value_)) {
    out += "{";
    for (size_t i = 0; i < members->size(); ++i) {
      absl::StrAppend(&out, i ? separator : "", inner, JsonQuote((*members)[i].first), ": ");
      (*members)[i].second.DumpTo(out, expand_depth, level + 1);
    }
    absl::StrAppend(&out, members->empty() ? "" : close, "}");
  } else if (const auto* elements = std::get_if<Elements>(&value_)) {
    out += "[";
    for (size_t i = 0; i < elements->size(); ++i) {
      absl::StrAppend(&out, i ? separator : "", inner);
      (*elements)[i].DumpTo(out, expand_depth, level + 1);
    }
    absl::StrAppend(&out, elements->empty() ? "" : close, "]");
  } else if (const auto* d = std::get_if<double>(&value_)) {
    out += std::isfinite(*d) ? absl::StrFormat("%.6g", *d) : "null";
  } else if (const auto* i = std::get_if<int64_t>(&value_)) {
    absl::StrAppend(&out, *i);
  } else if (const auto* b = std::get_if<bool>(&value_)) {
    out += *b ? "true" : "false";
  } else if (const auto* s = std::get_if<std::string>(&value_)) {
    out += JsonQuote(*s);
  } else if (const auto* raw = std::get_if<RawText>(&value_)) {
    out += raw->text;
  } else {
    out += "null";
  }
}

std::string Json::Dump(int expand_depth) const {
  std::string out;
  DumpTo(out, expand_depth, 0);
  return out;
}

absl::Status WriteJsonFile(const std::string& path, const Json& json, int expand_depth) {
  std::ofstream f(path);
  f << json.Dump(expand_depth) << "\n";
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace attnserve
