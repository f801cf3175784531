// The service end to end on loopback, in process: a real grpc::Server with the CPU device, driven
// by the generated stub. Outputs are compared with the float64 reference. Contexts:
// context_service_test.cc; the fixture and helpers: service_test_support.h.
#include "server/grpc/service.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/reference/reference.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/grpc/service_test_support.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

using service_testing::Attend;
using service_testing::CallResult;
using service_testing::ExpectMatchesReference;
using service_testing::Header;
using service_testing::Inputs;
using service_testing::MakeInputs;
using service_testing::ServiceTest;
using ::testing::HasSubstr;

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
