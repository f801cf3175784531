// What the service tests share (service_test.cc, context_service_test.cc): a real grpc::Server
// with the CPU device on loopback (ServiceTest, with its baseline check of memory and gauges), and
// helpers that build a request, stream it through the generated stub and compare the outputs with
// the float64 reference.
#ifndef ATTNSERVE_SERVER_GRPC_SERVICE_TEST_SUPPORT_H_
#define ATTNSERVE_SERVER_GRPC_SERVICE_TEST_SUPPORT_H_

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cpu/cpu_device.h"
#include "core/reference/reference.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "server/grpc/service.h"
#include "wire/convert.h"

namespace attnserve::service_testing {

using ::testing::HasSubstr;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(ServiceOptions{}); }
  void TearDown() override { Stop(); }

  void Start(ServiceOptions options, SchedulerOptions sched = {}) {
    std::vector<std::unique_ptr<Device>> devices;
    devices.push_back(MakeCpuDevice(0, 2));
    pool_ = *DevicePool::FromDevices(std::move(devices));
    metrics_ = *Metrics::Create(MetricsOptions{.listen = ""}, pool_->devices());
    scheduler_ = *Scheduler::Create(sched, pool_.get(), metrics_.get());
    service_ =
        *AttentionServiceImpl::Create(options, pool_.get(), scheduler_.get(), metrics_.get());
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(80 << 20);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    server_->GetHealthCheckService()->SetServingStatus(true);
    // Response chunks carry up to 4 MiB of payload plus framing: above gRPC's default limit.
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::AttentionService::NewStub(channel_);
  }

  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    scheduler_->Shutdown();
    server_.reset();
    service_.reset();
    scheduler_.reset();
    metrics_.reset();
    pool_.reset();
  }

  // Waits until every call has ended and checks that memory and gauges are back to baseline.
  void ExpectBaseline() {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (service_->active_calls() > 0 && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(service_->active_calls(), 0);
    EXPECT_EQ(service_->request_buffer_bytes(), 0);
    EXPECT_EQ(pool_->device(0).Stats().memory_used_bytes, 0);
    const std::string text = metrics_->RenderText();
    EXPECT_THAT(text, HasSubstr("attnserve_inflight_requests 0\n"));
    EXPECT_THAT(text, HasSubstr("attnserve_queue_length 0\n"));
    EXPECT_THAT(
        text, HasSubstr("attnserve_device_memory_used_bytes{device=\"cpu:0\",uuid=\"cpu-0\"} 0\n"));
  }

  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

struct Inputs {
  HostTensor q, k, v;
};

inline Inputs MakeInputs(const v1::AttendHeader& h, uint64_t seed) {
  const DType dtype = *DTypeFromProto(h.dtype());
  Inputs in;
  in.q = *HostTensor::Create(dtype, {h.batch(), h.tokens(), h.q_heads(), h.head_dim()});
  in.k = *HostTensor::Create(dtype, {h.batch(), h.tokens(), h.kv_heads(), h.head_dim()});
  in.v = *HostTensor::Create(dtype, {h.batch(), h.tokens(), h.kv_heads(), h.head_dim()});
  FillUniform(in.q, seed);
  FillUniform(in.k, seed + 1);
  FillUniform(in.v, seed + 2);
  return in;
}

struct CallResult {
  grpc::Status status;
  v1::AttendResponseHeader header;
  std::string o, lse;
  int responses = 0;
};

// Sends the header, then every tensor in chunks of `chunk` bytes in a shuffled order (an attend
// against a context passes empty k and v; a header alone, empty q too).
inline CallResult Attend(v1::AttentionService::Stub* stub, const v1::AttendHeader& header,
                         const Inputs& in, int64_t chunk,
                         std::optional<absl::Duration> timeout = {}) {
  grpc::ClientContext ctx;
  if (timeout) ctx.set_deadline(absl::ToChronoTime(absl::Now() + *timeout));
  auto stream = stub->Attend(&ctx);
  v1::AttendRequest req;
  *req.mutable_header() = header;
  bool ok = stream->Write(req);
  struct Piece {
    v1::TensorKind kind;
    const HostTensor* t;
    int64_t offset;
  };
  std::vector<Piece> pieces;
  for (auto [kind, t] : {std::pair{v1::TENSOR_Q, &in.q}, std::pair{v1::TENSOR_K, &in.k},
                         std::pair{v1::TENSOR_V, &in.v}}) {
    for (int64_t off = 0; off < static_cast<int64_t>(t->nbytes()); off += chunk) {
      pieces.push_back({kind, t, off});
    }
  }
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937(7));
  for (const Piece& p : pieces) {
    if (!ok) break;
    req.Clear();
    v1::TensorChunk* c = req.mutable_chunk();
    c->set_tensor(p.kind);
    c->set_offset(p.offset);
    const int64_t n = std::min<int64_t>(chunk, p.t->nbytes() - p.offset);
    c->set_data(reinterpret_cast<const char*>(p.t->data()) + p.offset, n);
    ok = stream->Write(req);
  }
  if (ok) stream->WritesDone();
  CallResult r;
  v1::AttendResponse resp;
  while (stream->Read(&resp)) {
    ++r.responses;
    if (resp.has_header()) {
      r.header = resp.header();
      // Poisoned (0xFF bytes are NaN in f32, f16 and bf16): a byte the server never sends fails
      // the comparison with the reference.
      r.o.assign(static_cast<size_t>(resp.header().o_bytes()), '\xff');
      r.lse.assign(static_cast<size_t>(resp.header().lse_bytes()), '\xff');
    } else {
      std::string& dst = resp.chunk().tensor() == v1::TENSOR_O ? r.o : r.lse;
      const bool inside = resp.chunk().offset() >= 0 &&
                          resp.chunk().offset() + resp.chunk().data().size() <= dst.size();
      EXPECT_TRUE(inside) << "response chunk [" << resp.chunk().offset() << ", +"
                          << resp.chunk().data().size() << ") past the " << dst.size()
                          << " bytes the header announced";
      if (inside) {
        std::memcpy(dst.data() + resp.chunk().offset(), resp.chunk().data().data(),
                    resp.chunk().data().size());
      }
    }
  }
  r.status = stream->Finish();
  return r;
}

