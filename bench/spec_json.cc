#include "bench/spec_json.h"

#include <cctype>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // a string's contents, or a number's literal (parsed later, exactly)
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;
};

// Recursive descent over RFC 8259 JSON. Depth is bounded so hostile input cannot overflow the
// stack.
class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    ATTN_RETURN_IF_ERROR(ParseValue(v, 0));
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 32;

  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: invalid JSON at offset ", pos_, ": ", std::string(what)));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  absl::Status ParseValue(JsonValue& v, int depth) {
    if (depth > kMaxDepth) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(v, depth);
    if (c == '[') return ParseArray(v, depth);
    if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      return ParseString(v.text);
    }
    if (ConsumeWord("true")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = true;
      return absl::OkStatus();
    }
    if (ConsumeWord("false")) {
      v.kind = JsonValue::Kind::kBool;
      return absl::OkStatus();
    }
    if (ConsumeWord("null")) return absl::OkStatus();
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      const size_t start = pos_;
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                  s_[pos_] == '-' || s_[pos_] == '+' || s_[pos_] == '.' ||
                                  s_[pos_] == 'e' || s_[pos_] == 'E')) {
        ++pos_;
      }
      v.kind = JsonValue::Kind::kNumber;
      v.text = std::string(s_.substr(start, pos_ - start));
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::Status ParseString(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c == '\\') {
        if (pos_ >= s_.size()) break;
        const char e = s_[pos_++];
        switch (e) {
          case '"': case '\\': case '/': c = e; break;
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          default:
            // \uXXXX never occurs in AttentionSpec field names or values.
            return Error("unsupported escape in string");
        }
      }
      out.push_back(c);
    }
    if (pos_ >= s_.size()) return Error("unterminated string");
    ++pos_;  // closing quote
    return absl::OkStatus();
  }

  absl::Status ParseArray(JsonValue& v, int depth) {
    ++pos_;
    v.kind = JsonValue::Kind::kArray;
    if (Consume(']')) return absl::OkStatus();
    do {
      v.array.emplace_back();
      ATTN_RETURN_IF_ERROR(ParseValue(v.array.back(), depth + 1));
    } while (Consume(','));
    if (!Consume(']')) return Error("expected ',' or ']'");
    return absl::OkStatus();
  }

  absl::Status ParseObject(JsonValue& v, int depth) {
    ++pos_;
    v.kind = JsonValue::Kind::kObject;
    if (Consume('}')) return absl::OkStatus();
    do {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a quoted key");
      std::string key;
      ATTN_RETURN_IF_ERROR(ParseString(key));
      if (!Consume(':')) return Error("expected ':'");
      JsonValue value;
      ATTN_RETURN_IF_ERROR(ParseValue(value, depth + 1));
      v.object.emplace_back(std::move(key), std::move(value));
    } while (Consume(','));
    if (!Consume('}')) return Error("expected ',' or '}'");
    return absl::OkStatus();
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// snake_case -> lowerCamelCase; camelCase stays as it is.
std::string CamelKey(std::string_view key) {
  std::string out;
  bool upper = false;
  for (char c : key) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c);
    upper = false;
  }
  return out;
}

absl::Status TypeError(const std::string& path, std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": expected ", std::string(expected)));
}

// Visits the fields of an object, handing each (camelCase key, value, path) to `fn`; unknown keys
// are INVALID_ARGUMENT (a typo must not silently run a different benchmark).
template <typename Fn>
absl::Status ForEachField(const JsonValue& v, const std::string& path, Fn&& fn) {
  if (v.kind == JsonValue::Kind::kNull) return absl::OkStatus();
  if (v.kind != JsonValue::Kind::kObject) return TypeError(path, "an object");
  for (const auto& [key, value] : v.object) {
    const std::string camel = CamelKey(key);
    const std::string sub = absl::StrCat(path, ".", camel);
    bool known = true;
    ATTN_RETURN_IF_ERROR(fn(camel, value, sub, known));
    if (!known) return absl::InvalidArgumentError(absl::StrCat(sub, ": unknown field"));
  }
  return absl::OkStatus();
}

absl::Status GetInt(const JsonValue& v, const std::string& path, int64_t& out) {
  if (v.kind == JsonValue::Kind::kNull) return absl::OkStatus();
  if ((v.kind != JsonValue::Kind::kNumber && v.kind != JsonValue::Kind::kString) ||
      !absl::SimpleAtoi(v.text, &out)) {
    return TypeError(path, "an integer");
  }
  return absl::OkStatus();
}

