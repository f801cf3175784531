#include "wire/convert.h"

#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace attnserve {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// -0.0 equals 0.0 but is a different proto3 value: the binary form carries it, the JSON form
// prints "-0", which the JSON parser reads back as 0. Both directions hand out +0 for either zero
// so that a spec means one wire message.
template <typename T>
T PlusZero(T x) {
  return x == T{0} ? T{0} : x;
}

template <typename Repeated>
std::vector<int64_t> ToVector(const Repeated& r) {
  return std::vector<int64_t>(r.begin(), r.end());
}

absl::StatusOr<BlockGenerator> GeneratorFromProto(const v1::BlockSparse& bs) {
  switch (bs.generator_case()) {
    case v1::BlockSparse::kLocalWindow:
      return LocalWindowGen{bs.local_window().width()};
    case v1::BlockSparse::kDilatedSparse:
      return DilatedSparseGen{ToVector(bs.dilated_sparse().rates())};
    case v1::BlockSparse::kGlobalLocal:
      return GlobalLocalGen{bs.global_local().global_blocks(), bs.global_local().width()};
    case v1::BlockSparse::kStrided:
      return StridedGen{bs.strided().stride(), bs.strided().width()};
    case v1::BlockSparse::kRandom:
      return RandomGen{PlusZero(bs.random().keep()), bs.random().seed()};
    case v1::BlockSparse::kCsr:
      return CsrGen{ToVector(bs.csr().row_ptr()), ToVector(bs.csr().col_idx())};
    case v1::BlockSparse::GENERATOR_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "spec.block_sparse.generator: one of local_window, dilated_sparse, global_local, strided, "
      "random, csr must be set");
}

void GeneratorToProto(const BlockGenerator& gen, v1::BlockSparse* out) {
  std::visit(Overloaded{
                 [&](const LocalWindowGen& g) { out->mutable_local_window()->set_width(g.width); },
                 [&](const DilatedSparseGen& g) {
                   auto* d = out->mutable_dilated_sparse();
                   for (int64_t r : g.rates) d->add_rates(r);
                 },
                 [&](const GlobalLocalGen& g) {
                   out->mutable_global_local()->set_global_blocks(g.global_blocks);
                   out->mutable_global_local()->set_width(g.width);
                 },
                 [&](const StridedGen& g) {
                   out->mutable_strided()->set_stride(g.stride);
                   out->mutable_strided()->set_width(g.width);
                 },
                 [&](const RandomGen& g) {
                   out->mutable_random()->set_keep(PlusZero(g.keep));
                   out->mutable_random()->set_seed(g.seed);
                 },
                 [&](const CsrGen& g) {
                   auto* c = out->mutable_csr();
                   for (int64_t x : g.row_ptr) c->add_row_ptr(x);
                   for (int64_t x : g.col_idx) c->add_col_idx(x);
                 },
             },
             gen);
}

}  // namespace

absl::StatusOr<AttentionSpec> SpecFromProto(const v1::AttentionSpec& proto) {
  AttentionSpec spec;
  spec.causal = proto.causal();
  spec.scale = PlusZero(proto.scale());
  switch (proto.pattern_case()) {
    case v1::AttentionSpec::kDense:
      spec.pattern = DenseSpec{};
      return spec;
    case v1::AttentionSpec::kWindow:
      spec.pattern = WindowSpec{proto.window().size()};
      return spec;
    case v1::AttentionSpec::kDilated:
      spec.pattern = DilatedSpec{ToVector(proto.dilated().segment_lengths()),
                                 ToVector(proto.dilated().dilation_rates())};
      return spec;
    case v1::AttentionSpec::kBlockSparse: {
      BlockSparseSpec bs;
      bs.block_size = proto.block_sparse().block_size();
      ATTN_ASSIGN_OR_RETURN(bs.generator, GeneratorFromProto(proto.block_sparse()));
      spec.pattern = std::move(bs);
      return spec;
    }
    case v1::AttentionSpec::PATTERN_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "spec.pattern: one of dense, window, dilated, block_sparse must be set");
}

