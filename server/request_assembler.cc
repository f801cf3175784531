#include "server/request_assembler.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/log_safe.h"
#include "core/util/status_macros.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

// header.request_id is echoed in the response and written to the log: at most
// kMaxRequestIdBytes of printable ASCII, refused otherwise (not rewritten, so that the id a
// client gets back is always the one it sent).
absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.request_id: must be at most ", kMaxRequestIdBytes,
                     " bytes of printable ASCII, got ", id.size(), " bytes"));
  }
  if (const size_t at = FindUnprintable(id); at != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.request_id: must be printable ASCII (0x20-0x7e), byte ", at, " is ",
                     SanitizeForLog(id.substr(at, 1))));
  }
  return absl::OkStatus();
}

// a * b for a, b >= 0, saturating at INT64_MAX (a request that large is refused either way).
int64_t SatMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}
int64_t SatAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

std::string ShapeString(int64_t b, int64_t n, int64_t h, int64_t d, DType dtype) {
  return absl::StrCat("[", b, ", ", n, ", ", h, ", ", d, "] ", std::string(DTypeName(dtype)));
}

absl::Status CheckDim(absl::string_view field, int64_t value) {
  if (value < 1) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be >= 1, got ", value));
  }
  return absl::OkStatus();
}

int TensorIndex(v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_Q:
      return 0;
    case v1::TENSOR_K:
      return 1;
    case v1::TENSOR_V:
      return 2;
    default:
      return -1;
  }
}

constexpr absl::string_view kTensorNames[3] = {"q", "k", "v"};

}  // namespace

bool ByteRangeSet::Insert(int64_t start, int64_t end, std::pair<int64_t, int64_t>* overlap) {
  if (start >= end) return true;
  // The first range starting after `start`, and the one before it (the only candidates).
  auto next = ranges_.upper_bound(start);
  if (next != ranges_.end() && next->first < end) {
    if (overlap != nullptr) *overlap = *next;
    return false;
  }
  auto prev = next == ranges_.begin() ? ranges_.end() : std::prev(next);
  if (prev != ranges_.end() && prev->second > start) {
    if (overlap != nullptr) *overlap = *prev;
    return false;
  }
  covered_ += end - start;
  // Merge with touching neighbours so the set stays as small as the number of gaps.
  if (prev != ranges_.end() && prev->second == start) {
    start = prev->first;
    ranges_.erase(prev);
  }
  if (next != ranges_.end() && next->first == end) {
    end = next->second;
    ranges_.erase(next);
  }
  ranges_.emplace(start, end);
  return true;
}

RequestAssembler::RequestAssembler(const AssemblerOptions& options) : options_(options) {}

