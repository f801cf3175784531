// The service end to end on loopback, in process: a real grpc::Server with the CPU device, driven
// by the generated stub. Outputs are compared with the float64 reference.
#include "server/grpc/service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cpu/cpu_device.h"
#include "core/reference/reference.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

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

Inputs MakeInputs(const v1::AttendHeader& h, uint64_t seed) {
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

// Sends the header, then every tensor in chunks of `chunk` bytes in a shuffled order.
CallResult Attend(v1::AttentionService::Stub* stub, const v1::AttendHeader& header,
                  const Inputs& in, int64_t chunk, std::optional<absl::Duration> timeout = {}) {
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
      r.o.resize(resp.header().o_bytes());
      r.lse.resize(resp.header().lse_bytes());
    } else {
      std::string& dst = resp.chunk().tensor() == v1::TENSOR_O ? r.o : r.lse;
      EXPECT_LE(resp.chunk().offset() + resp.chunk().data().size(), dst.size());
      std::memcpy(dst.data() + resp.chunk().offset(), resp.chunk().data().data(),
                  resp.chunk().data().size());
    }
  }
  r.status = stream->Finish();
  return r;
}

v1::AttendHeader Header(v1::DType dtype, int64_t b, int64_t n, int64_t hq, int64_t hkv, int64_t d,
                        const std::string& spec_json) {
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

void ExpectMatchesReference(const v1::AttendHeader& h, const Inputs& in, const CallResult& r,
                            double tol) {
  const DType dtype = *DTypeFromProto(h.dtype());
  HostTensor o = *HostTensor::Create(dtype, {h.batch(), h.tokens(), h.q_heads(), h.head_dim()});
  ASSERT_EQ(r.o.size(), o.nbytes());
  std::memcpy(o.data(), r.o.data(), r.o.size());
  HostTensor lse = *HostTensor::Create(DType::kF32, {h.batch(), h.q_heads(), h.tokens()});
  ASSERT_EQ(r.lse.size(), lse.nbytes());
  std::memcpy(lse.data(), r.lse.data(), r.lse.size());
  absl::StatusOr<ReferenceResult> ref =
      ReferenceAttention(*SpecFromProto(h.spec()), in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const ErrorStats e = CompareToReference(*ref, o, &lse);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LT(e.o_max_abs, tol);
  EXPECT_LT(e.lse_max_abs, 1e-3);
}

TEST_F(ServiceTest, AttendMatchesReference) {
  struct Case {
    v1::DType dtype;
    std::string spec;
    double tol;
  };
  for (const Case& c : std::vector<Case>{
           {v1::DTYPE_F32, R"({"dense": {}, "causal": true})", 1e-4},
           {v1::DTYPE_BF16, R"({"window": {"size": 40}})", 2e-2},
           {v1::DTYPE_F16, R"({"dilated": {"segmentLengths": [64, 128], "dilationRates": [1, 2]}})",
            3e-3},
           {v1::DTYPE_F32,
            R"({"blockSparse": {"blockSize": 64, "globalLocal": {"globalBlocks": 1, "width": 1}},
                "causal": true})",
            1e-4},
       }) {
    SCOPED_TRACE(c.spec);
    v1::AttendHeader h = Header(c.dtype, 2, 300, 4, 2, 32, c.spec);
    h.set_return_lse(true);
    h.set_response_chunk_bytes(5000);
    const Inputs in = MakeInputs(h, 42);
    const CallResult r = Attend(stub_.get(), h, in, /*chunk=*/3000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.header.request_id(), "test");
    EXPECT_EQ(r.header.backend(), "cpu");
    EXPECT_EQ(r.header.placement(), v1::PLACEMENT_SINGLE);
    EXPECT_THAT(r.header.devices(), ::testing::ElementsAre("cpu:0"));
    EXPECT_THAT(r.header.o_shape(), ::testing::ElementsAre(2, 300, 4, 32));
    EXPECT_THAT(r.header.lse_shape(), ::testing::ElementsAre(2, 4, 300));
    EXPECT_GT(r.header.flops(), 0);
    EXPECT_GE(r.header.sparsity(), 0);
    EXPECT_GT(r.responses, 3);  // header + several chunks of 5000 bytes
    ExpectMatchesReference(h, in, r, c.tol);
  }
  ExpectBaseline();
  const std::string text = metrics_->RenderText();
  EXPECT_THAT(text, HasSubstr("attnserve_requests_total{code=\"OK\"} 4"));
}

