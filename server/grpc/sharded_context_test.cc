// A context split over two CPU devices, end to end on loopback: a real grpc::Server with two CPU
// devices and a context budget too small for one device to hold it. Create, append in pieces that
// cross the shard boundary, attend (decode Nq 1..4 with GQA, causal dense and window, non-causal
// window, a 64-row chunk at an explicit offset) and compare with the float64 reference on fresh
// seeded inputs (the client's output buffers start as NaN bytes); then delete, and every device's
// memory and context bytes go back to 0.
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cpu/cpu_device.h"
#include "core/reference/reference.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/grpc/service.h"
#include "server/grpc/service_test_support.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHkv = 2, kDim = 32;
constexpr int64_t kRowBytes = kHkv * kDim * 2;  // bf16
constexpr int64_t kRows = 700;                  // the context

class ShardedContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::unique_ptr<Device>> devices;
    for (int i = 0; i < 2; ++i) devices.push_back(MakeCpuDevice(i, 2));
    pool_ = *DevicePool::FromDevices(std::move(devices));
    metrics_ = *Metrics::Create(MetricsOptions{.listen = ""}, pool_->devices());
    scheduler_ = *Scheduler::Create(SchedulerOptions{}, pool_.get(), metrics_.get(),
                                    MakeMultiDevicePlanner());
    ServiceOptions options;
    // 500 rows of K + V per device: the 700-row context needs both.
    options.contexts.memory_budget_bytes = 2 * 500 * 2 * kRowBytes;
    options.contexts.initial_tokens = 128;
    service_ =
        *AttentionServiceImpl::Create(options, pool_.get(), scheduler_.get(), metrics_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    const uint64_t seed = std::random_device{}();
    seed_ = seed;
    for (HostTensor* t : {&k_, &v_}) *t = *HostTensor::Create(DType::kBF16, {1, kRows, kHkv, kDim});
    FillUniform(k_, seed + 1);
    FillUniform(v_, seed + 2);
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now());
    scheduler_->Shutdown();
    server_.reset();
    service_.reset();
    scheduler_.reset();
    metrics_.reset();
    pool_.reset();
  }

  grpc::Status Create(const std::string& name, int64_t capacity, v1::ContextStatus* out) {
    return service_testing::CreateBf16Context(stub_.get(), name, kHkv, kDim, capacity,
                                              /*ttl_s=*/0, /*shards=*/0, out);
  }

  grpc::Status Append(const std::string& name, int64_t from, int64_t n, v1::ContextStatus* out) {
    return service_testing::AppendContextRows(stub_.get(), name, k_, v_, from, n, from, out);
  }

  // One attend of `nq` query rows (hq query heads) against context `name`; checks the answer
  // against the reference over the context's first `rows` rows.
  void ExpectAttendMatches(const std::string& name, int64_t rows, int64_t nq, int64_t hq,
                           std::optional<int64_t> q_offset, const std::string& spec_json) {
    SCOPED_TRACE(absl::StrCat("nq=", nq, " hq=", hq, " offset=", q_offset.value_or(-1), " ",
                              spec_json, " seed=", seed_));
    v1::AttendHeader h = service_testing::Header(v1::DTYPE_BF16, 1, nq, hq, kHkv, kDim, spec_json);
    h.set_return_lse(true);
    h.set_context(name);
    if (q_offset) h.set_q_offset(*q_offset);
    service_testing::Inputs in;  // Q alone: an attend against a context
    in.q = *HostTensor::Create(DType::kBF16, {1, nq, hq, kDim});
    FillUniform(in.q, seed_ + 100 + static_cast<uint64_t>(nq * 7 + hq));
    // Q alone, in one chunk; O and LSE come back into poisoned buffers.
    const service_testing::CallResult r =
        service_testing::Attend(stub_.get(), h, in, static_cast<int64_t>(in.q.nbytes()));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    const std::optional<AttentionOutputs> out = service_testing::OutputsOf(h, r);
    ASSERT_TRUE(out.has_value());
    const v1::AttendResponseHeader& header = r.header;
    EXPECT_EQ(header.placement(), v1::PLACEMENT_CONTEXT_PARALLEL);
    EXPECT_EQ(header.devices_size(), 2);
    AttentionSpec spec = *SpecFromProto(h.spec());
    spec.q_offset = q_offset.value_or(rows - nq);
    HostTensor k = *HostTensor::Create(DType::kBF16, {1, rows, kHkv, kDim});
    HostTensor v = *HostTensor::Create(DType::kBF16, {1, rows, kHkv, kDim});
    std::memcpy(k.data(), k_.data(), k.nbytes());
    std::memcpy(v.data(), v_.data(), v.nbytes());
    auto ref = ReferenceAttention(spec, in.q, k, v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.o_rel, ReferenceOTolerance(DType::kBF16));
    EXPECT_LE(e.lse_max_abs, kReferenceLseTolerance);
  }

  // Sends a header alone (the server refuses it before Q would be needed).
  grpc::Status HeaderOnly(const v1::AttendHeader& h) {
    return service_testing::Attend(stub_.get(), h, service_testing::Inputs{}, 1).status;
  }

  void ExpectMemoryBackToZero() {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (service_->active_calls() > 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    const std::string text = metrics_->RenderText();
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(pool_->device(d).Stats().memory_used_bytes, 0) << "cpu:" << d;
      EXPECT_THAT(text,
                  HasSubstr(absl::StrCat("attnserve_context_bytes{device=\"cpu:", d, "\"} 0\n")));
    }
  }

  uint64_t seed_ = 0;
  HostTensor k_, v_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

