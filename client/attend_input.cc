#include "client/attend_input.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "wire/convert.h"

namespace attnserve::client {
namespace {

namespace v1 = ::attnserve::v1;

// Checks the tensors that are given against each other (the server checks region sizes).
absl::Status ValidateTensors(const AttendInput& input, DType dtype,
                             const std::vector<int64_t>& want_q,
                             const std::vector<int64_t>& want_kv) {
  const std::tuple<const char*, const HostTensor*, const std::optional<TensorRegion>*> tensors[] = {
      {"q", input.q, &input.q_region},
      {"k", input.k, &input.k_region},
      {"v", input.v, &input.v_region}};
  for (const auto& [name, t, region] : tensors) {
    if ((t == nullptr) == !region->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input: ", name, " must be given either as a tensor or as ", name, "_region",
          t == nullptr ? "" : " (not both)"));
    }
    if (t == nullptr) continue;
    if (t->dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": dtype ",
                                                     std::string(DTypeName(t->dtype())),
                                                     " differs from the request's ",
                                                     std::string(DTypeName(dtype))));
    }
    const std::vector<int64_t>& want = name[0] == 'q' ? want_q : want_kv;
    if (t->dims() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": shape ", t->DebugString(),
          " does not match the request (q [B, N, Hq, D], k and v [B, N, Hkv, D] with the same "
          "B, N and D)"));
    }
  }
  return absl::OkStatus();
}

void SetRef(const std::optional<TensorRegion>& r, v1::RegionRef* out) {
  out->set_region(r->region);
  out->set_offset(r->offset);
  out->set_bytes(r->bytes);
}

}  // namespace

absl::StatusOr<v1::AttendHeader> BuildAttendHeader(const AttendInput& input) {
  AttentionShape shape;
  DType dtype = input.dtype;
  if (input.q != nullptr) {
    if (input.q->rank() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("q: expected [B, N, H, D], got ", input.q->DebugString()));
    }
    const HostTensor* kv = input.k != nullptr ? input.k : input.v;
    if (kv == nullptr && !input.shape) {
      return absl::InvalidArgumentError(
          "input: shape is required when k and v come from regions or a context");
    }
    if (kv != nullptr && kv->rank() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("k: expected [B, N, H, D], got ", kv->DebugString()));
    }
    shape = {input.q->dim(0), input.q->dim(1), input.q->dim(2),
             kv != nullptr ? kv->dim(2) : input.shape->kv_heads, input.q->dim(3)};
    if (kv != nullptr && kv->dim(1) != shape.tokens) shape.kv_tokens = kv->dim(1);
    if (kv == nullptr) shape.kv_tokens = input.shape->kv_tokens;
    dtype = input.q->dtype();
  } else if (input.shape) {
    shape = *input.shape;
  } else {
    return absl::InvalidArgumentError("input: shape is required when q comes from a region");
  }
  const std::vector<int64_t> want_q = {shape.batch, shape.tokens, shape.q_heads, shape.head_dim};
  const std::vector<int64_t> want_kv = {shape.batch, shape.kv_len(), shape.kv_heads,
                                        shape.head_dim};
  if (!input.context.empty()) {
    if (input.k != nullptr || input.v != nullptr || input.k_region || input.v_region) {
      return absl::InvalidArgumentError(
          "input.context: K and V come from the context; leave k, v and their regions unset");
    }
    AttendInput q_only = input;  // check q alone
    TensorRegion placeholder;
    q_only.k_region = q_only.v_region = placeholder;
    if (absl::Status s = ValidateTensors(q_only, dtype, want_q, want_kv); !s.ok()) return s;
  } else if (absl::Status s = ValidateTensors(input, dtype, want_q, want_kv); !s.ok()) {
    return s;
  }
  if (input.lse_region && !input.o_region) {
    return absl::InvalidArgumentError("input: lse_region needs o_region");
  }
  v1::AttendHeader header;
  header.set_request_id(input.request_id);
  header.set_dtype(DTypeToProto(dtype));
  header.set_batch(shape.batch);
  header.set_tokens(shape.tokens);
  header.set_q_heads(shape.q_heads);
  header.set_kv_heads(shape.kv_heads);
  header.set_head_dim(shape.head_dim);
  if (input.context.empty() && shape.kv_len() != shape.tokens) {
    header.set_kv_tokens(shape.kv_len());
  }
  if (input.q_offset) header.set_q_offset(*input.q_offset);
  for (int64_t x : input.cu_seqlens_q) header.add_cu_seqlens_q(x);
  for (int64_t x : input.cu_seqlens_k) header.add_cu_seqlens_k(x);
  header.set_context(input.context);
  *header.mutable_spec() = input.spec;
  header.set_placement(input.placement);
  header.set_return_lse(input.return_lse);
  header.set_response_chunk_bytes(input.response_chunk_bytes);
  if (input.q_region) SetRef(input.q_region, header.mutable_q_region());
  if (input.k_region) SetRef(input.k_region, header.mutable_k_region());
  if (input.v_region) SetRef(input.v_region, header.mutable_v_region());
  if (input.o_region) SetRef(input.o_region, header.mutable_o_region());
  if (input.lse_region) SetRef(input.lse_region, header.mutable_lse_region());
  return header;
}

}  // namespace attnserve::client