absl::Status RequestAssembler::Add(const v1::AttendRequest& request) {
  switch (request.message_case()) {
    case v1::AttendRequest::kHeader:
      return AddHeader(request.header());
    case v1::AttendRequest::kChunk:
      return AddChunk(request.chunk());
    case v1::AttendRequest::MESSAGE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("request.message: one of header, chunk must be set");
}

absl::Status RequestAssembler::AddHeader(const v1::AttendHeader& header) {
  if (has_header_) return absl::InvalidArgumentError("header: sent twice");
  ATTN_RETURN_IF_ERROR(CheckRequestId(header.request_id()));
  ATTN_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(header.dtype(), "header.dtype"));
  ATTN_RETURN_IF_ERROR(CheckDim("header.batch", header.batch()));
  ATTN_RETURN_IF_ERROR(CheckDim("header.tokens", header.tokens()));
  ATTN_RETURN_IF_ERROR(CheckDim("header.q_heads", header.q_heads()));
  ATTN_RETURN_IF_ERROR(CheckDim("header.kv_heads", header.kv_heads()));
  ATTN_RETURN_IF_ERROR(CheckDim("header.head_dim", header.head_dim()));
  if (header.q_heads() % header.kv_heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.q_heads: ", header.q_heads(),
                     " is not a multiple of header.kv_heads = ", header.kv_heads()));
  }
  if (header.response_chunk_bytes() < 0 ||
      header.response_chunk_bytes() > options_.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.response_chunk_bytes: must be in [0, ", options_.max_chunk_bytes,
                     "] (0: the server's default), got ", header.response_chunk_bytes()));
  }
  if (header.kv_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.kv_tokens: must be >= 0 (0: the same as tokens), got ", header.kv_tokens()));
  }
  if (!header.context().empty()) ATTN_RETURN_IF_ERROR(ResolveContext(header, dtype));
  // Key rows per sequence: the context's, the header's, or the query's.
  const int64_t kv_len = context_          ? context_->tokens
                         : header.kv_tokens() > 0 ? header.kv_tokens()
                                                  : header.tokens();
  if (header.placement() != v1::PLACEMENT_AUTO && !v1::Placement_IsValid(header.placement())) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.placement: unknown value ", static_cast<int>(header.placement())));
  }

  // Sizes before anything else touches the shape: saturating, so 10^12 tokens cannot wrap.
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t rows = SatMul(header.batch(), header.tokens());
  const int64_t kv_rows = SatMul(header.batch(), kv_len);
  const int64_t q_bytes = SatMul(SatMul(SatMul(rows, header.q_heads()), header.head_dim()), elem);
  const int64_t kv_bytes =
      SatMul(SatMul(SatMul(kv_rows, header.kv_heads()), header.head_dim()), elem);
  const int64_t total = SatAdd(q_bytes, SatAdd(kv_bytes, kv_bytes));
  // A context's K and V are not uploaded: the limit is on what the request brings.
  const int64_t brought = context_ ? q_bytes : total;
  if (brought > options_.max_request_bytes) {
    const bool saturated = total == std::numeric_limits<int64_t>::max();
    return absl::ResourceExhaustedError(absl::StrCat(
        "header.tokens: q ",
        ShapeString(header.batch(), header.tokens(), header.q_heads(), header.head_dim(), dtype),
        " and k, v ",
        ShapeString(header.batch(), kv_len, header.kv_heads(), header.head_dim(), dtype),
        " need ", saturated ? "more than 2^63 " : absl::StrCat(total, " "),
        "bytes, above the limit --max-request-bytes=", options_.max_request_bytes));
  }

  AttentionShape shape = ShapeFromHeader(header);
  if (kv_len != shape.tokens) shape.kv_tokens = kv_len;
  ATTN_RETURN_IF_ERROR(ValidateShape(shape));
  // Before the spec's lists are copied out of the proto (a CSR of 10^7 entries would otherwise
  // be held several times over by a call that is refused anyway).
  ATTN_RETURN_IF_ERROR(CheckHeaderSizes(header, kv_len, options_.max_spec_entries));
  ATTN_ASSIGN_OR_RETURN(AttentionSpec spec, SpecFromProto(header.spec()));
  // A context attend aligns the last query with the context's last row unless told otherwise.
  spec.q_offset = header.has_q_offset() ? header.q_offset()
                  : context_           ? std::max<int64_t>(0, kv_len - shape.tokens)
                                       : 0;
  spec.cu_seqlens_q.assign(header.cu_seqlens_q().begin(), header.cu_seqlens_q().end());
  spec.cu_seqlens_k.assign(header.cu_seqlens_k().begin(), header.cu_seqlens_k().end());
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, shape));
  ATTN_RETURN_IF_ERROR(CheckShardedAttend(header, spec));

  // The buffers this request allocates (tensors not read from a context or a region), reserved
  // against the server-wide cap before any of them exists.
  UploadBudget::Reservation reservation;
  if (options_.upload_budget != nullptr) {
    const int64_t allocated = SatAdd(header.has_q_region() ? 0 : q_bytes,
                                     SatAdd(context_ || header.has_k_region() ? 0 : kv_bytes,
                                            context_ || header.has_v_region() ? 0 : kv_bytes));
    ATTN_RETURN_IF_ERROR(options_.upload_budget->Reserve(allocated, "header: q, k and v",
                                                         &reservation));
  }
  std::array<HostTensor, 3> tensors;
  std::array<bool, 3> from_region{};
  if (context_) {
    ATTN_RETURN_IF_ERROR(ContextTensors(shape, &tensors));
    from_region[1] = from_region[2] = true;  // received: the context supplies them
  }
  ATTN_RETURN_IF_ERROR(ResolveTensors(header, shape, dtype, &tensors, &from_region));
  ATTN_RETURN_IF_ERROR(ResolveOutputs(header, shape, dtype));

  has_header_ = true;
  header_ = header;
  // spec_ holds the spec: the proto's copy of its lists (a CSR may be large) is not kept twice.
  header_.clear_spec();
  header_.clear_cu_seqlens_q();
  header_.clear_cu_seqlens_k();
  spec_ = std::move(spec);
  shape_ = shape;
  dtype_ = dtype;
  response_chunk_bytes_ = header.response_chunk_bytes() > 0 ? header.response_chunk_bytes()
                                                            : options_.default_response_chunk_bytes;
  tensors_ = std::move(tensors);
  tensor_bytes_ = {q_bytes, kv_bytes, kv_bytes};
  total_bytes_ = total;
  from_region_ = from_region;
  reservation_ = std::move(reservation);
  for (int i = 0; i < 3; ++i) {
    if (!from_region_[i]) continue;
    received_[i].Insert(0, tensor_bytes_[i], nullptr);
    received_bytes_ += tensor_bytes_[i];
  }
  return absl::OkStatus();
}