TEST_F(ShardedContextTest, FixedCapacityContextOverTwoDevicesMatchesReference) {
  v1::ContextStatus st;
  ASSERT_TRUE(Create("c", kRows, &st).ok());
  ASSERT_EQ(st.shards_size(), 2) << "700 rows do not fit one device's 500";
  EXPECT_EQ(st.shards(0).device(), "cpu:0");
  EXPECT_EQ(st.shards(1).device(), "cpu:1");
  EXPECT_EQ(st.shards(1).start(), 350);
  // Three appends, the second crossing the boundary at row 350.
  ASSERT_TRUE(Append("c", 0, 300, nullptr).ok());
  ASSERT_TRUE(Append("c", 300, 250, nullptr).ok());
  ASSERT_TRUE(Append("c", 550, 150, &st).ok());
  EXPECT_EQ(st.tokens(), kRows);
  EXPECT_EQ(st.shards(0).tokens(), 350);
  EXPECT_EQ(st.shards(1).tokens(), 350);
  EXPECT_GT(st.shards(1).bytes(), 0);
  for (int64_t nq = 1; nq <= 4; ++nq) {
    ExpectAttendMatches("c", kRows, nq, 8, std::nullopt, R"({"dense": {}, "causal": true})");
    ExpectAttendMatches("c", kRows, nq, 4, std::nullopt,
                        R"({"window": {"size": "100"}, "causal": true})");
  }
  ExpectAttendMatches("c", kRows, 1, 2, std::nullopt, R"({"dense": {}})");
  ExpectAttendMatches("c", kRows, 2, 8, std::nullopt, R"({"window": {"size": "400"}})");
  // A chunk at an explicit offset: rows on both sides of the boundary (a causal and a window
  // chunk) and one entirely before it.
  ExpectAttendMatches("c", kRows, 64, 8, 320, R"({"dense": {}, "causal": true})");
  ExpectAttendMatches("c", kRows, 64, 8, 300, R"({"window": {"size": "30"}})");
  ExpectAttendMatches("c", kRows, 64, 4, 100, R"({"dense": {}, "causal": true})");
  // Specs a split context cannot run, and hints it cannot honour.
  v1::AttendHeader bad;
  bad.set_dtype(v1::DTYPE_BF16);
  bad.set_batch(1);
  bad.set_tokens(1);
  bad.set_q_heads(2);
  bad.set_kv_heads(kHkv);
  bad.set_head_dim(kDim);
  bad.set_context("c");
  *bad.mutable_spec() =
      *ParseSpecJsonProto(R"({"blockSparse": {"blockSize": 64, "localWindow": {"width": "1"}}})");
  grpc::Status s = HeaderOnly(bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("split over 2 devices"));
  *bad.mutable_spec() = *ParseSpecJsonProto(R"({"dense": {}})");
  bad.set_placement(v1::PLACEMENT_RING);
  s = HeaderOnly(bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("header.placement"));
  {
    grpc::ClientContext ctx;
    v1::GetContextRequest req;
    req.set_name("c");
    v1::GetContextResponse resp;
    ASSERT_TRUE(stub_->GetContext(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.context().shards_size(), 2);
    EXPECT_EQ(resp.context().device(), "cpu:0,cpu:1");
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteContextRequest req;
    req.set_name("c");
    v1::DeleteContextResponse resp;
    ASSERT_TRUE(stub_->DeleteContext(&ctx, req, &resp).ok());
  }
  ExpectMemoryBackToZero();
}

TEST_F(ShardedContextTest, GrowableContextSpillsAndMatchesReference) {
  v1::ContextStatus st;
  ASSERT_TRUE(Create("g", 0, &st).ok());
  EXPECT_EQ(st.shards_size(), 1);
  // 128 rows, grown to 256 on cpu:0 (a growth holds the old and the new storage at once, so a
  // device's 500 rows cannot take 512), then spilled into cpu:1 from row 256.
  for (int64_t from = 0; from < 500; from += 100) ASSERT_TRUE(Append("g", from, 100, &st).ok());
  ASSERT_EQ(st.shards_size(), 2) << "a growable context spills when its device is full";
  EXPECT_EQ(st.tokens(), 500);
  EXPECT_EQ(st.shards(1).start(), 256);
  ExpectAttendMatches("g", 500, 1, 8, std::nullopt, R"({"dense": {}, "causal": true})");
  ExpectAttendMatches("g", 500, 3, 4, std::nullopt,
                      R"({"window": {"size": "200"}, "causal": true})");
  ExpectAttendMatches("g", 500, 64, 8, 200, R"({"dense": {}, "causal": true})");
  grpc::ClientContext ctx;
  v1::DeleteContextRequest req;
  req.set_name("g");
  v1::DeleteContextResponse resp;
  ASSERT_TRUE(stub_->DeleteContext(&ctx, req, &resp).ok());
  ExpectMemoryBackToZero();
}

}  // namespace
}  // namespace attnserve