TEST_F(ServiceTest, WithoutLseOnlyOIsSent) {
  v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 64, 2, 2, 16, R"({"dense": {}})");
  const Inputs in = MakeInputs(h, 1);
  const CallResult r = Attend(stub_.get(), h, in, 1 << 20);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.header.lse_bytes(), 0);
  EXPECT_TRUE(r.header.lse_shape().empty());
  EXPECT_EQ(r.o.size(), 64u * 2 * 16 * 4);
  EXPECT_EQ(r.responses, 2);  // header + one O chunk
}

TEST_F(ServiceTest, ProtocolErrorsNameTheRule) {
  v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 64, 2, 2, 16, R"({"dense": {}})");
  {
    grpc::ClientContext ctx;
    auto stream = stub_->Attend(&ctx);
    v1::AttendRequest req;
    req.mutable_chunk()->set_tensor(v1::TENSOR_Q);
    req.mutable_chunk()->set_data("abcd");
    stream->Write(req);
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "header: must be the first message");
  }
  {
    grpc::ClientContext ctx;
    auto stream = stub_->Attend(&ctx);
    v1::AttendRequest req;
    *req.mutable_header() = h;
    stream->Write(req);
    stream->Write(req);
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "header: sent twice");
  }
  {
    // Half-close with V missing.
    grpc::ClientContext ctx;
    auto stream = stub_->Attend(&ctx);
    v1::AttendRequest req;
    *req.mutable_header() = h;
    stream->Write(req);
    for (auto kind : {v1::TENSOR_Q, v1::TENSOR_K}) {
      req.Clear();
      req.mutable_chunk()->set_tensor(kind);
      req.mutable_chunk()->set_data(std::string(64 * 2 * 16 * 4, '\0'));
      stream->Write(req);
    }
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "v: received 0 of 8192 bytes");
  }
  {
    v1::AttendHeader huge = h;
    huge.set_tokens(1000000000000);
    grpc::ClientContext ctx;
    auto stream = stub_->Attend(&ctx);
    v1::AttendRequest req;
    *req.mutable_header() = huge;
    stream->Write(req);
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("header.tokens"));
  }
  ExpectBaseline();
  EXPECT_THAT(metrics_->RenderText(),
              HasSubstr("attnserve_requests_total{code=\"INVALID_ARGUMENT\"} 3"));
}

TEST_F(ServiceTest, DeadlineExceededFreesEverything) {
  // About 550 GFLOP of dense attention: seconds on any CPU, far beyond the deadline.
  v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 8192, 16, 16, 64, R"({"dense": {}})");
  const Inputs in = MakeInputs(h, 3);
  const CallResult r = Attend(stub_.get(), h, in, 1 << 20, absl::Milliseconds(400));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ExpectBaseline();
  EXPECT_THAT(metrics_->RenderText(),
              HasSubstr("attnserve_requests_total{code=\"DEADLINE_EXCEEDED\"} 1"));
}

