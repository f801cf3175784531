#include "server/grpc/call_outcome.h"

#include <vector>

#include "core/util/log_safe.h"
#include "google/protobuf/descriptor.h"

namespace attnserve {

std::string FindInvalidUtf8(const google::protobuf::Message& m, const std::string& prefix) {
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          if (!IsValidUtf8(r->GetRepeatedString(m, f, i))) return absl::StrCat(path, "[", i, "]");
        }
      } else if (!IsValidUtf8(r->GetString(m, f))) {
        return path;
      }
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          std::string bad =
              FindInvalidUtf8(r->GetRepeatedMessage(m, f, i), absl::StrCat(path, "[", i, "]"));
          if (!bad.empty()) return bad;
        }
      } else {
        std::string bad = FindInvalidUtf8(r->GetMessage(m, f), path);
        if (!bad.empty()) return bad;
      }
    }
  }
  return "";
}

absl::Status UnparseableMessage(const google::protobuf::Message& partial,
                                std::string_view type_name) {
  const std::string bad = FindInvalidUtf8(partial);
  if (!bad.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        bad, ": not valid UTF-8 (protobuf string fields must be UTF-8; send raw bytes as bytes)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("request message: not a valid ",
                                                 std::string(type_name),
                                                 " (truncated or malformed protobuf bytes)"));
}

}  // namespace attnserve