v1::AttentionSpec SpecToProto(const AttentionSpec& spec) {
  v1::AttentionSpec out;
  out.set_causal(spec.causal);
  out.set_scale(PlusZero(spec.scale));
  std::visit(Overloaded{
                 [&](const DenseSpec&) { out.mutable_dense(); },
                 [&](const WindowSpec& w) { out.mutable_window()->set_size(w.size); },
                 [&](const DilatedSpec& d) {
                   auto* p = out.mutable_dilated();
                   for (int64_t w : d.segment_lengths) p->add_segment_lengths(w);
                   for (int64_t r : d.dilation_rates) p->add_dilation_rates(r);
                 },
                 [&](const BlockSparseSpec& b) {
                   auto* p = out.mutable_block_sparse();
                   p->set_block_size(b.block_size);
                   GeneratorToProto(b.generator, p);
                 },
             },
             spec.pattern);
  return out;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be set (DTYPE_F32, DTYPE_F16 or DTYPE_BF16)"));
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": unknown value ", static_cast<int>(dtype),
                                                 " (DTYPE_F32, DTYPE_F16 or DTYPE_BF16)"));
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

AttentionShape ShapeFromHeader(const v1::AttendHeader& header) {
  return AttentionShape{header.batch(), header.tokens(), header.q_heads(), header.kv_heads(),
                        header.head_dim()};
}

std::string TensorKindName(v1::TensorKind kind) {
  if (v1::TensorKind_IsValid(kind)) return v1::TensorKind_Name(kind);
  return absl::StrCat(static_cast<int>(kind));
}

absl::string_view TensorShortName(v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_Q:
      return "q";
    case v1::TENSOR_K:
      return "k";
    case v1::TENSOR_V:
      return "v";
    case v1::TENSOR_O:
      return "o";
    case v1::TENSOR_LSE:
      return "lse";
    default:
      break;
  }
  return "unknown tensor";
}

absl::StatusOr<v1::AttentionSpec> ParseSpecJsonProto(const std::string& json) {
  v1::AttentionSpec proto;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &proto, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec: not a valid AttentionSpec in the proto3 JSON mapping (",
        std::string(status.message()), "); example: {\"dilated\": ",
        "{\"segmentLengths\": [2048, 4096], \"dilationRates\": [1, 2]}, ", "\"causal\": true}"));
  }
  return proto;
}

absl::StatusOr<AttentionSpec> ParseSpecJson(const std::string& json) {
  ATTN_ASSIGN_OR_RETURN(v1::AttentionSpec proto, ParseSpecJsonProto(json));
  return SpecFromProto(proto);
}

std::string SpecToJson(const AttentionSpec& spec) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  // Scale 0 and causal false are meaningful defaults; print them so the JSON is self-describing.
  options.always_print_primitive_fields = true;
  const auto status = google::protobuf::util::MessageToJsonString(SpecToProto(spec), &out, options);
  if (!status.ok()) return "{}";
  return out;
}

PlacementHint PlacementHintFromProto(v1::Placement placement) {
  switch (placement) {
    case v1::PLACEMENT_SINGLE:
      return PlacementHint::kSingle;
    case v1::PLACEMENT_DATA_PARALLEL:
      return PlacementHint::kDataParallel;
    case v1::PLACEMENT_RING:
      return PlacementHint::kRing;
    default:
      return PlacementHint::kAuto;
  }
}

v1::Placement PlacementToProto(Placement placement) {
  switch (placement) {
    case Placement::kDataParallel:
      return v1::PLACEMENT_DATA_PARALLEL;
    case Placement::kRing:
      return v1::PLACEMENT_RING;
    case Placement::kContextParallel:
      return v1::PLACEMENT_CONTEXT_PARALLEL;
    case Placement::kSingle:
      break;
  }
  return v1::PLACEMENT_SINGLE;
}

}  // namespace attnserve
