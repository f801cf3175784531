// CreateContext, AppendContext, GetContext, DeleteContext, ListContexts over the service's
// ContextStore (server/contexts/). A context belongs to the principal that created it (the
// anonymous "" without a token file): another principal's calls do not find it (NOT_FOUND).
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/util/json.h"
#include "core/util/log_safe.h"
#include "core/util/status_macros.h"
#include "grpc/grpc.h"
#include "server/grpc/call_outcome.h"
#include "server/grpc/service.h"
#include "server/request_log.h"
#include "spdlog/spdlog.h"
#include "wire/convert.h"
#include "wire/status.h"

namespace attnserve {
namespace {

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

void ContextStatusToProto(const ContextInfo& info, v1::ContextStatus* out) {
  const ContextConfig& c = info.config;
  out->set_name(c.name);
  out->set_dtype(DTypeToProto(c.dtype));
  out->set_kv_heads(c.kv_heads);
  out->set_head_dim(c.head_dim);
  out->set_tokens(info.tokens);
  out->set_capacity_tokens(c.capacity_tokens);
  out->set_reserved_tokens(info.reserved_tokens);
  out->set_bytes(info.bytes);
  out->set_device(info.device);
  out->set_ttl_seconds(absl::ToInt64Seconds(c.ttl));
  out->set_idle_seconds(info.idle_seconds);
  out->set_attends(info.attends);
  out->set_in_use(info.in_use);
  out->set_shards_requested(c.shards);
  for (const ContextShardInfo& shard : info.shards) {
    v1::ContextShard* s = out->add_shards();
    s->set_device(shard.device);
    s->set_start(shard.start);
    s->set_tokens(shard.tokens);
    s->set_reserved_tokens(shard.reserved_tokens);
    s->set_bytes(shard.bytes);
  }
}

// One AppendContext call: the header, then K and V chunks into page-locked host tensors (or
// region views), then, at the client's half-close, one commit into the context. gRPC runs one
// read at a time; mu_ orders the reads' reactions against the watchdog (CheckLimits), which may
// end a stream that is idle or too slow. Finish runs once; a read started (starting_) is never
// overtaken by it, and no read follows it.
class AttentionServiceImpl::AppendReactor final
    : public grpc::ServerReadReactor<v1::AppendContextRequest>,
      public WatchedStream {
 public:
  AppendReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* context,
                v1::AppendContextResponse* response)
      : service_(service),
        context_(context),
        response_(response),
        start_(absl::Now()),
        last_message_(start_) {
    service_->CallStarted();
    service_->watchdog_->Add(this);
    // Refused before the first read: the server is draining, or the caller has no valid token or
    // no free stream.
    absl::Status refused;
    if (service_->draining()) {
      refused = absl::UnavailableError("server is draining");
    } else {
      absl::StatusOr<std::shared_ptr<auth::Principal>> caller =
          service_->AdmitStream(*context_, &stream_slot_);
      if (caller.ok()) {
        caller_ = *std::move(caller);
      } else {
        refused = caller.status();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!refused.ok()) {
        final_ = refused;
        finished_ = true;
      } else {
        ++starting_;
      }
    }
    if (!refused.ok()) {
      Finish(ToGrpcStatus(refused));
      return;
    }
    StartReadAndSettle();
  }

  void OnReadDone(bool ok) override {
    absl::Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (final_) return;  // the watchdog ended the call (and Finish is on its way)
      last_message_ = absl::Now();
      if (ok && request_.has_chunk()) {
        received_bytes_ += static_cast<int64_t>(request_.chunk().data().size());
      }
      if (ok) {
        s = Add();
      } else if (request_.chunk().offset() != kUnreadMarker) {
        // A message arrived but did not parse (see attend_reactor.cc); gRPC leaves the call open.
        if (!has_header_) name_ = request_.header().context();
        s = UnparseableMessage(request_, "AppendContextRequest");
      } else {
        // The client half-closed, or gRPC ended the call (then Finish goes nowhere and OnDone
        // logs gRPC's status instead). A read that failed without the stream failing first, on a
        // call gRPC ended, was a message gRPC dropped for its size.
        read_dropped_ = grpc_call_failed_before_recv_message(context_->c_call()) == 0;
        s = context_->IsCancelled() ? absl::CancelledError("cancelled") : Commit();
      }
      request_.Clear();  // a chunk's payload is copied: free it now
      if (!ok || !s.ok()) {
        final_ = s;
        finished_ = true;
      } else {
        ++starting_;
      }
    }
    if (!ok || !s.ok()) {
      Finish(ToGrpcStatus(s));  // OnDone logs the outcome
      return;
    }
    StartReadAndSettle();
  }

