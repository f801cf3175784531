// Text and JSON formatting shared by the attnctl subcommands.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_OUTPUT_H_
#define ATTNSERVE_CLIENT_ATTNCTL_OUTPUT_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attnserve/v1/attnserve.pb.h"

namespace attnserve::attnctl {


// The spec in the proto3 JSON mapping (compact), as --spec takes it.
std::string SpecJson(const v1::AttentionSpec& spec);

// An enum value's name without its prefix, lower case: DTYPE_BF16 -> "bf16",
// PLACEMENT_DATA_PARALLEL -> "data_parallel".
std::string ShortEnumName(const std::string& name);

// Nearest-rank percentile of ascending `sorted` (p in [0, 1]); 0 when empty.
double Percentile(const std::vector<double>& sorted, double p);

// "1-256" for 1, 2, ..., 256; "64, 128" when the values are not consecutive.
template <typename Values>
std::string CompactList(const Values& values) {
  std::vector<std::string> parts;
  int i = 0;
  const int n = static_cast<int>(values.size());
  while (i < n) {
    int j = i;
    while (j + 1 < n && values[j + 1] == values[j] + 1) ++j;
    parts.push_back(j - i >= 2 ? absl::StrCat(values[i], "-", values[j])
                               : absl::StrJoin(values.begin() + i, values.begin() + j + 1, ", "));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_OUTPUT_H_