absl::Status GetUint(const JsonValue& v, const std::string& path, uint64_t& out) {
  if (v.kind == JsonValue::Kind::kNull) return absl::OkStatus();
  if ((v.kind != JsonValue::Kind::kNumber && v.kind != JsonValue::Kind::kString) ||
      !absl::SimpleAtoi(v.text, &out)) {
    return TypeError(path, "an unsigned integer");
  }
  return absl::OkStatus();
}

absl::Status GetDouble(const JsonValue& v, const std::string& path, double& out) {
  if (v.kind == JsonValue::Kind::kNull) return absl::OkStatus();
  if ((v.kind != JsonValue::Kind::kNumber && v.kind != JsonValue::Kind::kString) ||
      !absl::SimpleAtod(v.text, &out)) {
    return TypeError(path, "a number");
  }
  return absl::OkStatus();
}

absl::Status GetIntList(const JsonValue& v, const std::string& path, std::vector<int64_t>& out) {
  if (v.kind == JsonValue::Kind::kNull) return absl::OkStatus();
  if (v.kind != JsonValue::Kind::kArray) return TypeError(path, "an array of integers");
  out.clear();
  for (size_t i = 0; i < v.array.size(); ++i) {
    int64_t x = 0;
    ATTN_RETURN_IF_ERROR(GetInt(v.array[i], absl::StrCat(path, "[", i, "]"), x));
    out.push_back(x);
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockSparseSpec> ParseBlockSparse(const JsonValue& v, const std::string& path) {
  BlockSparseSpec bs;
  int generators = 0;
  auto generator = [&](const std::string& sub, BlockGenerator g) -> absl::Status {
    if (++generators > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(sub, ": only one generator may be set (oneof generator)"));
    }
    bs.generator = std::move(g);
    return absl::OkStatus();
  };
  ATTN_RETURN_IF_ERROR(ForEachField(
      v, path,
      [&](const std::string& key, const JsonValue& f, const std::string& sub,
          bool& known) -> absl::Status {
        if (key == "blockSize") {
          int64_t b = 0;
          ATTN_RETURN_IF_ERROR(GetInt(f, sub, b));
          bs.block_size = static_cast<int32_t>(b);
        } else if (key == "localWindow") {
          LocalWindowGen g;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "width") return GetInt(x, p, g.width);
            ok = false;
            return absl::OkStatus();
          }));
          return generator(sub, g);
        } else if (key == "dilatedSparse") {
          DilatedSparseGen g;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "rates") return GetIntList(x, p, g.rates);
            ok = false;
            return absl::OkStatus();
          }));
          return generator(sub, g);
        } else if (key == "globalLocal") {
          GlobalLocalGen g;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "globalBlocks") return GetInt(x, p, g.global_blocks);
            if (k == "width") return GetInt(x, p, g.width);
            ok = false;
            return absl::OkStatus();
          }));
          return generator(sub, g);
        } else if (key == "strided") {
          StridedGen g;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "stride") return GetInt(x, p, g.stride);
            if (k == "width") return GetInt(x, p, g.width);
            ok = false;
            return absl::OkStatus();
          }));
          return generator(sub, g);
        } else if (key == "random") {
          RandomGen g;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "keep") return GetDouble(x, p, g.keep);
            if (k == "seed") return GetUint(x, p, g.seed);
            ok = false;
            return absl::OkStatus();
          }));
          return generator(sub, g);
        } else if (key == "csr") {
          CsrGen g;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "rowPtr") return GetIntList(x, p, g.row_ptr);
            if (k == "colIdx") return GetIntList(x, p, g.col_idx);
            ok = false;
            return absl::OkStatus();
          }));
          return generator(sub, g);
        } else {
          known = false;
        }
        return absl::OkStatus();
      }));
  if (generators == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": a generator is required (localWindow, dilatedSparse, globalLocal, strided, "
              "random or csr)"));
  }
  return bs;
}

std::string IntList(const std::vector<int64_t>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

}  // namespace