  // The watchdog's round: a stream still uploading that is idle or too slow ends with
  // DEADLINE_EXCEEDED, its staged rows freed at once.
  std::function<void()> CheckLimits(absl::Time now) override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || final_) return nullptr;
    std::optional<absl::Status> verdict =
        CheckUpload(service_->options_.streams, start_, last_message_, received_bytes_, now,
                    "appending to the context");
    if (!verdict) return nullptr;
    final_ = *std::move(verdict);
    tensors_ = {};
    reservation_.Release();
    if (starting_ > 0) return nullptr;  // StartReadAndSettle finishes the call
    finished_ = true;
    return [this, status = ToGrpcStatus(*final_)] { Finish(status); };
  }

  void OnDone() override {
    service_->watchdog_->Remove(this);
    // What the client received: ours, unless gRPC ended the call first (it is then cancelled,
    // and our status never left).
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status = final_.value_or(absl::UnknownError("the call ended without an outcome"));
    }
    if (context_->IsCancelled()) {
      CallEnd end;
      end.server_stopping = service_->stopping();
      end.oversized_message = read_dropped_;
      end.stage = "receiving the rows";
      status = EndedByGrpc(*context_, end);
    }
    LogEvent e("append_context");
    e.Str("context", name_.empty() ? "-" : name_, 128);
    if (caller_ != nullptr && !caller_->name().empty()) e.Str("principal", caller_->name(), 128);
    e.Custom("code", GrpcCodeName(ToGrpcStatus(status).error_code()), "code",
             JsonQuote(GrpcCodeName(ToGrpcStatus(status).error_code())));
    e.Int("rows", tokens_).Int("bytes_in", received_bytes_);
    e.Seconds("total", absl::ToDoubleSeconds(absl::Now() - start_));
    if (!status.ok()) e.Str("error", std::string(status.message()), 1024);
    e.Log(status.ok() ? spdlog::level::info : spdlog::level::warn);
    AttentionServiceImpl* service = service_;
    delete this;  // frees the staged rows
    service->CallEnded();
  }

 private:
  absl::Status Add() {
    if (request_.has_header()) return AddHeader(request_.header());
    if (request_.has_chunk()) return AddChunk(request_.chunk());
    return absl::InvalidArgumentError("request.message: one of header, chunk must be set");
  }

  absl::Status AddHeader(const v1::AppendContextHeader& h) {
    if (has_header_) return absl::InvalidArgumentError("header: sent twice");
    name_ = h.context();
    ATTN_ASSIGN_OR_RETURN(ContextInfo info, service_->contexts_->Get(caller_->name(), name_));
    if (h.tokens() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.tokens: must be >= 1, got ", h.tokens()));
    }
    const ContextConfig& c = info.config;
    const int64_t row_bytes = c.kv_heads * c.head_dim * static_cast<int64_t>(DTypeSize(c.dtype));
    const int64_t limit = service_->options_.limits.max_request_bytes;
    if (h.tokens() > limit / (2 * row_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "header.tokens: ", h.tokens(), " rows of K and V exceed --max-request-bytes=", limit,
          " (append in pieces)"));
    }
    ATTN_RETURN_IF_ERROR(
        caller_->CheckRequestBytes(h.tokens() * row_bytes * 2, "header.tokens: k and v rows"));
    tokens_ = h.tokens();
    bytes_ = tokens_ * row_bytes;
    row_bytes_ = row_bytes;
    ATTN_RETURN_IF_ERROR(service_->upload_budget_->Reserve(
        (h.has_k_region() ? 0 : bytes_) + (h.has_v_region() ? 0 : bytes_), "header: k and v",
        &reservation_));
    if (h.has_expect_tokens()) expect_ = h.expect_tokens();
    const std::vector<int64_t> dims = {tokens_, c.kv_heads, c.head_dim};
    const v1::RegionRef* refs[2] = {&h.k_region(), &h.v_region()};
    const bool has_ref[2] = {h.has_k_region(), h.has_v_region()};
    for (int i = 0; i < 2; ++i) {
      const char* const name = i == 0 ? "k" : "v";
      if (has_ref[i]) {
        ATTN_ASSIGN_OR_RETURN(
            RegionSlice slice,
            ResolveRegionRef(service_->regions_.get(), caller_->name(), *refs[i],
                             absl::StrCat("header.", name, "_region"), bytes_,
                             absl::StrCat(name, " [", tokens_, ", ", c.kv_heads, ", ", c.head_dim,
                                          "] ", std::string(DTypeName(c.dtype)))));
        ATTN_ASSIGN_OR_RETURN(
            tensors_[i], TensorFromSlice(slice, c.dtype, dims, &service_->request_memory_,
                                         &service_->pool_->device(0).host_memory()));
        received_[i].Insert(0, bytes_, nullptr);
        from_region_[i] = true;
        continue;
      }
      ATTN_ASSIGN_OR_RETURN(tensors_[i],
                            HostTensor::Create(c.dtype, dims, &service_->request_memory_,
                                               &service_->pool_->device(0).host_memory()));
    }
    has_header_ = true;
    return absl::OkStatus();
  }

  absl::Status AddChunk(const v1::TensorChunk& chunk) {
    if (!has_header_) return absl::InvalidArgumentError("header: must be the first message");
    const int i = chunk.tensor() == v1::TENSOR_K ? 0 : chunk.tensor() == v1::TENSOR_V ? 1 : -1;
    if (i < 0) return absl::InvalidArgumentError("chunk.tensor: must be TENSOR_K or TENSOR_V");
    const char* const name = i == 0 ? "k" : "v";
    if (from_region_[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk for ", name, ": header.", name, "_region already supplies ", name));
    }
    const int64_t size = static_cast<int64_t>(chunk.data().size());
    if (size > service_->options_.limits.max_chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk for ", name, ": ", size,
                                                     " bytes, above --max-chunk-bytes"));
    }
    if (chunk.offset() < 0 || chunk.offset() > bytes_ - size) {
      return absl::InvalidArgumentError(absl::StrCat("chunk for ", name, ": bytes [",
                                                     chunk.offset(), ", +", size,
                                                     ") outside the ", bytes_, " bytes of ", name));
    }
    std::pair<int64_t, int64_t> overlap;
    if (!received_[i].Insert(chunk.offset(), chunk.offset() + size, &overlap)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk for ", name, ": bytes [", chunk.offset(), ", ", chunk.offset() + size,
          ") overlap bytes [", overlap.first, ", ", overlap.second, ") received before"));
    }
    if (size > 0) std::memcpy(tensors_[i].data() + chunk.offset(), chunk.data().data(), size);
    return absl::OkStatus();
  }

  absl::Status Commit() {
    if (!has_header_) return absl::InvalidArgumentError("header: must be the first message");
    for (int i = 0; i < 2; ++i) {
      if (received_[i].covered_bytes() != bytes_) {
        return absl::InvalidArgumentError(absl::StrCat(i == 0 ? "k" : "v", ": received ",
                                                       received_[i].covered_bytes(), " of ",
                                                       bytes_, " bytes"));
      }
    }
    // The caller's max_resident_bytes: rows past the context's reservation make it grow.
    std::unique_lock<std::mutex> resident(caller_->resident_mu(), std::defer_lock);
    if (caller_->limits().max_resident_bytes > 0) {
      resident.lock();
      ATTN_ASSIGN_OR_RETURN(ContextInfo now, service_->contexts_->Get(caller_->name(), name_));
      const int64_t growth =
          std::max<int64_t>(0, now.tokens + tokens_ - now.reserved_tokens) * row_bytes_ * 2;
      ATTN_RETURN_IF_ERROR(caller_->CheckResident(service_->ResidentBytes(caller_->name()), growth,
                                                  "append: k and v rows past the reservation"));
    }
    ATTN_ASSIGN_OR_RETURN(ContextInfo info, service_->contexts_->Append(
                                                caller_->name(), name_, tokens_, tensors_[0].data(),
                                                tensors_[1].data(), expect_));
    ContextStatusToProto(info, response_->mutable_context());
    return absl::OkStatus();
  }

  // Starts the next read (the request marked with kUnreadMarker), then finishes the call if the watchdog ended it meanwhile (it leaves
  // Finish to us while a read is being started).
  void StartReadAndSettle() {
    request_.Clear();
    request_.mutable_chunk()->set_offset(kUnreadMarker);
    StartRead(&request_);
    std::optional<grpc::Status> finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --starting_;
      if (final_ && !finished_ && starting_ == 0) {
        finished_ = true;
        finish = ToGrpcStatus(*final_);
      }
    }
    if (finish) Finish(*finish);
  }

  AttentionServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  v1::AppendContextResponse* const response_;
  std::mutex mu_;
  std::optional<absl::Status> final_;  // decided by a read or by the watchdog
  bool finished_ = false;              // Finish is called (or owed by whoever set this)
  int starting_ = 0;                   // reads being started
  const absl::Time start_;
  absl::Time last_message_;
  int64_t received_bytes_ = 0;  // chunk payload bytes
  bool read_dropped_ = false;   // the last read failed without the stream failing first
  UploadBudget::Reservation reservation_;
  v1::AppendContextRequest request_;
  auth::StreamSlot stream_slot_;             // one of the caller's streams, for the whole call
  std::shared_ptr<auth::Principal> caller_;  // set before the first read
  int64_t row_bytes_ = 0;                    // of one K (or V) row
  bool has_header_ = false;
  std::string name_;
  int64_t tokens_ = 0;
  int64_t bytes_ = 0;  // of K, and of V
  std::optional<int64_t> expect_;
  std::array<HostTensor, 2> tensors_;
  std::array<ByteRangeSet, 2> received_;
  std::array<bool, 2> from_region_{};
};

