// Fuzz target: the proto3-JSON spec parser (wire/convert: ParseSpecJson, what attnctl --spec and
// the Python client's dict specs go through). The input is the JSON text. Malformed text must be
// refused with INVALID_ARGUMENT; an accepted spec must print (SpecToJson) to JSON that parses
// back to the same proto, and must validate and compile against a few small shapes or be
// refused with a status (never a crash, a hang or an allocation beyond the kept-block limit).
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/spec/rect_pattern.h"
#include "tests/fuzz/fuzz_check.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

void FuzzOne(const std::string& json) {
  absl::StatusOr<AttentionSpec> spec = ParseSpecJson(json);
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument,
               spec.status().ToString());
    FUZZ_CHECK(!spec.status().message().empty());
    return;
  }
  // Round trip: core -> JSON -> core gives the same wire message.
  const std::string printed = SpecToJson(*spec);
  absl::StatusOr<AttentionSpec> again = ParseSpecJson(printed);
  FUZZ_CHECK(again.ok(), "SpecToJson printed ", printed, ", which does not parse: ",
             again.status().ToString());
  FUZZ_CHECK(SpecToProto(*again).SerializeAsString() == SpecToProto(*spec).SerializeAsString(),
             "round trip changed the spec: ", printed, " -> ", SpecToJson(*again));

  // A square request, decode against 300 keys, and a chunk of a prefill.
  struct Case {
    AttentionShape shape;
    int64_t q_offset;
  };
  const Case cases[] = {{{1, 256, 4, 2, 64, 0}, 0}, {{1, 1, 4, 2, 64, 300}, 299},
                        {{1, 40, 2, 2, 32, 200}, 100}};
  CompileOptions options;
  options.max_kept_blocks = int64_t{1} << 14;
  for (const Case& c : cases) {
    AttentionSpec s = *spec;
    s.q_offset = c.q_offset;
    const absl::Status valid = ValidateSpec(s, c.shape);
    if (!valid.ok()) {
      FUZZ_CHECK(valid.code() == absl::StatusCode::kInvalidArgument ||
                     valid.code() == absl::StatusCode::kUnimplemented,
                 valid.ToString());
      continue;
    }
    if (IsSquare(s, c.shape)) {
      absl::StatusOr<CompiledPattern> compiled =
          CompilePattern(s, c.shape.tokens, c.shape.q_heads, options);
      FUZZ_CHECK(compiled.ok() || compiled.status().code() == absl::StatusCode::kResourceExhausted,
                 compiled.status().ToString());
      continue;
    }
    if (std::holds_alternative<DilatedSpec>(s.pattern)) continue;  // the spec target's part
    for (const QuerySpan& span : RequestSpans(s, c.shape)) {
      absl::StatusOr<std::vector<RectLayout>> pieces = SpanLayouts(s, span, options);
      FUZZ_CHECK(pieces.ok() || pieces.status().code() == absl::StatusCode::kResourceExhausted,
                 pieces.status().ToString());
    }
  }
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::FuzzOne(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
