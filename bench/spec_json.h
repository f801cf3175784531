// AttentionSpec from its proto3 JSON mapping, e.g.
//   {"dilated": {"segmentLengths": [2048, 4096], "dilationRates": [1, 2]}, "causal": true}
// A self-contained parser for exactly the AttentionSpec subset of JSON (objects, arrays, numbers,
// strings, booleans, null), so attnbench does not need protobuf. Field names are accepted in
// lowerCamelCase (the proto3 JSON spelling) and in snake_case (the .proto spelling); 64-bit
// integers may also be quoted strings, as proto3 JSON writes them.
#ifndef ATTNSERVE_BENCH_SPEC_JSON_H_
#define ATTNSERVE_BENCH_SPEC_JSON_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"

namespace attnserve::bench {

// INVALID_ARGUMENT naming the JSON path ("spec.blockSparse.random.keep") for malformed JSON,
// unknown fields, wrong types or two patterns/generators at once.
absl::StatusOr<AttentionSpec> ParseSpecJson(std::string_view json);

// The proto3 JSON mapping of `spec` (lowerCamelCase), what ParseSpecJson reads back.
std::string SpecToJson(const AttentionSpec& spec);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_SPEC_JSON_H_
