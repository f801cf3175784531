// Conversions between the wire messages (proto/attnserve/v1) and the engine's types (core/spec,
// core/tensor, core/engine): the only place that knows both. Shared by the server's handlers, the
// client library, attnctl, the benches and the tests.
#ifndef ATTNSERVE_WIRE_CONVERT_H_
#define ATTNSERVE_WIRE_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attnserve.pb.h"
#include "core/engine/types.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/dtype.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// proto -> core. INVALID_ARGUMENT naming the field when a oneof is unset
// ("spec.pattern: one of dense, window, dilated, block_sparse must be set"). Only structure is
// checked here; the rules (sizes, rates, block sizes) are ValidateSpec's.
absl::StatusOr<AttentionSpec> SpecFromProto(const v1::AttentionSpec& proto);
// core -> proto. Total: every core spec has a proto form.
v1::AttentionSpec SpecToProto(const AttentionSpec& spec);

// DTYPE_UNSPECIFIED and unknown values -> INVALID_ARGUMENT naming `field` (e.g. "header.dtype").
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field = "dtype");
v1::DType DTypeToProto(DType dtype);

// The header's placement hint and the response's placement.
PlacementHint PlacementHintFromProto(v1::Placement placement);
v1::Placement PlacementToProto(Placement placement);
// The header's dims as a shape (no validation).
AttentionShape ShapeFromHeader(const v1::AttendHeader& header);

// "TENSOR_Q", ... (the enum value's name, or its number when unknown).
std::string TensorKindName(v1::TensorKind kind);
// "q", "k", "v", "o", "lse" as used in error messages.
absl::string_view TensorShortName(v1::TensorKind kind);

// Parses the proto3 JSON mapping of AttentionSpec (what `attnctl --spec` takes), e.g.
// {"dilated": {"segmentLengths": [2048, 4096], "dilationRates": [1, 2]}, "causal": true}.
// Both lowerCamelCase and the original snake_case field names are accepted. INVALID_ARGUMENT
// "spec: <what the JSON parser found wrong>" on malformed JSON or unknown fields.
absl::StatusOr<v1::AttentionSpec> ParseSpecJsonProto(const std::string& json);
// ParseSpecJsonProto + SpecFromProto.
absl::StatusOr<AttentionSpec> ParseSpecJson(const std::string& json);
// The proto3 JSON mapping of a spec (compact, lowerCamelCase).
std::string SpecToJson(const AttentionSpec& spec);

}  // namespace attnserve

#endif  // ATTNSERVE_WIRE_CONVERT_H_
