// Text and JSON formatting shared by the attnctl subcommands.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_OUTPUT_H_
#define ATTNSERVE_CLIENT_ATTNCTL_OUTPUT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attnserve/v1/attnserve.pb.h"
#include "core/util/json.h"
#include "google/protobuf/message.h"

namespace attnserve::attnctl {

// A message in the proto3 JSON mapping (lowerCamelCase names, enums by name, fields at their
// defaults left out unless `all_primitive_fields`), except that 64-bit integers are JSON numbers:
// the mapping writes them as strings ("size": "256"), which reads badly and which a reader must
// convert back. The text still parses as the message (JsonStringToMessage takes numbers).
Json ProtoJson(const google::protobuf::Message& message, bool all_primitive_fields = false);

// The spec as JSON on one line, int64 values as numbers, as --spec takes it.
std::string SpecJson(const v1::AttentionSpec& spec);

// An enum value's name without its prefix, lower case: DTYPE_BF16 -> "bf16",
// PLACEMENT_DATA_PARALLEL -> "data_parallel".
std::string ShortEnumName(const std::string& name);

// Nearest-rank percentile of ascending `sorted` (p in [0, 1]); 0 when empty.
double Percentile(const std::vector<double>& sorted, double p);

// Runs of consecutive values, as (first, last): 1, 2, ..., 256 -> (1, 256); 64, 128 -> (64, 64),
// (128, 128).
template <typename Values>
std::vector<std::pair<int64_t, int64_t>> Runs(const Values& values) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const auto v : values) {
    if (!runs.empty() && v == runs.back().second + 1) {
      runs.back().second = v;
    } else {
      runs.emplace_back(v, v);
    }
  }
  return runs;
}

// "1-256" for 1, 2, ..., 256; "64, 128" when the values are not consecutive (runs of two stay
// two values).
template <typename Values>
std::string CompactList(const Values& values) {
  std::vector<std::string> parts;
  for (const auto& [first, last] : Runs(values)) {
    parts.push_back(last - first >= 2 ? absl::StrCat(first, "-", last)
                    : last == first   ? absl::StrCat(first)
                                      : absl::StrCat(first, ", ", last));
  }
  return absl::StrJoin(parts, ", ");
}

// [{"min": 1, "max": 256}] for 1, 2, ..., 256; one {"min", "max"} object per run of consecutive
// values ([{"min": 64, "max": 64}, {"min": 128, "max": 128}] for 64, 128).
template <typename Values>
Json RangesJson(const Values& values) {
  Json ranges = Json::Array();
  for (const auto& [first, last] : Runs(values)) {
    ranges.Push(Json::Object().Set("min", first).Set("max", last));
  }
  return ranges;
}

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_OUTPUT_H_