void RequestAssembler::ReleaseBuffers() {
  for (HostTensor& t : tensors_) t = HostTensor();
  reservation_.Release();
  ReleaseHolds();
}

void RequestAssembler::ReleaseHolds() {
  o_slice_.reset();
  lse_slice_.reset();
  device_io_ = DeviceIo();
  key_shards_.clear();
  context_.reset();
}

absl::Status RequestAssembler::ResolveTensors(const v1::AttendHeader& header,
                                              const AttentionShape& shape, DType dtype,
                                              std::array<HostTensor, 3>* tensors,
                                              std::array<bool, 3>* from_region) {
  const std::vector<int64_t> dims_q = {shape.batch, shape.tokens, shape.q_heads, shape.head_dim};
  const std::vector<int64_t> dims_kv = {shape.batch, shape.kv_len(), shape.kv_heads,
                                        shape.head_dim};
  const bool has_ref[3] = {header.has_q_region(), header.has_k_region(), header.has_v_region()};
  const v1::RegionRef* refs[3] = {&header.q_region(), &header.k_region(), &header.v_region()};
  for (int i = 0; i < 3; ++i) {
    if ((*from_region)[i]) continue;  // the context's K / V
    const std::vector<int64_t>& dims = i == 0 ? dims_q : dims_kv;
    if (has_ref[i]) {
      const int64_t bytes = SatMul(SatMul(SatMul(SatMul(dims[0], dims[1]), dims[2]), dims[3]),
                                   static_cast<int64_t>(DTypeSize(dtype)));
      const std::string field = absl::StrCat("header.", kTensorNames[i], "_region");
      const std::string what = absl::StrCat(
          kTensorNames[i], " ", ShapeString(dims[0], dims[1], dims[2], dims[3], dtype));
      ATTN_ASSIGN_OR_RETURN(RegionSlice slice,
                            ResolveRegionRef(options_.regions, options_.region_owner, *refs[i],
                                             field, bytes, what));
      (*from_region)[i] = true;
      if (DeviceTensorView view = InPlaceView(slice, dtype, dims); !view.empty()) {
        DeviceTensorView* slots[3] = {&device_io_.q, &device_io_.k, &device_io_.v};
        *slots[i] = std::move(view);
        continue;  // read in place: no host tensor
      }
      absl::StatusOr<HostTensor> t =
          TensorFromSlice(slice, dtype, dims, options_.tracker, options_.host_memory);
      if (!t.ok()) {
        return absl::Status(t.status().code(), absl::StrCat(field, ": ", t.status().message()));
      }
      (*tensors)[i] = *std::move(t);
      continue;
    }
    absl::StatusOr<HostTensor> t =
        HostTensor::Create(dtype, dims, options_.tracker, options_.host_memory);
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat(kTensorNames[i], ": ", t.status().message()));
    }
    (*tensors)[i] = *std::move(t);
  }
  return absl::OkStatus();
}

