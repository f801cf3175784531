// Contexts through the service, in process (the fixture of service_test_support.h): K/V appended in
// pieces, attends of Q alone equal to the float64 reference, a delete racing an attend, misuse
// answered with its code, and the memory back to zero.
#include <cstring>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/reference/reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/grpc/service_test_support.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

using service_testing::Attend;
using service_testing::CallResult;
using service_testing::Header;
using service_testing::Inputs;
using service_testing::MakeInputs;
using service_testing::ServiceTest;
using ::testing::HasSubstr;

// Contexts end to end: K/V appended in pieces, attends of Q alone against them equal to the
// float64 reference, the limits with their codes, and the memory back to zero.
class ContextServiceTest : public ServiceTest {
 protected:
  grpc::Status Create(const std::string& name, int64_t capacity, int64_t ttl_s = 0) {
    return service_testing::CreateBf16Context(stub_.get(), name, 2, 64, capacity, ttl_s);
  }
  // Appends rows [from, from + n) of k and v ([1, N, 2, 64]).
  grpc::Status Append(const std::string& name, const Inputs& kv, int64_t from, int64_t n,
                      std::optional<int64_t> expect = {}) {
    return service_testing::AppendContextRows(stub_.get(), name, kv.k, kv.v, from, n, expect);
  }
};

TEST_F(ContextServiceTest, LifecycleMatchesReferenceAndFreesEverything) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const Inputs all = MakeInputs(Header(v1::DTYPE_BF16, 1, 600, 8, 2, 64, R"({"dense": {}})"),
                                seed);  // its K and V are the context's rows
  ASSERT_TRUE(Create("c", 0).ok());     // growable: 3 appends, the second checked by expect_tokens
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
    const std::optional<AttentionOutputs> out = service_testing::OutputsOf(h, r);
    ASSERT_TRUE(out.has_value());
    const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
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
  // Describe lists it, and the gauge counts it, until it is deleted.
  grpc::ClientContext desc_ctx;
  v1::DescribeResponse desc;
  ASSERT_TRUE(stub_->Describe(&desc_ctx, v1::DescribeRequest(), &desc).ok());
  ASSERT_EQ(desc.contexts_size(), 1);
  EXPECT_EQ(desc.contexts(0).name(), "c");
  EXPECT_EQ(desc.contexts(0).tokens(), 600);
  EXPECT_THAT(metrics_->RenderText(), HasSubstr("\nattnserve_contexts 1\n"));
  grpc::ClientContext dctx;
  v1::DeleteContextRequest dreq;
  dreq.set_name("c");
  v1::DeleteContextResponse dresp;
  ASSERT_TRUE(stub_->DeleteContext(&dctx, dreq, &dresp).ok());
  ExpectBaseline();
  EXPECT_THAT(metrics_->RenderText(), HasSubstr("attnserve_context_bytes{device=\"cpu:0\"} 0\n"));
  EXPECT_THAT(metrics_->RenderText(), HasSubstr("\nattnserve_contexts 0\n"));
  grpc::ClientContext desc_after_ctx;
  v1::DescribeResponse desc_after;
  ASSERT_TRUE(stub_->Describe(&desc_after_ctx, v1::DescribeRequest(), &desc_after).ok());
  EXPECT_EQ(desc_after.contexts_size(), 0);
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
  EXPECT_THAT(metrics_->RenderText(), HasSubstr("\nattnserve_contexts 0\n"));
  grpc::ClientContext desc_after_ctx;
  v1::DescribeResponse desc_after;
  ASSERT_TRUE(stub_->Describe(&desc_after_ctx, v1::DescribeRequest(), &desc_after).ok());
  EXPECT_EQ(desc_after.contexts_size(), 0);
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
  // Q of another dtype or head dim than the context's rows.
  v1::AttendHeader wrong = h;
  wrong.set_dtype(v1::DTYPE_F32);
  r = Attend(stub_.get(), wrong, Inputs{MakeInputs(wrong, 1).q, HostTensor(), HostTensor()}, 4096);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("header.dtype: f32, but context 'fixed' has bf16"));
  wrong = h;
  wrong.set_head_dim(128);
  r = Attend(stub_.get(), wrong, Inputs{MakeInputs(wrong, 1).q, HostTensor(), HostTensor()}, 4096);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("header.head_dim: 128, but context 'fixed' has 64"));
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
