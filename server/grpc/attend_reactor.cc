// The Attend stream: one reactor per call (see the class comment).
#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/util/json.h"
#include "core/util/log_safe.h"
#include "grpc/grpc.h"
#include "server/grpc/call_outcome.h"
#include "server/grpc/service.h"
#include "server/request_log.h"
#include "spdlog/spdlog.h"
#include "wire/convert.h"
#include "wire/status.h"

namespace attnserve {

// One Attend call. Reactions may run concurrently on gRPC threads, and the job's completion
// arrives on a worker thread, so state lives under mu_. gRPC operations (StartRead, StartWrite,
// Finish) are only started after mu_ is released: gRPC may run a reaction inline from inside
// them. Finish happens once: after an outcome is decided, with no write in flight, no operation
// being started and no job outstanding on the scheduler (the job's callback points at this
// reactor), so OnDone -- which deletes the reactor -- cannot overtake any of them.
// The service's watchdog checks the stream's idle and minimum-rate limits (CheckLimits) from its
// own thread; it may decide the outcome like any other reaction.
class AttentionServiceImpl::AttendReactor final
    : public grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>,
      public WatchedStream {
 public:
  AttendReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        caller_(service->AdmitStream(*context, &stream_slot_)),
        assembler_(AssemblerLimits(service, caller_)),
        start_(absl::Now()),
        last_message_(start_) {
    service_->CallStarted();
    service_->watchdog_->Add(this);
    service_->metrics_->AddInflight(1);
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (service_->draining()) {
        final_ = absl::UnavailableError("server is draining");
        a = FinishIfReadyLocked();
      } else if (!caller_.ok()) {
        final_ = caller_.status();  // no token, a wrong one, or the caller's streams are all used
        a = FinishIfReadyLocked();
      } else {
        a.read = ArmReadLocked();
      }
    }
    Execute(a);
  }