TEST_F(ServiceTest, ClientCancelWhileRunningFreesEverything) {
  v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 8192, 16, 16, 64, R"({"dense": {}})");
  const Inputs in = MakeInputs(h, 4);
  grpc::ClientContext ctx;
  auto stream = stub_->Attend(&ctx);
  v1::AttendRequest req;
  *req.mutable_header() = h;
  stream->Write(req);
  for (auto [kind, t] : {std::pair{v1::TENSOR_Q, &in.q}, std::pair{v1::TENSOR_K, &in.k},
                         std::pair{v1::TENSOR_V, &in.v}}) {
    req.Clear();
    req.mutable_chunk()->set_tensor(kind);
    req.mutable_chunk()->set_data(reinterpret_cast<const char*>(t->data()), t->nbytes());
    stream->Write(req);
  }
  stream->WritesDone();
  // Wait until the run holds device memory, then cancel.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool_->device(0).Stats().memory_used_bytes == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_GT(pool_->device(0).Stats().memory_used_bytes, 0);
  ctx.TryCancel();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ExpectBaseline();
}

TEST_F(ServiceTest, DescribeAndHealth) {
  grpc::ClientContext ctx;
  v1::DescribeResponse d;
  ASSERT_TRUE(stub_->Describe(&ctx, v1::DescribeRequest(), &d).ok());
  EXPECT_EQ(d.backend(), "cpu");
  ASSERT_EQ(d.devices_size(), 1);
  EXPECT_EQ(d.devices(0).name(), "cpu:0");
  EXPECT_GT(d.devices(0).memory_total_bytes(), 0);
  EXPECT_EQ(d.limits().max_request_bytes(), int64_t{8} << 30);
  EXPECT_EQ(d.limits().chunk_bytes(), (4 << 20) - (64 << 10));
  EXPECT_THAT(d.patterns(), ::testing::ElementsAre("dense", "window", "dilated", "block_sparse"));
  EXPECT_THAT(d.dtypes(), ::testing::ElementsAre("f32", "f16", "bf16"));
  EXPECT_THAT(d.limits().block_sizes(), ::testing::ElementsAre(64, 128));

  // grpc.health.v1.Health/Check with service "" over the wire: an empty request; the answer's
  // field 1 is the status (1 SERVING, 2 NOT_SERVING).
  auto check = [&]() -> int {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext hctx;
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&hctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    EXPECT_TRUE(done.get_future().get().ok());
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
  };
  EXPECT_EQ(check(), 1);
  server_->GetHealthCheckService()->SetServingStatus(false);
  EXPECT_EQ(check(), 2);
}

TEST_F(ServiceTest, DrainingRefusesNewCalls) {
  service_->StartDrain();
  v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 64, 2, 2, 16, R"({"dense": {}})");
  const Inputs in = MakeInputs(h, 1);
  const CallResult r = Attend(stub_.get(), h, in, 1 << 20);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.status.error_message(), "server is draining");
  ExpectBaseline();
}

TEST_F(ServiceTest, ConcurrentCallsAllComplete) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      v1::AttendHeader h =
          Header(v1::DTYPE_BF16, 1, 128 + 16 * i, 4, 1, 32, R"({"dense": {}, "causal": true})");
      h.set_return_lse(true);
      const Inputs in = MakeInputs(h, 100 + i);
      const CallResult r = Attend(stub_.get(), h, in, 1000);
      if (r.status.ok()) {
        ++ok;
        ExpectMatchesReference(h, in, r, 2e-2);
      } else {
        ADD_FAILURE() << r.status.error_message();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 6);
  ExpectBaseline();
}

}  // namespace
}  // namespace attnserve