absl::Status RequestAssembler::ResolveOutputs(const v1::AttendHeader& header,
                                              const AttentionShape& shape, DType dtype) {
  if (header.has_lse_region() && !header.has_o_region()) {
    return absl::InvalidArgumentError("header.lse_region: only allowed together with o_region");
  }
  if (header.has_lse_region() && !header.return_lse()) {
    return absl::InvalidArgumentError("header.lse_region: set, but return_lse is false");
  }
  if (!header.has_o_region()) return absl::OkStatus();
  if (header.return_lse() && !header.has_lse_region()) {
    return absl::InvalidArgumentError(
        "header.lse_region: required with o_region when return_lse is true");
  }
  const int64_t o_bytes = SatMul(
      SatMul(SatMul(SatMul(shape.batch, shape.tokens), shape.q_heads), shape.head_dim),
      static_cast<int64_t>(DTypeSize(dtype)));
  ATTN_ASSIGN_OR_RETURN(
      RegionSlice o,
      ResolveRegionRef(options_.regions, options_.region_owner, header.o_region(),
                       "header.o_region", o_bytes,
                       absl::StrCat("o ", ShapeString(shape.batch, shape.tokens, shape.q_heads,
                                                      shape.head_dim, dtype))));
  o_slice_ = std::move(o);
  if (header.return_lse()) {
    const int64_t lse_bytes =
        SatMul(SatMul(SatMul(shape.batch, shape.q_heads), shape.tokens), int64_t{4});
    absl::StatusOr<RegionSlice> lse = ResolveRegionRef(
        options_.regions, options_.region_owner, header.lse_region(), "header.lse_region",
        lse_bytes,
        absl::StrCat("lse [", shape.batch, ", ", shape.q_heads, ", ", shape.tokens, "] f32"));
    if (!lse.ok()) {
      o_slice_.reset();
      return lse.status();
    }
    lse_slice_ = *std::move(lse);
  }
  // An output written over another output, or over an input the run is still reading, would
  // leave garbage in both (found by fuzz_request_assembler: o_region and lse_region at one offset).
  if (absl::Status s = CheckOutputRefsDisjoint(header); !s.ok()) {
    o_slice_.reset();
    lse_slice_.reset();
    return s;
  }
  outputs_in_regions_ = true;  // the slices stand (kept past ReleaseHolds, which drops them)
  // Direct when every output slice is host-mapped or can be written in place on the run's GPU.
  const auto on_device = [](const RegionSlice& slice) {
    return slice.lease->host_data() == nullptr;
  };
  const std::vector<int64_t> o_dims = {shape.batch, shape.tokens, shape.q_heads, shape.head_dim};
  const std::vector<int64_t> lse_dims = {shape.batch, shape.q_heads, shape.tokens};
  DeviceTensorView o_view, lse_view;
  if (on_device(*o_slice_)) o_view = InPlaceView(*o_slice_, dtype, o_dims);
  if (lse_slice_ && on_device(*lse_slice_)) {
    lse_view = InPlaceView(*lse_slice_, DType::kF32, lse_dims);
  }
  outputs_direct_ = (!on_device(*o_slice_) || !o_view.empty()) &&
                    (!lse_slice_ || !on_device(*lse_slice_) || !lse_view.empty());
  if (outputs_direct_) {
    device_io_.o = std::move(o_view);
    device_io_.lse = std::move(lse_view);
  }
  if (device_io_.cuda_ordinal() < 0) in_place_ordinal_ = -1;  // views refused above: none left
  return absl::OkStatus();
}

DeviceTensorView RequestAssembler::InPlaceView(const RegionSlice& slice, DType dtype,
                                               const std::vector<int64_t>& dims) {
  Region& region = *slice.lease;
  std::byte* base = region.device_data();
  const int device = region.device();
  if (base == nullptr) return DeviceTensorView();
  // A context split over devices runs on several GPUs: its Q and outputs go through host memory.
  if (context_ && context_->sharded()) return DeviceTensorView();
  const bool ours = std::find(options_.in_place_cuda_ordinals.begin(),
                              options_.in_place_cuda_ordinals.end(),
                              device) != options_.in_place_cuda_ordinals.end();
  // One GPU per request: a region on another GPU than the first in-place one is copied.
  if (!ours || (in_place_ordinal_ >= 0 && device != in_place_ordinal_)) return DeviceTensorView();
  in_place_ordinal_ = device;
  DeviceTensorView view;
  view.data = base + slice.offset;
  view.cuda_ordinal = device;
  view.dtype = dtype;
  view.dims = dims;
  view.owner = slice.lease;
  return view;
}

absl::Status RequestAssembler::WriteOutputs(const HostTensor& o, const HostTensor& lse) const {
  if (!o_slice_) return absl::OkStatus();
  ATTN_RETURN_IF_ERROR(WriteToSlice(*o_slice_, o));
  if (lse_slice_) ATTN_RETURN_IF_ERROR(WriteToSlice(*lse_slice_, lse));
  return absl::OkStatus();
}

absl::StatusOr<AttentionOutputs> RequestAssembler::OutputViews() const {
  AttentionOutputs views;
  if (!o_slice_ || !outputs_direct_) return views;
  const AttentionShape& s = shape_;
  if (o_slice_->lease->host_data() != nullptr) {
    ATTN_ASSIGN_OR_RETURN(views.o, TensorFromSlice(*o_slice_, dtype_,
                                                   {s.batch, s.tokens, s.q_heads, s.head_dim},
                                                   nullptr, nullptr));
  }
  if (lse_slice_ && lse_slice_->lease->host_data() != nullptr) {
    ATTN_ASSIGN_OR_RETURN(views.lse, TensorFromSlice(*lse_slice_, DType::kF32,
                                                     {s.batch, s.q_heads, s.tokens}, nullptr,
                                                     nullptr));
  }
  return views;
}