grpc::ServerReadReactor<v1::AppendContextRequest>* AttentionServiceImpl::AppendContext(
    grpc::CallbackServerContext* context, v1::AppendContextResponse* response) {
  return new AppendReactor(this, context, response);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::CreateContext(
    grpc::CallbackServerContext* context, const v1::CreateContextRequest* request,
    v1::CreateContextResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  ContextConfig config;
  config.name = request->name();
  absl::StatusOr<DType> dtype = DTypeFromProto(request->dtype(), "dtype");
  if (!dtype.ok()) return FinishWith(context, dtype.status());
  config.dtype = *dtype;
  config.kv_heads = request->kv_heads();
  config.head_dim = request->head_dim();
  config.capacity_tokens = request->capacity_tokens();
  config.shards = request->shards();
  if (request->ttl_seconds() < 0) {
    return FinishWith(context, absl::InvalidArgumentError(absl::StrCat(
                                   "ttl_seconds: must be >= 0, got ", request->ttl_seconds())));
  }
  config.ttl = absl::Seconds(request->ttl_seconds());
  const std::string& owner = (*caller)->name();
  // The caller's max_resident_bytes: created, then counted (a growable context's first rows are
  // only known once made), and deleted again when over, all under the caller's resident lock.
  std::unique_lock<std::mutex> resident((*caller)->resident_mu(), std::defer_lock);
  int64_t held = 0;
  if ((*caller)->limits().max_resident_bytes > 0) {
    resident.lock();
    held = ResidentBytes(owner);
  }
  absl::StatusOr<ContextInfo> info = contexts_->CreateContext(owner, config);
  if (info.ok() && resident.owns_lock()) {
    if (absl::Status s = (*caller)->CheckResident(held, info->bytes, "create context"); !s.ok()) {
      (void)contexts_->Delete(owner, config.name);
      info = s;
    }
  }
  if (!info.ok()) {
    spdlog::warn("create context {}: {}", LogValue(request->name(), 128),
                 SanitizeForLog(info.status().ToString(), 1024));
    return FinishWith(context, info.status());
  }
  spdlog::info("create context {} on {}: {} bytes reserved{}", LogValue(config.name, 128),
               info->device,
               info->bytes,
               info->shards.size() > 1 ? absl::StrCat(" in ", info->shards.size(), " shards") : "");
  ContextStatusToProto(*info, response->mutable_context());
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetContext(grpc::CallbackServerContext* context,
                                                           const v1::GetContextRequest* request,
                                                           v1::GetContextResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  absl::StatusOr<ContextInfo> info = contexts_->Get((*caller)->name(), request->name());
  if (info.ok()) ContextStatusToProto(*info, response->mutable_context());
  return FinishWith(context, info.status());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::DeleteContext(
    grpc::CallbackServerContext* context, const v1::DeleteContextRequest* request,
    v1::DeleteContextResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  absl::StatusOr<int64_t> in_use = contexts_->Delete((*caller)->name(), request->name());
  if (in_use.ok()) {
    spdlog::info("delete context {}{}", LogValue(request->name(), 128),
                 *in_use > 0 ? absl::StrCat(": ", *in_use, " request(s) still use it") : "");
    response->set_in_use(*in_use);
  }
  return FinishWith(context, in_use.status());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ListContexts(
    grpc::CallbackServerContext* context, const v1::ListContextsRequest* /*request*/,
    v1::ListContextsResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  for (const ContextInfo& info : contexts_->List((*caller)->name())) {
    ContextStatusToProto(info, response->add_contexts());
  }
  return FinishWith(context, absl::OkStatus());
}

}  // namespace attnserve