namespace attnserve {
namespace {

// Contexts end to end: K/V appended in pieces, attends of Q alone against them equal to the
// float64 reference, the limits with their codes, and the memory back to zero.
class ContextServiceTest : public ServiceTest {
 protected:
  grpc::Status Create(const std::string& name, int64_t capacity, int64_t ttl_s = 0) {
    grpc::ClientContext ctx;
    v1::CreateContextRequest req;
    req.set_name(name);
    req.set_dtype(v1::DTYPE_BF16);
    req.set_kv_heads(2);
    req.set_head_dim(64);
    req.set_capacity_tokens(capacity);
    req.set_ttl_seconds(ttl_s);
    v1::CreateContextResponse resp;
    return stub_->CreateContext(&ctx, req, &resp);
  }
  // Appends rows [from, from + n) of k and v ([1, N, 2, 64]).
  grpc::Status Append(const std::string& name, const Inputs& kv, int64_t from, int64_t n,
                      std::optional<int64_t> expect = {}) {
    grpc::ClientContext ctx;
    v1::AppendContextResponse resp;
    auto w = stub_->AppendContext(&ctx, &resp);
    v1::AppendContextRequest m;
    m.mutable_header()->set_context(name);
    m.mutable_header()->set_tokens(n);
    if (expect) m.mutable_header()->set_expect_tokens(*expect);
    w->Write(m);
    const int64_t row = 2 * 64 * 2;
    for (auto [kind, t] : {std::pair{v1::TENSOR_K, &kv.k}, std::pair{v1::TENSOR_V, &kv.v}}) {
      m.Clear();
      m.mutable_chunk()->set_tensor(kind);
      m.mutable_chunk()->set_data(reinterpret_cast<const char*>(t->data()) + from * row, n * row);
      w->Write(m);
    }
    w->WritesDone();
    return w->Finish();
  }
};

TEST_F(ContextServiceTest, LifecycleMatchesReferenceAndFreesEverything) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const Inputs all = MakeInputs(Header(v1::DTYPE_BF16, 1, 600, 8, 2, 64, R"({"dense": {}})"),
                                seed);  // its K and V are the context's rows
  ASSERT_TRUE(Create("c", 0).ok());  // growable: 3 appends, the second checked by expect_tokens
  ASSERT_TRUE(Append("c", all, 0, 300, 0).ok());
  ASSERT_TRUE(Append("c", all, 300, 200, 300).ok());
  ASSERT_TRUE(Append("c", all, 500, 100).ok());
  const struct {
    int64_t nq, offset;  // offset -1: the server's default, the context's last rows
    const char* spec;
  } cases[] = {{1, -1, R"({"dense": {}, "causal": true})"},
               {16, -1, R"({"window": {"size": "40"}, "causal": true})"},
               {50, 250, R"({"blockSparse": {"blockSize": 64, "localWindow": {"width": "1"}},
                            "causal": true})"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(absl::StrCat("nq=", c.nq, " ", c.spec));
    v1::AttendHeader h = Header(v1::DTYPE_BF16, 1, c.nq, 8, 2, 64, c.spec);
    h.set_context("c");
    h.set_return_lse(true);
    if (c.offset >= 0) h.set_q_offset(c.offset);
    Inputs q_only{MakeInputs(h, seed + 7).q, HostTensor(), HostTensor()};
    const CallResult r = Attend(stub_.get(), h, q_only, 4096);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    AttentionSpec spec = *SpecFromProto(h.spec());
    spec.q_offset = c.offset >= 0 ? c.offset : 600 - c.nq;
    absl::StatusOr<ReferenceResult> ref = ReferenceAttention(spec, q_only.q, all.k, all.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    HostTensor o = *HostTensor::Create(DType::kBF16, {1, c.nq, 8, 64});
    HostTensor lse = *HostTensor::Create(DType::kF32, {1, 8, c.nq});
    ASSERT_EQ(r.o.size(), o.nbytes());
    ASSERT_EQ(r.lse.size(), lse.nbytes());
    std::memcpy(o.data(), r.o.data(), r.o.size());
    std::memcpy(lse.data(), r.lse.data(), r.lse.size());
    const ErrorStats e = CompareToReference(*ref, o, &lse);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.o_rel, ReferenceOTolerance(DType::kBF16));
    EXPECT_LE(e.lse_max_abs, kReferenceLseTolerance);
  }
  grpc::ClientContext gctx;
  v1::GetContextRequest greq;
  greq.set_name("c");
  v1::GetContextResponse gresp;
  ASSERT_TRUE(stub_->GetContext(&gctx, greq, &gresp).ok());
  EXPECT_EQ(gresp.context().tokens(), 600);
  EXPECT_EQ(gresp.context().attends(), 3);
  grpc::ClientContext dctx;
  v1::DeleteContextRequest dreq;
  dreq.set_name("c");
  v1::DeleteContextResponse dresp;
  ASSERT_TRUE(stub_->DeleteContext(&dctx, dreq, &dresp).ok());
  ExpectBaseline();
  EXPECT_THAT(metrics_->RenderText(), HasSubstr("attnserve_context_bytes{device=\"cpu:0\"} 0\n"));
}