  void OnReadDone(bool ok) override {
    Scheduler* const scheduler = service_->scheduler_;
    Actions a;
    std::shared_ptr<Job> to_cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      // A failed read: a message that did not parse, the client's half-close, or gRPC ending the
      // call (then whether the stream failed before a message tells a cancel from a message
      // gRPC dropped).
      const bool marker_intact = request_.chunk().offset() == kUnreadMarker;
      const bool failed_before_message =
          !ok && grpc_call_failed_before_recv_message(context_->c_call()) != 0;
      if (!ok) {
        spdlog::debug("call {}: read ended: marker_intact={} cancelled={}/{} failed_before={}",
                      LogValue(LoggedIdLocked(), 128), marker_intact, cancelled_,
                      context_->IsCancelled(), failed_before_message);
      }
      if (!ok && cancelled_) {
        // OnCancel ran while this read was in flight and its outcome waited for this read: a
        // read that failed without the stream failing first is a message gRPC received and
        // dropped (no parse was tried), which it only does for one above the max receive size.
        if (!failed_before_message && marker_intact && stage_ == Stage::kReceiving) {
          oversized_message_ = true;
          if (!finished_) final_ = EndedByGrpc(*context_, CallEndLocked());
        }
      } else if (final_) {
        // An outcome is already decided; nothing more to read.
      } else if (!ok) {
        if (!marker_intact) {
          // A message arrived and failed to parse. gRPC leaves the call open: our status is the
          // client's. The id is logged when the header got that far.
          if (!assembler_.has_header() && request_.header().request_id().size() > 0) {
            client_id_ = request_.header().request_id();
          }
          final_ = UnparseableMessage(request_, "AttendRequest");
        } else if (context_->IsCancelled()) {
          // gRPC ended the call; OnCancel (next) decides.
          if (!failed_before_message && stage_ == Stage::kReceiving) oversized_message_ = true;
        } else if (stage_ == Stage::kReceiving) {
          absl::Status s = assembler_.Complete();
          final_ = s.ok() ? absl::InternalError("request complete but not submitted") : s;
          // The client's half-close, or a message gRPC dropped for its size whose cancel has not
          // reached this call yet: both look the same here. Only OnDone knows (the call is then
          // cancelled, and our status never left), so the outcome is recorded there.
          if (!failed_before_message) record_at_done_ = true;
        } else {
          // The request's half-close. OK is only sent after it, so that anything the client sends
          // after the last input byte is always seen and refused, however fast the job ran.
          half_closed_ = true;
          if (all_written_) final_ = absl::OkStatus();
        }
      } else if (stage_ == Stage::kReceiving) {
        OnMessageLocked(&a);
      } else {
        // Every input byte has arrived and the job is queued or done: nothing else may come.
        final_ = absl::InvalidArgumentError(
            request_.has_header()
                ? "header: sent twice"
                : absl::StrCat("chunk for ", TensorShortName(request_.chunk().tensor()),
                               ": every byte of q, k and v has already arrived"));
        to_cancel = CancelJobLocked();
      }
      a = Merge(a, FinishIfReadyLocked());
    }
    if (to_cancel) {
      // The job is outstanding, so nothing else was decided; Cancel may complete the job on this
      // thread, which may finish and delete this reactor: touch nothing afterwards.
      scheduler->Cancel(to_cancel.get());
      return;
    }
    Execute(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok && !final_) {
        final_ = absl::CancelledError("the client went away while the response was sent");
      }
      if (!final_) a = NextWriteLocked();
      a = Merge(a, FinishIfReadyLocked());
    }
    Execute(a);
  }

  void OnCancel() override {
    Scheduler* const scheduler = service_->scheduler_;
    Actions a;
    std::shared_ptr<Job> to_cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      spdlog::debug("call {}: attend cancelled: reading={} decided={}",
                    LogValue(LoggedIdLocked(), 128), reading_, final_.has_value());
      // (A call the server itself ends, e.g. on a timeout, sets final_ and finishes; it must not
      // TryCancel: a cancelled call is logged with the status gRPC gave the client.)
      // Whatever the server decided, gRPC ended the call: the client got gRPC's status. With a
      // read in flight, the call finishes only after it (FinishIfReadyLocked), which may still
      // find the cause was an oversized message.
      if (!finished_) final_ = EndedByGrpc(*context_, CallEndLocked());
      to_cancel = CancelJobLocked();
      a = FinishIfReadyLocked();
    }
    if (to_cancel) {
      // As in OnReadDone: this reactor may be gone once Cancel returns.
      scheduler->Cancel(to_cancel.get());
      return;
    }
    Execute(a);
  }

  // The watchdog's round (see WatchedStream): ends a stream that is silent too long while it
  // uploads or owes the half-close, or uploads too slowly, with DEADLINE_EXCEEDED.
  std::function<void()> CheckLimits(absl::Time now) override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || final_) return nullptr;  // busy: not idle
    const StreamLimits& limits = service_->options_.streams;
    std::optional<absl::Status> verdict;
    if (stage_ == Stage::kReceiving) {
      verdict = CheckUpload(limits, start_, last_message_, received_bytes_, now, StageName(stage_));
    } else if (all_written_ && !half_closed_) {
      verdict = CheckIdle(limits, all_written_at_, now,
                          "waiting for the client's half-close after the response");
    }
    if (!verdict) return nullptr;
    final_ = *std::move(verdict);
    if (stage_ == Stage::kReceiving) assembler_.ReleaseBuffers();  // nothing submitted: go now
    Actions a = FinishIfReadyLocked();
    if (!a.finish) return nullptr;  // the operation in progress finishes the call
    // Finish is owed by this caller alone, so OnDone (which deletes this) cannot come before it.
    return [this, status = *a.finish] { Finish(status); };
  }
  void OnDone() override {
    service_->watchdog_->Remove(this);
    if (!recorded_) {
      // Finish never ran (gRPC ended the call: OnCancel set final_ then, as it does on every
      // path that skips Finish), or the outcome waited for this point (record_at_done_).
      absl::Status status =
          final_.value_or(absl::UnknownError("the call ended without an outcome"));
      if (record_at_done_ && context_->IsCancelled()) {
        oversized_message_ = true;
        status = EndedByGrpc(*context_, CallEndLocked());
      }
      RecordOutcome(ToGrpcStatus(status));
    }
    AttentionServiceImpl* service = service_;
    delete this;  // releases the request and response buffers
    service->CallEnded();
  }

 private:
  enum class Stage { kReceiving, kQueued, kSending };
  struct Actions {
    bool read = false;
    bool write = false;
    std::optional<grpc::Status> finish;
  };

  static AssemblerOptions AssemblerLimits(
      AttentionServiceImpl* service,
      const absl::StatusOr<std::shared_ptr<auth::Principal>>& caller) {
    AssemblerOptions o = service->options_.limits;
    o.tracker = &service->request_memory_;
    o.host_memory = &service->pool_->device(0).host_memory();
    o.regions = service->regions_.get();
    // The caller's regions and contexts only (an unauthenticated call never reads a message).
    o.region_owner = caller.ok() ? (*caller)->name() : "";
    o.contexts = service->contexts_.get();
    o.upload_budget = service->upload_budget_.get();
    for (size_t i = 0; i < service->pool_->size(); ++i) {
      const int ordinal = service->pool_->device(i).cuda_ordinal();
      if (ordinal >= 0) o.in_place_cuda_ordinals.push_back(ordinal);
    }
    return o;
  }

  static const char* StageName(Stage s) {
    switch (s) {
      case Stage::kReceiving:
        return "receiving the request";
      case Stage::kQueued:
        return "queued or running";
      case Stage::kSending:
        return "sending the response";
    }
    return "?";
  }

  static Actions Merge(Actions a, const Actions& b) {
    a.read |= b.read;
    a.write |= b.write;
    if (b.finish) a.finish = b.finish;
    return a;
  }

  // One message while receiving: a header or a chunk. Submits the job once complete.
  void OnMessageLocked(Actions* a) {
    last_message_ = absl::Now();
    if (request_.has_chunk()) {
      const int64_t bytes = static_cast<int64_t>(request_.chunk().data().size());
      received_bytes_ += bytes;
      service_->metrics_->AddReceivedBytes(bytes);
    }
    if (request_.has_header() && !assembler_.has_header()) {
      // Kept before validation, so that a refused header is logged with the id it carried.
      client_id_ = request_.header().request_id();
    }
    if (request_.has_header() && !assembler_.has_header()) {
      if (absl::Status s = CheckAttendHeader(**caller_, request_.header()); !s.ok()) {
        final_ = s;
        request_.Clear();
        return;
      }
    }
    if (absl::Status s = assembler_.Add(request_); !s.ok()) {
      final_ = s;
      request_.Clear();
      assembler_.ReleaseBuffers();  // refused: its memory and leases go now, not at OnDone
      return;
    }
    if (request_.has_header()) {
      request_id_ = request_.header().request_id().empty() ? service_->NextRequestId()
                                                           : request_.header().request_id();
    }
    // Consumed: freed now, not when the next read replaces it (never, for a silent client).
    request_.Clear();
    if (assembler_.all_received()) {
      receive_seconds_ = absl::ToDoubleSeconds(absl::Now() - start_);
      auto job = std::make_shared<Job>();
      job->id = request_id_;
      job->spec = assembler_.spec();
      job->shape = assembler_.shape();
      job->dtype = assembler_.dtype();
      job->placement_hint = PlacementHintFromProto(assembler_.header().placement());
      job->q = assembler_.TakeQ();
      job->k = assembler_.TakeK();
      job->v = assembler_.TakeV();
      if (absl::StatusOr<AttentionOutputs> into = assembler_.OutputViews(); into.ok()) {
        job->outputs_into = *std::move(into);
      } else {
        final_ = into.status();
        return;
      }
      job->device_io = assembler_.TakeDeviceIo();
      job->key_shards = assembler_.TakeKeyShards();
      job->deadline = DeadlineOf(*context_);
      job->done = [this](JobResult result) { OnJobDone(std::move(result)); };
      job_ = job;
      job_outstanding_ = true;
      stage_ = Stage::kQueued;
      if (absl::Status s = service_->scheduler_->Submit(std::move(job)); !s.ok()) {
        job_outstanding_ = false;
        job_.reset();                 // frees the inputs now
        assembler_.ReleaseBuffers();  // and the reservation and leases
        final_ = s;
        return;
      }
    }
    // Keep one read in flight: more chunks, the half-close, or a stray extra message.
    a->read = ArmReadLocked();
  }

  // Marks the request message (kUnreadMarker) and counts the read about to start.
  bool ArmReadLocked() {
    request_.Clear();
    request_.mutable_chunk()->set_offset(kUnreadMarker);
    reading_ = true;
    ++starting_;
    return true;
  }

  CallEnd CallEndLocked() const {
    CallEnd end;
    end.server_stopping = service_->stopping();
    end.oversized_message = oversized_message_;
    end.stage = StageName(stage_);
    return end;
  }

  // The id the log shows: the echoed one (the client's, or one made up for an empty id), else
  // the one a refused header carried, else "-".
  const std::string& LoggedIdLocked() const {
    static const std::string* const kNone = new std::string("-");
    if (!request_id_.empty()) return request_id_;
    if (!client_id_.empty()) return client_id_;
    return *kNone;
  }

  // From a worker (or the scheduler) thread, exactly once per submitted job.
  void OnJobDone(JobResult result) {
    // Outputs named by region refs are written here, before mu_: the assembler's slices were set
    // with the header and do not change after the job was submitted.
    // (A single-device run wrote them already: its outputs come back empty.)
    if (result.status.ok() && assembler_.outputs_in_regions() && !result.outputs.o.empty()) {
      result.status = assembler_.WriteOutputs(result.outputs.o, result.outputs.lse);
      result.outputs = AttentionOutputs();  // the response carries the header only
    }
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_outstanding_ = false;
      job_.reset();
      assembler_.JobDone();  // the reservation, region leases and context go before the response
      queue_seconds_ = result.queue_seconds;
      compute_seconds_ = result.info.compute_seconds;
      copy_seconds_ = result.info.copy_seconds;
      kernel_seconds_ = result.info.kernel_seconds;
      devices_ = result.devices;
      if (!final_) {
        if (!result.status.ok()) {
          final_ = result.status;
        } else {
          stage_ = Stage::kSending;
          result_ = std::move(result);
          a = NextWriteLocked();
        }
      }
      a = Merge(a, FinishIfReadyLocked());
    }
    Execute(a);
  }

  std::shared_ptr<Job> CancelJobLocked() {
    if (!job_outstanding_ || job_ == nullptr) return nullptr;
    job_->cancel.store(true);
    return job_;
  }

  // Prepares the next response message (header, O chunks, LSE chunks); sets final_ = OK after
  // the last one has been written.
  Actions NextWriteLocked() {
    Actions a;
    response_.Clear();
    const v1::AttendHeader& h = assembler_.header();
    const HostTensor& o = result_.outputs.o;
    const HostTensor& lse = result_.outputs.lse;
    const bool in_regions = assembler_.outputs_in_regions();
    const int64_t elem = static_cast<int64_t>(DTypeSize(assembler_.dtype()));
    const int64_t o_bytes = in_regions ? h.batch() * h.tokens() * h.q_heads() * h.head_dim() * elem
                                       : static_cast<int64_t>(o.nbytes());
    const int64_t lse_bytes = !h.return_lse() ? 0
                              : in_regions    ? h.batch() * h.q_heads() * h.tokens() * 4
                                              : static_cast<int64_t>(lse.nbytes());
    if (!header_sent_) {
      header_sent_ = true;
      v1::AttendResponseHeader* r = response_.mutable_header();
      r->set_request_id(request_id_);
      r->set_dtype(h.dtype());
      for (int64_t d : {h.batch(), h.tokens(), h.q_heads(), h.head_dim()}) r->add_o_shape(d);
      if (h.return_lse()) {
        for (int64_t d : {h.batch(), h.q_heads(), h.tokens()}) r->add_lse_shape(d);
      }
      r->set_o_bytes(o_bytes);
      r->set_lse_bytes(lse_bytes);
      r->set_backend(std::string(BackendName(service_->pool_->backend())));
      r->set_placement(PlacementToProto(result_.placement));
      for (const std::string& d : result_.devices) r->add_devices(d);
      r->set_receive_seconds(receive_seconds_);
      r->set_queue_seconds(result_.queue_seconds);
      r->set_compute_seconds(result_.info.compute_seconds);
      r->set_copy_seconds(result_.info.copy_seconds);
      r->set_kernel_seconds(result_.info.kernel_seconds);
      r->set_copy_bytes(result_.info.copy_bytes);
      r->set_sparsity(result_.info.sparsity);
      r->set_flops(result_.info.flops);
      r->set_outputs_in_regions(in_regions);
    } else if (in_regions) {
      // O and LSE are in the caller's regions already: the header was the whole response.
      all_written_ = true;
      all_written_at_ = absl::Now();
      if (half_closed_) final_ = absl::OkStatus();
      return a;
    } else {
      const int64_t chunk = assembler_.response_chunk_bytes();
      const bool on_o = send_offset_ < o_bytes;
      const int64_t tensor_bytes = on_o ? o_bytes : lse_bytes;
      const int64_t offset = on_o ? send_offset_ : send_offset_ - o_bytes;
      if (!on_o && offset >= lse_bytes) {
        // Everything has been written: release the outputs now rather than at OnDone. The call
        // ends OK once the client has half-closed (see OnReadDone).
        result_.outputs = AttentionOutputs();
        all_written_ = true;
        all_written_at_ = absl::Now();
        if (half_closed_) final_ = absl::OkStatus();
        return a;
      }
      const int64_t n = std::min(chunk, tensor_bytes - offset);
      const std::byte* base = on_o ? o.data() : lse.data();
      v1::TensorChunk* c = response_.mutable_chunk();
      c->set_tensor(on_o ? v1::TENSOR_O : v1::TENSOR_LSE);
      c->set_offset(offset);
      c->set_data(reinterpret_cast<const char*>(base + offset), static_cast<size_t>(n));
      send_offset_ += n;
      sent_bytes_ += n;
      service_->metrics_->AddSentBytes(n);
    }
    write_in_flight_ = true;
    ++starting_;
    a.write = true;
    return a;
  }

  Actions FinishIfReadyLocked() {
    Actions a;
    if (!final_ || finished_ || write_in_flight_ || job_outstanding_ || starting_ > 0) return a;
    // A cancelled call waits for its read in flight: its failure tells the cause (OnReadDone).
    if (cancelled_ && reading_) return a;
    finished_ = true;
    a.finish = ToGrpcStatus(*final_);
    // Counted and logged before the status goes out, so a caller that sees its status and then
    // scrapes /metrics (or reads the log) finds its call there.
    if (!record_at_done_) RecordOutcome(*a.finish);
    return a;
  }

  // The one place a call's outcome is counted (attnserve_requests_total{code}) and logged (the
  // request line): exactly once, at Finish (or at OnDone if it never came), with the status the
  // client received. Every path that ends a call sets final_ to that status (see OnCancel and
  // call_outcome.h for the ones gRPC ends).
  void RecordOutcome(const grpc::Status& status) {
    recorded_ = true;
    const grpc::StatusCode code = status.error_code();
    const double total = absl::ToDoubleSeconds(absl::Now() - start_);
    LogRequestLine(status, total);
    service_->metrics_->RecordRequest(code, total);
    service_->metrics_->AddInflight(-1);
    if (code == grpc::StatusCode::OK) {
      StageSeconds s;
      s.receive = receive_seconds_;
      s.queue = queue_seconds_;
      s.compute = compute_seconds_;
      s.copy = copy_seconds_;
      s.kernel = kernel_seconds_;
      s.send = std::max(0.0, total - receive_seconds_ - queue_seconds_ - compute_seconds_);
      service_->metrics_->RecordStages(s);
    }
  }

  // The request line (server/README.md "Logs"): client-supplied text sanitized by LogEvent.
  void LogRequestLine(const grpc::Status& status, double total) const {
    LogEvent e("attend");
    e.Custom("id", LogValue(LoggedIdLocked(), kMaxRequestIdBytes), "request_id",
             JsonQuote(SanitizeForLog(LoggedIdLocked(), kMaxRequestIdBytes)));
    e.Custom("code", GrpcCodeName(status.error_code()), "code",
             JsonQuote(GrpcCodeName(status.error_code())));
    if (assembler_.has_header()) {
      const AttentionShape& sh = assembler_.shape();
      e.Custom("shape",
               absl::StrFormat("[%d,%d,%d/%d,%d]", sh.batch, sh.tokens, sh.q_heads, sh.kv_heads,
                               sh.head_dim),
               "shape",
               absl::StrFormat("[%d,%d,%d,%d,%d]", sh.batch, sh.tokens, sh.q_heads, sh.kv_heads,
                               sh.head_dim));
      e.Str("dtype", DTypeName(assembler_.dtype()));
      e.Str("spec", SpecSummary(assembler_.spec()));
      if (!assembler_.header().context().empty()) e.Str("context", assembler_.header().context());
    }
    e.Int("bytes_in", received_bytes_).Int("bytes_out", sent_bytes_);
    e.Seconds("receive", receive_seconds_).Seconds("queue", queue_seconds_);
    e.Seconds("compute", compute_seconds_).Seconds("copy", copy_seconds_);
    e.Seconds("kernel", kernel_seconds_).Seconds("total", total);
    e.Str("devices", devices_.empty() ? "-" : absl::StrJoin(devices_, ","));
    if (caller_.ok() && !(*caller_)->name().empty()) e.Str("principal", (*caller_)->name(), 128);
    if (!status.ok()) e.Str("error", status.error_message(), 1024);
    e.Log(status.ok() ? spdlog::level::info : spdlog::level::warn);
  }

  // Runs the decided operations outside mu_. Nothing touches `this` after Finish.
  void Execute(const Actions& a) {
    if (a.read) StartRead(&request_);
    if (a.write) StartWrite(&response_);
    if (a.read || a.write) {
      Actions more;
      {
        std::lock_guard<std::mutex> lock(mu_);
        starting_ -= (a.read ? 1 : 0) + (a.write ? 1 : 0);
        more = FinishIfReadyLocked();
      }
      if (more.finish) Finish(*more.finish);
      return;
    }
    if (a.finish) Finish(*a.finish);
  }

  AttentionServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // The caller (server/auth/) and its stream, held for the whole call; before assembler_, whose
  // owner it names.
  auth::StreamSlot stream_slot_;
  const absl::StatusOr<std::shared_ptr<auth::Principal>> caller_;

  std::mutex mu_;
  Stage stage_ = Stage::kReceiving;
  RequestAssembler assembler_;
  v1::AttendRequest request_;    // target of the read in flight
  v1::AttendResponse response_;  // source of the write in flight
  std::string request_id_;       // echoed in the response: the client's (valid) id or one made up
  std::string client_id_;        // the id a header carried, as sent (logged when refused)
  bool oversized_message_ = false;  // gRPC refused a message above its max receive size
  bool record_at_done_ = false;     // the outcome is only known at OnDone (see OnReadDone)
  int64_t received_bytes_ = 0;      // chunk payload bytes
  int64_t sent_bytes_ = 0;
  std::shared_ptr<Job> job_;  // while submitted
  bool job_outstanding_ = false;
  bool reading_ = false;
  bool write_in_flight_ = false;
  bool cancelled_ = false;
  int starting_ = 0;  // operations decided under mu_ but not yet started
  bool header_sent_ = false;
  bool recorded_ = false;     // RecordOutcome ran
  bool all_written_ = false;  // every response message has been written
  bool half_closed_ = false;  // the client half-closed after the request was complete
  int64_t send_offset_ = 0;  // over O then LSE
  JobResult result_;
  std::optional<absl::Status> final_;  // the outcome, once decided
  bool finished_ = false;
  const absl::Time start_;
  absl::Time last_message_;    // of the request stream (start_ before any)
  absl::Time all_written_at_;  // when the last response message was written
  double receive_seconds_ = 0;
  double queue_seconds_ = 0;
  double compute_seconds_ = 0;
  double copy_seconds_ = 0;
  double kernel_seconds_ = 0;
  std::vector<std::string> devices_;
};

grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>* AttentionServiceImpl::Attend(
    grpc::CallbackServerContext* context) {
  return new AttendReactor(this, context);
}

}  // namespace attnserve