absl::Status RequestAssembler::AddChunk(const v1::TensorChunk& chunk) {
  if (!has_header_) return absl::InvalidArgumentError("header: must be the first message");
  const int index = TensorIndex(chunk.tensor());
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.tensor: must be TENSOR_Q, TENSOR_K or TENSOR_V, got ",
                     TensorKindName(chunk.tensor())));
  }
  const absl::string_view name = kTensorNames[index];
  if (from_region_[index]) {
    return absl::InvalidArgumentError(absl::StrCat("chunk for ", name, ": header.", name,
                                                   "_region already supplies ", name));
  }
  const int64_t size = static_cast<int64_t>(chunk.data().size());
  if (size > options_.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for ", name, ": ", size,
                     " bytes, above --max-chunk-bytes=", options_.max_chunk_bytes));
  }
  if (chunk.offset() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for ", name, ": offset must be >= 0, got ", chunk.offset()));
  }
  const int64_t tensor_bytes = tensor_bytes_[index];
  HostTensor& tensor = tensors_[index];
  if (chunk.offset() > tensor_bytes - size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk for ", name, ": bytes [", chunk.offset(), ", ", SatAdd(chunk.offset(), size),
        ") past the end of the tensor (", tensor_bytes, " bytes for ", tensor.DebugString(), ")"));
  }
  std::pair<int64_t, int64_t> overlap;
  if (!received_[index].Insert(chunk.offset(), chunk.offset() + size, &overlap)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk for ", name, ": bytes [", chunk.offset(), ", ", chunk.offset() + size,
        ") overlap bytes [", overlap.first, ", ", overlap.second, ") received before"));
  }
  if (size > 0) std::memcpy(tensor.data() + chunk.offset(), chunk.data().data(), size);
  received_bytes_ += size;
  return absl::OkStatus();
}

bool RequestAssembler::all_received() const {
  return has_header_ && received_bytes_ == total_bytes_;
}

