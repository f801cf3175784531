// The Attend stream: one reactor per call (see the class comment).
#include "server/grpc/service.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "wire/convert.h"
#include "wire/status.h"
#include "spdlog/spdlog.h"

namespace attnserve {
namespace {

constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(100);

// A gRPC deadline as an absl::Time (no deadline: InfiniteFuture).
absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 100)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

std::string SpecSummary(const AttentionSpec& spec) {
  std::string s(PatternName(spec.pattern));
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    absl::StrAppend(&s, "/", std::string(GeneratorName(bs->generator)), "/b", bs->block_size);
  }
  if (spec.causal) absl::StrAppend(&s, "+causal");
  return s;
}

}  // namespace

// One Attend call. Reactions may run concurrently on gRPC threads, and the job's completion
// arrives on a worker thread, so state lives under mu_. gRPC operations (StartRead, StartWrite,
// Finish) are only started after mu_ is released: gRPC may run a reaction inline from inside
// them. Finish happens once: after an outcome is decided, with no write in flight, no operation
// being started and no job outstanding on the scheduler (the job's callback points at this
// reactor), so OnDone -- which deletes the reactor -- cannot overtake any of them.
class AttentionServiceImpl::AttendReactor final
    : public grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse> {
 public:
  AttendReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        caller_(service->AdmitStream(*context, &stream_slot_)),
        assembler_(AssemblerLimits(service, caller_)),
        start_(absl::Now()) {
    service_->CallStarted();
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
        reading_ = true;
        a.read = true;
        ++starting_;
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
      if (final_) {
        // An outcome is already decided; nothing more to read.
      } else if (!ok) {
        // The client half-closed (or the call is going away). Before the job is submitted this
        // means input is missing.
        if (context_->IsCancelled()) {
          // OnCancel decides the outcome.
        } else if (stage_ == Stage::kReceiving) {
          absl::Status s = assembler_.Complete();
          final_ = s.ok() ? absl::InternalError("request complete but not submitted") : s;
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
      if (!final_) {
        // A client whose deadline passes cancels the stream itself, often a little before the
        // server's copy of the deadline (which starts when the headers arrive) expires: a cancel
        // that close to the deadline is the deadline.
        final_ = absl::Now() + kDeadlineSlack >= DeadlineOf(*context_)
                     ? absl::DeadlineExceededError(
                           absl::StrCat("deadline exceeded while ", StageName(stage_)))
                     : absl::CancelledError(
                           absl::StrCat("cancelled by the client while ", StageName(stage_)));
      }
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

  void OnDone() override {
    const absl::Status status = final_.value_or(absl::UnknownError("finished without an outcome"));
    const grpc::StatusCode code = ToGrpcStatus(status).error_code();
    if (!recorded_) RecordOutcome(code);
    const double total = absl::ToDoubleSeconds(absl::Now() - start_);
    const AttentionShape& sh = assembler_.shape();
    const std::string line = absl::StrFormat(
        "attend id=%s shape=[%d, %d, %d/%d, %d] %s spec=%s code=%s receive=%.3fs queue=%.3fs "
        "compute=%.3fs (copy=%.4fs kernel=%.4fs) total=%.3fs devices=%s%s%s",
        request_id_.empty() ? "-" : request_id_, sh.batch, sh.tokens, sh.q_heads, sh.kv_heads,
        sh.head_dim, assembler_.has_header() ? std::string(DTypeName(assembler_.dtype())) : "-",
        assembler_.has_header() ? SpecSummary(assembler_.spec()) : "-", GrpcCodeName(code),
        receive_seconds_, queue_seconds_, compute_seconds_, copy_seconds_, kernel_seconds_, total,
        devices_.empty() ? "-" : absl::StrJoin(devices_, ","),
        status.ok() ? "" : " error=", status.ok() ? "" : std::string(status.message()));
    if (status.ok()) {
      spdlog::info(line);
    } else {
      spdlog::warn(line);
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
    if (request_.has_chunk()) {
      service_->metrics_->AddReceivedBytes(static_cast<int64_t>(request_.chunk().data().size()));
    }
    if (request_.has_header() && !assembler_.has_header()) {
      if (absl::Status s = CheckAttendHeader(**caller_, request_.header()); !s.ok()) {
        final_ = s;
        return;
      }
    }
    if (absl::Status s = assembler_.Add(request_); !s.ok()) {
      final_ = s;
      return;
    }
    if (request_.has_header()) {
      request_id_ = request_.header().request_id().empty() ? service_->NextRequestId()
                                                           : request_.header().request_id();
    }
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
        job_.reset();  // frees the inputs now
        final_ = s;
        return;
      }
    }
    // Keep one read in flight: more chunks, the half-close, or a stray extra message.
    reading_ = true;
    ++starting_;
    a->read = true;
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
    finished_ = true;
    a.finish = ToGrpcStatus(*final_);
    // Counted before the status goes out, so a caller that sees its status and then scrapes
    // /metrics finds its call counted.
    RecordOutcome(a.finish->error_code());
    return a;
  }

  // The request counters of this call: exactly once, at Finish (or at OnDone if it never came).
  void RecordOutcome(grpc::StatusCode code) {
    recorded_ = true;
    const double total = absl::ToDoubleSeconds(absl::Now() - start_);
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
  std::string request_id_;
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