absl::StatusOr<AttentionSpec> ParseSpecJson(std::string_view json) {
  ATTN_ASSIGN_OR_RETURN(const JsonValue root, Parser(json).ParseDocument());
  if (root.kind != JsonValue::Kind::kObject) return TypeError("spec", "a JSON object");
  AttentionSpec spec;
  int patterns = 0;
  auto pattern = [&](const std::string& sub, AttentionPattern p) -> absl::Status {
    if (++patterns > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(sub, ": only one pattern may be set (oneof pattern)"));
    }
    spec.pattern = std::move(p);
    return absl::OkStatus();
  };
  ATTN_RETURN_IF_ERROR(ForEachField(
      root, "spec",
      [&](const std::string& key, const JsonValue& f, const std::string& sub,
          bool& known) -> absl::Status {
        if (key == "causal") {
          if (f.kind == JsonValue::Kind::kNull) return absl::OkStatus();
          if (f.kind != JsonValue::Kind::kBool) return TypeError(sub, "true or false");
          spec.causal = f.boolean;
        } else if (key == "scale") {
          double s = 0;
          ATTN_RETURN_IF_ERROR(GetDouble(f, sub, s));
          spec.scale = static_cast<float>(s);
        } else if (key == "dense") {
          ATTN_RETURN_IF_ERROR(ForEachField(
              f, sub, [](const std::string&, const JsonValue&, const std::string&, bool& ok) {
                ok = false;
                return absl::OkStatus();
              }));
          return pattern(sub, DenseSpec{});
        } else if (key == "window") {
          WindowSpec w;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "size") return GetInt(x, p, w.size);
            ok = false;
            return absl::OkStatus();
          }));
          return pattern(sub, w);
        } else if (key == "dilated") {
          DilatedSpec d;
          ATTN_RETURN_IF_ERROR(ForEachField(f, sub, [&](const std::string& k, const JsonValue& x,
                                                        const std::string& p, bool& ok) {
            if (k == "segmentLengths") return GetIntList(x, p, d.segment_lengths);
            if (k == "dilationRates") return GetIntList(x, p, d.dilation_rates);
            ok = false;
            return absl::OkStatus();
          }));
          return pattern(sub, d);
        } else if (key == "blockSparse") {
          ATTN_ASSIGN_OR_RETURN(BlockSparseSpec bs, ParseBlockSparse(f, sub));
          return pattern(sub, std::move(bs));
        } else {
          known = false;
        }
        return absl::OkStatus();
      }));
  return spec;
}

std::string SpecToJson(const AttentionSpec& spec) {
  std::string pattern = std::visit(
      [](const auto& p) -> std::string {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<P, DenseSpec>) {
          return "\"dense\": {}";
        } else if constexpr (std::is_same_v<P, WindowSpec>) {
          return absl::StrCat("\"window\": {\"size\": ", p.size, "}");
        } else if constexpr (std::is_same_v<P, DilatedSpec>) {
          return absl::StrCat("\"dilated\": {\"segmentLengths\": ", IntList(p.segment_lengths),
                              ", \"dilationRates\": ", IntList(p.dilation_rates), "}");
        } else {
          const std::string gen = std::visit(
              [](const auto& g) -> std::string {
                using G = std::decay_t<decltype(g)>;
                if constexpr (std::is_same_v<G, LocalWindowGen>) {
                  return absl::StrCat("\"localWindow\": {\"width\": ", g.width, "}");
                } else if constexpr (std::is_same_v<G, DilatedSparseGen>) {
                  return absl::StrCat("\"dilatedSparse\": {\"rates\": ", IntList(g.rates), "}");
                } else if constexpr (std::is_same_v<G, GlobalLocalGen>) {
                  return absl::StrCat("\"globalLocal\": {\"globalBlocks\": ", g.global_blocks,
                                      ", \"width\": ", g.width, "}");
                } else if constexpr (std::is_same_v<G, StridedGen>) {
                  return absl::StrCat("\"strided\": {\"stride\": ", g.stride,
                                      ", \"width\": ", g.width, "}");
                } else if constexpr (std::is_same_v<G, RandomGen>) {
                  return absl::StrCat("\"random\": {\"keep\": ", g.keep, ", \"seed\": \"",
                                      g.seed, "\"}");
                } else {
                  return absl::StrCat("\"csr\": {\"rowPtr\": ", IntList(g.row_ptr),
                                      ", \"colIdx\": ", IntList(g.col_idx), "}");
                }
              },
              p.generator);
          return absl::StrCat("\"blockSparse\": {\"blockSize\": ", p.block_size, ", ", gen, "}");
        }
      },
      spec.pattern);
  std::string out = absl::StrCat("{", pattern);
  if (spec.causal) absl::StrAppend(&out, ", \"causal\": true");
  if (spec.scale != 0.f) absl::StrAppend(&out, ", \"scale\": ", spec.scale);
  absl::StrAppend(&out, "}");
  return out;
}

}  // namespace attnserve::bench