inline v1::AttendHeader Header(v1::DType dtype, int64_t b, int64_t n, int64_t hq, int64_t hkv,
                               int64_t d, const std::string& spec_json) {
  v1::AttendHeader h;
  h.set_request_id("test");
  h.set_dtype(dtype);
  h.set_batch(b);
  h.set_tokens(n);
  h.set_q_heads(hq);
  h.set_kv_heads(hkv);
  h.set_head_dim(d);
  *h.mutable_spec() = *ParseSpecJsonProto(spec_json);
  return h;
}

// O and LSE of a call as tensors of the header's shapes; nullopt (a test failure) when the
// server sent another number of bytes.
inline std::optional<AttentionOutputs> OutputsOf(const v1::AttendHeader& h, const CallResult& r) {
  const DType dtype = *DTypeFromProto(h.dtype());
  AttentionOutputs out;
  out.o = *HostTensor::Create(dtype, {h.batch(), h.tokens(), h.q_heads(), h.head_dim()});
  out.lse = *HostTensor::Create(DType::kF32, {h.batch(), h.q_heads(), h.tokens()});
  if (r.o.size() != out.o.nbytes() || r.lse.size() != out.lse.nbytes()) {
    ADD_FAILURE() << "response: O " << r.o.size() << " bytes (expected " << out.o.nbytes()
                  << "), LSE " << r.lse.size() << " bytes (expected " << out.lse.nbytes() << ")";
    return std::nullopt;
  }
  std::memcpy(out.o.data(), r.o.data(), r.o.size());
  std::memcpy(out.lse.data(), r.lse.data(), r.lse.size());
  return out;
}

inline void ExpectMatchesReference(const v1::AttendHeader& h, const Inputs& in, const CallResult& r,
                                   double tol) {
  const std::optional<AttentionOutputs> out = OutputsOf(h, r);
  ASSERT_TRUE(out.has_value());
  absl::StatusOr<ReferenceResult> ref =
      ReferenceAttention(*SpecFromProto(h.spec()), in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LT(e.o_max_abs, tol);
  EXPECT_LT(e.lse_max_abs, 1e-3);
}

// A bf16 context of `kv_heads` x `head_dim` (capacity 0: growable; shards 0: the server's
// choice). The response's status goes to `out` when given.
inline grpc::Status CreateBf16Context(v1::AttentionService::Stub* stub, const std::string& name,
                                      int64_t kv_heads, int64_t head_dim, int64_t capacity,
                                      int64_t ttl_s = 0, int shards = 0,
                                      v1::ContextStatus* out = nullptr) {
  grpc::ClientContext ctx;
  v1::CreateContextRequest req;
  req.set_name(name);
  req.set_dtype(v1::DTYPE_BF16);
  req.set_kv_heads(kv_heads);
  req.set_head_dim(head_dim);
  req.set_capacity_tokens(capacity);
  req.set_ttl_seconds(ttl_s);
  req.set_shards(shards);
  v1::CreateContextResponse resp;
  grpc::Status s = stub->CreateContext(&ctx, req, &resp);
  if (out != nullptr) *out = resp.context();
  return s;
}

// Appends rows [from, from + n) of k and v ([1, N, Hkv, D]) to context `name`, each tensor in one
// chunk; `expect` is the row count the append must land at.
inline grpc::Status AppendContextRows(v1::AttentionService::Stub* stub, const std::string& name,
                                      const HostTensor& k, const HostTensor& v, int64_t from,
                                      int64_t n, std::optional<int64_t> expect = {},
                                      v1::ContextStatus* out = nullptr) {
  grpc::ClientContext ctx;
  v1::AppendContextResponse resp;
  auto w = stub->AppendContext(&ctx, &resp);
  v1::AppendContextRequest m;
  m.mutable_header()->set_context(name);
  m.mutable_header()->set_tokens(n);
  if (expect) m.mutable_header()->set_expect_tokens(*expect);
  w->Write(m);
  const int64_t row = static_cast<int64_t>(k.nbytes()) / k.dim(1);
  for (auto [kind, t] : {std::pair{v1::TENSOR_K, &k}, std::pair{v1::TENSOR_V, &v}}) {
    m.Clear();
    m.mutable_chunk()->set_tensor(kind);
    m.mutable_chunk()->set_data(reinterpret_cast<const char*>(t->data()) + from * row, n * row);
    w->Write(m);
  }
  w->WritesDone();
  grpc::Status s = w->Finish();
  if (out != nullptr) *out = resp.context();
  return s;
}

}  // namespace attnserve::service_testing

#endif  // ATTNSERVE_SERVER_GRPC_SERVICE_TEST_SUPPORT_H_
