#include "client/attnctl/output.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace attnserve::attnctl {
namespace {

namespace pb = ::google::protobuf;

// Field `f` of `m` (element `index` of a repeated field, -1 for a singular one) as JSON.
Json FieldValueJson(const pb::Message& m, const pb::FieldDescriptor* f, int index, bool all) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return Json(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return Json(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return Json(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT64:  // exact above 2^63 too
      return Json::Raw(absl::StrCat(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f)));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return Json(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return Json(static_cast<double>(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f)));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return Json(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumValueDescriptor* e = rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f);
      return Json(e->name());
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      return f->type() == pb::FieldDescriptor::TYPE_BYTES ? Json(absl::Base64Escape(s)) : Json(s);
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f), all);
  }
  return Json();
}

}  // namespace

Json ProtoJson(const pb::Message& message, bool all_primitive_fields) {
  const pb::Descriptor* d = message.GetDescriptor();
  if (absl::StartsWith(d->full_name(), "google.protobuf.")) {  // well-known types: the mapping's
    std::string json;
    if (pb::util::MessageToJsonString(message, &json).ok()) return Json::Raw(json);
  }
  const pb::Reflection* r = message.GetReflection();
  Json out = Json::Object();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_map()) continue;  // no maps in the attnserve messages
    if (f->is_repeated()) {
      const int n = r->FieldSize(message, f);
      if (n == 0 && !all_primitive_fields) continue;
      Json values = Json::Array();
      for (int k = 0; k < n; ++k) values.Push(FieldValueJson(message, f, k, all_primitive_fields));
      out.Set(f->json_name(), std::move(values));
    } else if (r->HasField(message, f) || (all_primitive_fields && !f->has_presence())) {
      out.Set(f->json_name(), FieldValueJson(message, f, -1, all_primitive_fields));
    }
  }
  return out;
}

std::string SpecJson(const v1::AttentionSpec& spec) { return ProtoJson(spec).Dump(); }

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
