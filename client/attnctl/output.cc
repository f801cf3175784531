#include "client/attnctl/output.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace attnserve::attnctl {

std::string SpecJson(const v1::AttentionSpec& spec) {
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(spec, &json).ok()) {
    return spec.ShortDebugString();
  }
  return json;
}

std::string ShortEnumName(const std::string& name) {
  std::string out = name.substr(name.find('_') + 1);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank: the smallest value with at least p of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace attnserve::attnctl
