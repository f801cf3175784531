// The project's one JSON writer (bench results, attnctl's reports): a small ordered value tree
// (objects keep their insertion order, so result files read in the order fields are added) and
// Dump, which writes it. Doubles print with 6 significant digits (%.6g), the precision of every
// result file in bench/results/, and non-finite ones as null; integers print exactly.
#ifndef ATTNSERVE_CORE_UTIL_JSON_H_
#define ATTNSERVE_CORE_UTIL_JSON_H_

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace attnserve {

class Json {
 public:
  Json() : value_(nullptr) {}  // null
  Json(std::nullptr_t) : value_(nullptr) {}
  Json(bool b) : value_(b) {}
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Json(T i) : value_(static_cast<int64_t>(i)) {}
  Json(double d) : value_(d) {}
  Json(std::string s) : value_(std::move(s)) {}
  Json(std::string_view s) : value_(std::string(s)) {}
  Json(const char* s) : value_(std::string(s)) {}

  static Json Object();
  static Json Array();
  // Text that already is JSON (e.g. a spec from SpecToJson), written as is.
  static Json Raw(std::string json);
  template <typename T>
  static Json ArrayOf(const std::vector<T>& values) {
    Json a = Array();
    for (const T& v : values) a.Push(Json(v));
    return a;
  }

  // Objects: appends `key` (a key set twice keeps its first place and takes the new value).
  Json& Set(std::string_view key, Json value);
  // Arrays: appends an element.
  Json& Push(Json value);

  // `expand_depth` > 0 puts each member of the outer `expand_depth` levels of containers on a
  // line of its own (indented two spaces a level); deeper levels stay on one line.
  std::string Dump(int expand_depth = 0) const;

 private:
  struct RawText {
    std::string text;
  };
  using Members = std::vector<std::pair<std::string, Json>>;
  using Elements = std::vector<Json>;
  void DumpTo(std::string& out, int expand_depth, int level) const;

  std::variant<std::nullptr_t, bool, int64_t, double, std::string, RawText, Members, Elements>
      value_;
};

// A JSON string literal of `s`, quotes included.
std::string JsonQuote(std::string_view s);

// Writes `json.Dump(expand_depth)` and a newline to `path`; INTERNAL naming the path on failure.
absl::Status WriteJsonFile(const std::string& path, const Json& json, int expand_depth = 1);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_JSON_H_