absl::Status RequestAssembler::Complete() const {
  if (!has_header_) return absl::InvalidArgumentError("header: must be the first message");
  for (int i = 0; i < 3; ++i) {
    if (received_[i].covered_bytes() != tensor_bytes_[i]) {
      return absl::InvalidArgumentError(absl::StrCat(kTensorNames[i], ": received ",
                                                     received_[i].covered_bytes(), " of ",
                                                     tensor_bytes_[i], " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve

namespace attnserve {

absl::Status RequestAssembler::ResolveContext(const v1::AttendHeader& header, DType dtype) {
  if (options_.contexts == nullptr) {
    return absl::FailedPreconditionError("header.context: this server keeps no contexts");
  }
  if (header.has_k_region() || header.has_v_region()) {
    return absl::InvalidArgumentError(
        "header.k_region / v_region: not allowed with header.context (the context supplies K and "
        "V)");
  }
  absl::StatusOr<ContextView> view =
      options_.contexts->Acquire(options_.region_owner, header.context());
  if (!view.ok()) {
    return absl::Status(view.status().code(),
                        absl::StrCat("header.context: ", view.status().message()));
  }
  const auto mismatch = [&](absl::string_view field, const std::string& got,
                            const std::string& theirs) {
    return absl::InvalidArgumentError(absl::StrCat("header.", field, ": ", got, ", but context '",
                                                   header.context(), "' has ", theirs));
  };
  if (header.batch() != 1) {
    return mismatch("batch", absl::StrCat(header.batch()), "one sequence (batch must be 1)");
  }
  if (dtype != view->dtype) {
    return mismatch("dtype", std::string(DTypeName(dtype)), std::string(DTypeName(view->dtype)));
  }
  if (header.kv_heads() != view->kv_heads) {
    return mismatch("kv_heads", absl::StrCat(header.kv_heads()), absl::StrCat(view->kv_heads));
  }
  if (header.head_dim() != view->head_dim) {
    return mismatch("head_dim", absl::StrCat(header.head_dim()), absl::StrCat(view->head_dim));
  }
  if (header.kv_tokens() != 0 && header.kv_tokens() != view->tokens) {
    return mismatch("kv_tokens", absl::StrCat(header.kv_tokens()),
                    absl::StrCat(view->tokens, " rows (send 0 to use them all)"));
  }
  if (view->tokens == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("header.context: context '", header.context(), "' has no rows yet"));
  }
  context_ = *std::move(view);
  return absl::OkStatus();
}

absl::Status RequestAssembler::ContextTensors(const AttentionShape& shape,
                                              std::array<HostTensor, 3>* tensors) {
  const ContextView& c = *context_;
  const std::vector<int64_t> dims = {1, shape.kv_len(), shape.kv_heads, shape.head_dim};
  const size_t bytes = static_cast<size_t>(shape.kv_len() * shape.kv_heads * shape.head_dim) *
                       DTypeSize(c.dtype);
  std::byte* data[2] = {c.k_data, c.v_data};
  if (c.sharded()) {
    // Every shard's rows where the context keeps them; the request runs on all their devices.
    for (const ContextShardView& s : c.shards) {
      KeyShard shard;
      shard.device = s.device_index;
      shard.start = s.start;
      shard.rows = s.tokens;
      const std::vector<int64_t> shard_dims = {1, s.tokens, shape.kv_heads, shape.head_dim};
      const size_t shard_bytes =
          static_cast<size_t>(s.tokens * shape.kv_heads * shape.head_dim) * DTypeSize(c.dtype);
      if (!s.on_device) {
        ATTN_ASSIGN_OR_RETURN(shard.k,
                              HostTensor::Wrap(c.dtype, shard_dims, s.k_data, shard_bytes, c.hold));
        ATTN_ASSIGN_OR_RETURN(shard.v,
                              HostTensor::Wrap(c.dtype, shard_dims, s.v_data, shard_bytes, c.hold));
      } else {
        for (auto [view, ptr] : {std::pair{&shard.k_dev, s.k_data}, {&shard.v_dev, s.v_data}}) {
          view->data = ptr;
          view->cuda_ordinal = s.cuda_ordinal;
          view->dtype = c.dtype;
          view->dims = shard_dims;
          view->owner = c.hold;
        }
      }
      key_shards_.push_back(std::move(shard));
    }
    return absl::OkStatus();
  }
  if (!c.on_device) {
    for (int i = 0; i < 2; ++i) {
      ATTN_ASSIGN_OR_RETURN((*tensors)[i + 1],
                            HostTensor::Wrap(c.dtype, dims, data[i], bytes, c.hold));
    }
    return absl::OkStatus();
  }
  // On a GPU: read in place, so the request runs on the context's GPU (and a region on another
  // GPU named by the same request is copied).
  in_place_ordinal_ = c.cuda_ordinal;
  DeviceTensorView* slots[2] = {&device_io_.k, &device_io_.v};
  for (int i = 0; i < 2; ++i) {
    slots[i]->data = data[i];
    slots[i]->cuda_ordinal = c.cuda_ordinal;
    slots[i]->dtype = c.dtype;
    slots[i]->dims = dims;
    slots[i]->owner = c.hold;
  }
  return absl::OkStatus();
}

absl::Status RequestAssembler::CheckShardedAttend(const v1::AttendHeader& header,
                                                  const AttentionSpec& spec) const {
  const bool sharded = context_ && context_->sharded();
  if (!sharded) {
    if (header.placement() == v1::PLACEMENT_CONTEXT_PARALLEL) {
      return absl::InvalidArgumentError(
          "header.placement: CONTEXT_PARALLEL runs attends against a context split over several "
          "devices only");
    }
    return absl::OkStatus();
  }
  const std::string what = absl::StrCat("context '", header.context(), "' is split over ",
                                        context_->shards.size(), " devices");
  if (header.placement() != v1::PLACEMENT_AUTO &&
      header.placement() != v1::PLACEMENT_CONTEXT_PARALLEL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.placement: ", what, " and runs context parallel (AUTO or CONTEXT_PARALLEL)"));
  }
  if (IsPacked(spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.cu_seqlens_q: ", what, "; packed sequences are not supported there"));
  }
  if (!std::holds_alternative<DenseSpec>(spec.pattern) &&
      !std::holds_alternative<WindowSpec>(spec.pattern)) {
    return absl::UnimplementedError(absl::StrCat(
        "header.spec: ", what, ", which runs dense and window specs only (",
        std::string(PatternName(spec.pattern)),
        " is defined over the whole sequence; create the context with shards = 1 for it)"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve
