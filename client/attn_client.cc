#include "client/attn_client.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/attend_input.h"
#include "client/client_security.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_callback.h"
#include "wire/convert.h"
#include "wire/status.h"

namespace attnserve::client {
namespace {

namespace v1 = ::attnserve::v1;

// Extra wait past the call's own deadline before the client cancels a call itself: gRPC ends a
// call at its deadline, so this only guards against a call that somehow never completes.
constexpr absl::Duration kCompletionGrace = absl::Seconds(5);

std::string ShapeString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

absl::Time DeadlineFor(const CallOptions& options) {
  if (options.timeout == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + options.timeout;
}

void ConfigureContext(const CallOptions& options, absl::Time deadline,
                      grpc::ClientContext& context) {
  if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
  context.set_wait_for_ready(options.wait_for_ready);
}

// The bytes of one tensor as they arrive: a destination buffer plus the byte ranges filled so far,
// so overlaps and gaps are caught exactly.
class TensorAssembler {
 public:
  TensorAssembler(std::string name, HostTensor* tensor) : name_(std::move(name)), tensor_(tensor) {}

  absl::Status Add(int64_t offset, const std::string& data) {
    const int64_t total = static_cast<int64_t>(tensor_->nbytes());
    const int64_t size = static_cast<int64_t>(data.size());
    if (offset < 0 || offset > total || size > total - offset) {
      return absl::DataLossError(absl::StrCat("response chunk of ", name_, " at offset ", offset,
                                              " with ", size, " bytes runs past its ", total,
                                              " bytes"));
    }
    if (size == 0) return absl::OkStatus();
    const int64_t end = offset + size;
    // Ranges are kept merged; the first range starting after `offset` and its predecessor are
    // the only ones that can overlap [offset, end).
    auto next = ranges_.upper_bound(offset);
    if (next != ranges_.end() && next->first < end) return Overlap(offset, end);
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->second > offset) return Overlap(offset, end);
    }
    std::memcpy(tensor_->data() + offset, data.data(), data.size());
    received_ += size;
    int64_t start = offset;
    int64_t stop = end;
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->second == offset) {
        start = prev->first;
        ranges_.erase(prev);
      }
    }
    if (next != ranges_.end() && next->first == end) {
      stop = next->second;
      ranges_.erase(next);
    }
    ranges_[start] = stop;
    return absl::OkStatus();
  }

  absl::Status CheckComplete() const {
    const int64_t total = static_cast<int64_t>(tensor_->nbytes());
    if (received_ != total) {
      return absl::DataLossError(absl::StrCat("response ended with ", total - received_, " of ",
                                              total, " bytes of ", name_, " missing"));
    }
    return absl::OkStatus();
  }

  int64_t received() const { return received_; }

 private:
  absl::Status Overlap(int64_t offset, int64_t end) const {
    return absl::DataLossError(absl::StrCat("response chunk of ", name_, " [", offset, ", ", end,
                                            ") overlaps bytes already received"));
  }

  std::string name_;
  HostTensor* tensor_;
  std::map<int64_t, int64_t> ranges_;  // start -> end of merged, disjoint received ranges
  int64_t received_ = 0;
};

// One upload piece: `bytes` bytes of `tensor` starting at `offset`.
struct ChunkRef {
  v1::TensorKind kind;
  const HostTensor* tensor;
  int64_t offset;
  int64_t bytes;
};

// One attempt of an Attend call, driven by gRPC's callback API: one write in flight (header, then
// chunks, then WritesDone) and one read in flight for the whole call. All state below mu_ is shared
// between the read and write reactions, which gRPC may run at the same time.
class AttendCall final : public grpc::ClientBidiReactor<v1::AttendRequest, v1::AttendResponse> {
 public:
  AttendCall(const AttendInput& input, const v1::AttendHeader& header, int64_t chunk_bytes,
             const CallOptions& options, absl::Time deadline, int attempt)
      : header_(header), progress_fn_(options.progress), attempt_(attempt) {
    ConfigureContext(options, deadline, context_);
    deadline_ = deadline;
    const std::pair<v1::TensorKind, const HostTensor*> tensors[] = {
        {v1::TENSOR_Q, input.q}, {v1::TENSOR_K, input.k}, {v1::TENSOR_V, input.v}};
    for (const auto& [kind, tensor] : tensors) {
      if (tensor == nullptr) continue;  // from a region
      const int64_t total = static_cast<int64_t>(tensor->nbytes());
      for (int64_t offset = 0; offset < total; offset += chunk_bytes) {
        chunks_.push_back({kind, tensor, offset, std::min(chunk_bytes, total - offset)});
      }
      progress_.send_total_bytes += total;
    }
    progress_.attempt = attempt;
  }

  // Runs the attempt to completion and returns its outcome. `received_any` says whether any
  // response message arrived (a retry is only safe when none did).
  absl::StatusOr<AttendResult> Run(v1::AttentionService::Stub* stub, bool* received_any) {
    start_ = absl::Now();
    stub->async()->Attend(&context_, this);
    request_.mutable_header()->CopyFrom(header_);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();

    {
      std::unique_lock<std::mutex> lock(done_mu_);
      // gRPC ends the call at its deadline; the grace bound covers a call that never completes.
      const absl::Time give_up =
          deadline_ == absl::InfiniteFuture() ? deadline_ : deadline_ + kCompletionGrace;
      bool cancelled = false;
      while (!done_) {
        if (give_up == absl::InfiniteFuture() || cancelled) {
          done_cv_.wait(lock);
          continue;
        }
        if (done_cv_.wait_until(lock, absl::ToChronoTime(give_up)) == std::cv_status::timeout &&
            !done_) {
          context_.TryCancel();
          cancelled = true;
        }
      }
    }

    std::lock_guard<std::mutex> lock(mu_);
    *received_any = received_any_;
    if (!protocol_error_.ok()) return protocol_error_;
    if (!final_status_.ok()) return FromGrpcStatus(final_status_);
    if (!have_header_) {
      return absl::DataLossError("server closed the stream with OK but sent no response header");
    }
    if (!writes_done_) {
      return absl::DataLossError("server closed the stream with OK before the upload finished");
    }
    if (o_assembler_) {
      if (auto s = o_assembler_->CheckComplete(); !s.ok()) return s;
    }
    if (lse_assembler_) {
      if (auto s = lse_assembler_->CheckComplete(); !s.ok()) return s;
    }
    AttendResult result;
    result.header = std::move(response_header_);
    result.o = std::move(o_);
    if (lse_assembler_) result.lse = std::move(lse_);
    result.attempts = attempt_;
    result.upload_seconds = absl::ToDoubleSeconds(upload_end_ - start_);
    result.total_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    return result;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the stream is broken; OnDone brings the status
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (request_.has_chunk()) progress_.sent_bytes += request_.chunk().data().size();
      if (next_chunk_ < chunks_.size()) {
        const ChunkRef& c = chunks_[next_chunk_++];
        v1::TensorChunk* chunk = request_.mutable_chunk();
        chunk->set_tensor(c.kind);
        chunk->set_offset(c.offset);
        chunk->mutable_data()->assign(reinterpret_cast<const char*>(c.tensor->data()) + c.offset,
                                      static_cast<size_t>(c.bytes));
      } else {
        finished = true;
        writes_done_ = true;
        upload_end_ = absl::Now();
      }
      ReportProgressLocked();
    }
    if (finished) {
      StartWritesDone();
    } else {
      StartWrite(&request_);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone brings the status
    bool failed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_any_ = true;
      absl::Status s = HandleResponseLocked();
      if (s.ok()) {
        ReportProgressLocked();
      } else {
        if (protocol_error_.ok()) protocol_error_ = s;
        failed = true;
      }
    }
    if (failed) {
      context_.TryCancel();  // no further reads: the call ends with the recorded error
      return;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_status_ = status;
    }
    std::lock_guard<std::mutex> lock(done_mu_);
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  absl::Status HandleResponseLocked() {
    if (response_.has_header()) {
      if (have_header_) return absl::DataLossError("server sent a second response header");
      have_header_ = true;
      response_header_ = response_.header();
      return AllocateOutputsLocked();
    }
    if (!response_.has_chunk()) {
      return absl::DataLossError("server sent a response with neither header nor chunk");
    }
    if (!have_header_) return absl::DataLossError("server sent a chunk before the response header");
    if (!o_assembler_) {
      return absl::DataLossError("server sent an output chunk after outputs_in_regions");
    }
    const v1::TensorChunk& chunk = response_.chunk();
    absl::Status s;
    if (chunk.tensor() == v1::TENSOR_O) {
      s = o_assembler_->Add(chunk.offset(), chunk.data());
    } else if (chunk.tensor() == v1::TENSOR_LSE && lse_assembler_) {
      s = lse_assembler_->Add(chunk.offset(), chunk.data());
    } else {
      return absl::DataLossError(absl::StrCat("server sent a chunk of unexpected tensor ",
                                              v1::TensorKind_Name(chunk.tensor())));
    }
    if (s.ok()) progress_.received_bytes += static_cast<int64_t>(chunk.data().size());
    return s;
  }

  // Checks the response header against the request and allocates O and LSE from its shapes.
  absl::Status AllocateOutputsLocked() {
    const v1::AttendResponseHeader& h = response_header_;
    absl::StatusOr<DType> dtype = DTypeFromProto(h.dtype(), "response header.dtype");
    if (!dtype.ok()) {
      return absl::DataLossError(absl::StrCat("response header: ", dtype.status().message()));
    }
    const std::vector<int64_t> want_o = {header_.batch(), header_.tokens(), header_.q_heads(),
                                         header_.head_dim()};
    const std::vector<int64_t> o_shape(h.o_shape().begin(), h.o_shape().end());
    if (o_shape != want_o || h.dtype() != header_.dtype()) {
      return absl::DataLossError(absl::StrCat(
          "response header: O is ", ShapeString(o_shape), " ", v1::DType_Name(h.dtype()),
          ", expected ", ShapeString(want_o), " ", v1::DType_Name(header_.dtype())));
    }
    if (h.outputs_in_regions() != header_.has_o_region()) {
      return absl::DataLossError(absl::StrCat("response header: outputs_in_regions is ",
                                              h.outputs_in_regions(), " for a request ",
                                              header_.has_o_region() ? "with" : "without",
                                              " o_region"));
    }
    if (h.outputs_in_regions()) return absl::OkStatus();
    absl::StatusOr<HostTensor> o = HostTensor::Create(*dtype, o_shape);
    if (!o.ok()) return o.status();
    o_ = std::move(*o);
    if (h.o_bytes() != static_cast<int64_t>(o_.nbytes())) {
      return absl::DataLossError(absl::StrCat("response header: o_bytes is ", h.o_bytes(),
                                              ", expected ", o_.nbytes(), " for ",
                                              o_.DebugString()));
    }
    o_assembler_.emplace("O", &o_);
    progress_.receive_total_bytes = h.o_bytes();
    if (header_.return_lse()) {
      const std::vector<int64_t> want_lse = {header_.batch(), header_.q_heads(), header_.tokens()};
      const std::vector<int64_t> lse_shape(h.lse_shape().begin(), h.lse_shape().end());
      if (lse_shape != want_lse) {
        return absl::DataLossError(absl::StrCat("response header: LSE is ", ShapeString(lse_shape),
                                                ", expected ", ShapeString(want_lse)));
      }
      absl::StatusOr<HostTensor> lse = HostTensor::Create(DType::kF32, lse_shape);
      if (!lse.ok()) return lse.status();
      lse_ = std::move(*lse);
      if (h.lse_bytes() != static_cast<int64_t>(lse_.nbytes())) {
        return absl::DataLossError(absl::StrCat("response header: lse_bytes is ", h.lse_bytes(),
                                                ", expected ", lse_.nbytes()));
      }
      lse_assembler_.emplace("LSE", &lse_);
      progress_.receive_total_bytes += h.lse_bytes();
    }
    return absl::OkStatus();
  }

  void ReportProgressLocked() {
    if (progress_fn_) progress_fn_(progress_);
  }

  const v1::AttendHeader& header_;
  ProgressCallback progress_fn_;
  const int attempt_;
  grpc::ClientContext context_;
  absl::Time deadline_;
  absl::Time start_;
  std::vector<ChunkRef> chunks_;

  std::mutex mu_;
  v1::AttendRequest request_;    // the one write in flight
  v1::AttendResponse response_;  // the one read in flight
  size_t next_chunk_ = 0;
  bool writes_done_ = false;
  absl::Time upload_end_;
  bool received_any_ = false;
  bool have_header_ = false;
  v1::AttendResponseHeader response_header_;
  HostTensor o_;
  HostTensor lse_;
  std::optional<TensorAssembler> o_assembler_;
  std::optional<TensorAssembler> lse_assembler_;
  Progress progress_;
  absl::Status protocol_error_;
  grpc::Status final_status_;

  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AttnClient>> AttnClient::Create(ClientOptions options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target: must not be empty");
  if (options.chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: must be >= 1, got ", options.chunk_bytes));
  }
  if (options.max_attempts < 1 || options.max_attempts > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be in [1, 100], got ", options.max_attempts));
  }
  if (options.backoff_multiplier < 1.0 || options.initial_backoff < absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(
        "backoff: need multiplier >= 1 and 0 <= initial_backoff <= max_backoff");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  // Our own retries (Attend's rule) replace gRPC's transparent ones, which would not know when a
  // re-send is safe for a stream.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  auto credentials = options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  if (options.connections < 1 || options.connections > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections: must be in [1, 64], got ", options.connections));
  }
  const auto make_channel = [&](const grpc::ChannelArguments& a) {
    if (options.token.empty()) return grpc::CreateCustomChannel(options.target, credentials, a);
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> token;
    token.push_back(std::make_unique<BearerTokenInterceptorFactory>(options.token));
    return grpc::experimental::CreateCustomChannelWithInterceptors(options.target, credentials, a,
                                                                   std::move(token));
  };
  auto channel = make_channel(args);
  if (channel == nullptr) {
    return absl::InternalError(absl::StrCat("could not create a channel to ", options.target));
  }
  std::unique_ptr<AttnClient> client(new AttnClient(options, channel));
  // More connections: channels that do not share the first one's (gRPC would otherwise reuse
  // one subchannel, and so one TCP connection, for equal arguments).
  for (int c = 1; c < options.connections; ++c) {
    grpc::ChannelArguments own = args;
    own.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    own.SetInt("attnserve.connection", c);
    auto extra = make_channel(own);
    if (extra == nullptr) break;
    client->attend_stubs_.push_back(v1::AttentionService::NewStub(extra));
  }
  return client;
}

AttnClient::AttnClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::AttentionService::NewStub(channel_)),
      generic_stub_(std::make_unique<grpc::GenericStub>(channel_)) {
  attend_stubs_.push_back(v1::AttentionService::NewStub(channel_));
}

AttnClient::~AttnClient() = default;

bool AttnClient::SleepBeforeRetry(int retry, absl::Time deadline) {
  absl::Duration backoff = options_.initial_backoff;
  for (int i = 1; i < retry && backoff < options_.max_backoff; ++i) {
    backoff = backoff * options_.backoff_multiplier;
  }
  backoff = std::min(backoff, options_.max_backoff);
  thread_local std::mt19937_64 rng(std::random_device{}());
  backoff = backoff * std::uniform_real_distribution<double>(0.8, 1.2)(rng);
  if (absl::Now() + backoff >= deadline) return false;
  absl::SleepFor(backoff);
  return true;
}

absl::StatusOr<AttendResult> AttnClient::Attend(const AttendInput& input,
                                                const CallOptions& options) {
  absl::StatusOr<v1::AttendHeader> built = BuildAttendHeader(input);
  if (!built.ok()) return built.status();
  const v1::AttendHeader& header = *built;

  const absl::Time deadline = DeadlineFor(options);
  absl::Status last;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    if (attempt > 1 && !SleepBeforeRetry(attempt - 1, deadline)) break;
    AttendCall call(input, header, options_.chunk_bytes, options, deadline, attempt);
    bool received_any = false;
    // Each attempt on the next connection (a retry after UNAVAILABLE tries another one).
    auto* stub = attend_stubs_[next_stub_.fetch_add(1, std::memory_order_relaxed) %
                               attend_stubs_.size()].get();
    absl::StatusOr<AttendResult> result = call.Run(stub, &received_any);
    if (result.ok()) return result;
    last = result.status();
    if (last.code() != absl::StatusCode::kUnavailable || received_any) return last;
  }
  return last;
}