// A delete while an attend reads the context: the delete answers at once (naming the request that
// holds it), the attend finishes on the rows it took and equals the float64 reference, and the
// context's memory goes back to 0 when the attend lets go. The attend reads enough rows on the
// CPU backend to stay in flight for a few hundred milliseconds; since the float64 reference runs
// ~100x slower, it is computed for three slices of query rows (first, middle, last), which a
// dense, non-causal spec computes independently of the other rows. A few seconds in all.
TEST_F(ContextServiceTest, DeleteDuringAttendLeavesTheAttendWhole) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  constexpr int64_t kRows = 16384, kQueries = 768, kSlice = 24, kQHeads = 8, kD = 64;
  const Inputs all =
      MakeInputs(Header(v1::DTYPE_BF16, 1, kRows, kQHeads, 2, kD, R"({"dense": {}})"),
                 seed);  // its K and V are the context's rows
  ASSERT_TRUE(Create("busy", kRows).ok());
  ASSERT_TRUE(Append("busy", all, 0, kRows, 0).ok());
  v1::AttendHeader h = Header(v1::DTYPE_BF16, 1, kQueries, kQHeads, 2, kD, R"({"dense": {}})");
  h.set_context("busy");
  h.set_return_lse(true);
  h.set_q_offset(kRows - kQueries);
  Inputs q_only{MakeInputs(h, seed + 7).q, HostTensor(), HostTensor()};
  std::future<CallResult> attend = std::async(std::launch::async, [&] {
    return Attend(stub_.get(), h, q_only, 1 << 20, absl::Seconds(60));
  });
  auto get_context = [&](v1::GetContextResponse* resp) {
    grpc::ClientContext gctx;
    v1::GetContextRequest greq;
    greq.set_name("busy");
    return stub_->GetContext(&gctx, greq, resp);
  };
  // Delete once the attend holds the context (GetContext's in_use), while it still runs.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int64_t held = 0;
  while (absl::Now() < deadline &&
         attend.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    v1::GetContextResponse gresp;
    ASSERT_TRUE(get_context(&gresp).ok());
    held = gresp.context().in_use();
    if (held > 0) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(held, 1) << "the attend ended (or never started) before the delete could race it";
  grpc::ClientContext dctx;
  v1::DeleteContextRequest dreq;
  dreq.set_name("busy");
  v1::DeleteContextResponse dresp;
  ASSERT_TRUE(stub_->DeleteContext(&dctx, dreq, &dresp).ok());
  EXPECT_EQ(dresp.in_use(), 1);
  // Gone for new requests at once, while the attend still runs.
  v1::GetContextResponse gone_resp;
  const grpc::Status gone = get_context(&gone_resp);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(gone.error_message(), HasSubstr("deleted"));
  EXPECT_NE(attend.wait_for(std::chrono::milliseconds(0)), std::future_status::ready)
      << "the attend was over by the time the delete answered";
  const CallResult r = attend.get();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.o.size(), static_cast<size_t>(kQueries * kQHeads * kD * 2));
  ASSERT_EQ(r.lse.size(), static_cast<size_t>(kQHeads * kQueries * 4));

  // Query rows [from, from + kSlice) against the reference of those rows alone.
  for (int64_t from : {int64_t{0}, kQueries / 2, kQueries - kSlice}) {
    SCOPED_TRACE(absl::StrCat("query rows from ", from));
    const size_t q_row = kQHeads * kD * 2;  // bytes of one bf16 row of Q and O
    HostTensor q = *HostTensor::Create(DType::kBF16, {1, kSlice, kQHeads, kD});
    HostTensor o = *HostTensor::Create(DType::kBF16, {1, kSlice, kQHeads, kD});
    HostTensor lse = *HostTensor::Create(DType::kF32, {1, kQHeads, kSlice});
    std::memcpy(q.data(), q_only.q.data() + from * q_row, kSlice * q_row);
    std::memcpy(o.data(), r.o.data() + from * q_row, kSlice * q_row);
    for (int64_t head = 0; head < kQHeads; ++head) {  // LSE is [1, Hq, Nq]
      std::memcpy(lse.data() + head * kSlice * 4, r.lse.data() + (head * kQueries + from) * 4,
                  kSlice * 4);
    }
    AttentionSpec spec = *SpecFromProto(h.spec());
    spec.q_offset = h.q_offset() + from;
    absl::StatusOr<ReferenceResult> ref = ReferenceAttention(spec, q, all.k, all.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const ErrorStats e = CompareToReference(*ref, o, &lse);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.o_rel, ReferenceOTolerance(DType::kBF16));
    EXPECT_LE(e.lse_max_abs, kReferenceLseTolerance);
  }
  // The attend let go: the rows' memory is back, on the device and in the metrics.
  ExpectBaseline();
  EXPECT_THAT(metrics_->RenderText(), HasSubstr("attnserve_context_bytes{device=\"cpu:0\"} 0\n"));
}