absl::StatusOr<v1::DescribeResponse> AttnClient::Describe(const CallOptions& options) {
  const absl::Time deadline = DeadlineFor(options);
  absl::Status last;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    if (attempt > 1 && !SleepBeforeRetry(attempt - 1, deadline)) break;
    grpc::ClientContext context;
    ConfigureContext(options, deadline, context);
    v1::DescribeResponse response;
    grpc::Status status = stub_->Describe(&context, v1::DescribeRequest(), &response);
    if (status.ok()) return response;
    last = FromGrpcStatus(status);
    if (last.code() != absl::StatusCode::kUnavailable) return last;
  }
  return last;
}

std::string_view ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown:
      return "UNKNOWN";
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "?";
}

absl::Status AttnClient::Health(const CallOptions& options, const std::string& service) {
  absl::StatusOr<ServingStatus> status = HealthCheck(options, service);
  if (!status.ok()) return status.status();
  if (*status == ServingStatus::kServing) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("health: service \"", service, "\" is ",
                                             std::string(ServingStatusName(*status))));
}

absl::StatusOr<ServingStatus> AttnClient::HealthCheck(const CallOptions& options,
                                                      const std::string& service) {
  // grpc.health.v1 messages are encoded by hand (two fields) so that this library carries no
  // copy of health.proto that could clash with one linked in elsewhere.
  // HealthCheckRequest { string service = 1; }
  std::string request_bytes;
  if (!service.empty()) {
    if (service.size() >= 128) {
      return absl::InvalidArgumentError("service: names of 128 bytes or more are not supported");
    }
    request_bytes.push_back('\x0a');
    request_bytes.push_back(static_cast<char>(service.size()));
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  const absl::Time deadline = DeadlineFor(options);
  ConfigureContext(options, deadline, context);

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic_stub_->UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                           &response, [&](grpc::Status s) {
                             std::lock_guard<std::mutex> lock(mu);
                             status = std::move(s);
                             done = true;
                             cv.notify_all();
                           });
  {
    std::unique_lock<std::mutex> lock(mu);
    const absl::Time give_up =
        deadline == absl::InfiniteFuture() ? deadline : deadline + kCompletionGrace;
    bool cancelled = false;
    while (!done) {
      if (give_up == absl::InfiniteFuture() || cancelled) {
        cv.wait(lock);
        continue;
      }
      if (cv.wait_until(lock, absl::ToChronoTime(give_up)) == std::cv_status::timeout && !done) {
        context.TryCancel();
        cancelled = true;
      }
    }
  }
  if (!status.ok()) return FromGrpcStatus(status);

  // HealthCheckResponse { enum ServingStatus status = 1; }: UNKNOWN 0, SERVING 1, NOT_SERVING 2,
  // SERVICE_UNKNOWN 3. Proto3 leaves a 0 value out, so an empty message means UNKNOWN.
  std::vector<grpc::Slice> slices;
  if (grpc::Status s = response.Dump(&slices); !s.ok()) return FromGrpcStatus(s);
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  int64_t serving_status = 0;
  for (size_t i = 0; i < bytes.size();) {
    const uint8_t tag = static_cast<uint8_t>(bytes[i++]);
    if (tag == 0x08) {  // field 1, varint
      uint64_t value = 0;
      int shift = 0;
      while (i < bytes.size() && shift < 64) {
        const uint8_t b = static_cast<uint8_t>(bytes[i++]);
        value |= static_cast<uint64_t>(b & 0x7f) << shift;
        shift += 7;
        if ((b & 0x80) == 0) break;
      }
      serving_status = static_cast<int64_t>(value);
    } else {
      break;  // fields other than 1 do not exist in this message version
    }
  }
  if (serving_status < 0 || serving_status > 3) {
    return absl::DataLossError(
        absl::StrCat("health: server reported unknown serving status ", serving_status));
  }
  return static_cast<ServingStatus>(serving_status);
}

}  // namespace attnserve::client