TEST_F(ContextServiceTest, MisuseAnswersWithItsCode) {
  const Inputs all = MakeInputs(Header(v1::DTYPE_BF16, 1, 64, 8, 2, 64, R"({"dense": {}})"), 5);
  ASSERT_TRUE(Create("fixed", 32).ok());
  EXPECT_EQ(Create("fixed", 32).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Append("fixed", all, 0, 40).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Append("fixed", all, 0, 8, 3).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Two appends racing: both land, whole, one after the other.
  std::thread t1([&] { EXPECT_TRUE(Append("fixed", all, 0, 8).ok()); });
  std::thread t2([&] { EXPECT_TRUE(Append("fixed", all, 8, 8).ok()); });
  t1.join();
  t2.join();
  v1::AttendHeader h = Header(v1::DTYPE_BF16, 1, 1, 8, 4, 64, R"({"dense": {}})");
  h.set_context("fixed");
  Inputs q{MakeInputs(h, 1).q, HostTensor(), HostTensor()};
  CallResult r = Attend(stub_.get(), h, q, 4096);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("header.kv_heads"));
  h.set_kv_heads(2);
  r = Attend(stub_.get(), h, q, 4096);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  grpc::ClientContext gctx;
  v1::GetContextRequest greq;
  greq.set_name("fixed");
  v1::GetContextResponse gresp;
  ASSERT_TRUE(stub_->GetContext(&gctx, greq, &gresp).ok());
  EXPECT_EQ(gresp.context().tokens(), 16);
  grpc::ClientContext dctx;
  v1::DeleteContextRequest dreq;
  dreq.set_name("fixed");
  v1::DeleteContextResponse dresp;
  ASSERT_TRUE(stub_->DeleteContext(&dctx, dreq, &dresp).ok());
  r = Attend(stub_.get(), h, q, 4096);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr("deleted"));
  // Expiry: idle past its ttl, the sweeper (once a second) deletes it.
  ASSERT_TRUE(Create("brief", 8, /*ttl_s=*/1).ok());
  absl::SleepFor(absl::Milliseconds(2600));
  h.set_context("brief");
  r = Attend(stub_.get(), h, q, 4096);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr("expired"));
  ExpectBaseline();
}

}  // namespace
}  // namespace attnserve
