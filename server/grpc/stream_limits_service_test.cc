// The stream limits through the real service (in process): idle and slow Attend streams, an idle
// AppendContext stream and a header past --max-upload-bytes end with their documented codes, and
// everything they held is released.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/grpc/service.h"
#include "server/grpc/service_test_support.h"

namespace attnserve {
namespace {

using service_testing::Attend;
using service_testing::CallResult;
using service_testing::CreateBf16Context;
using service_testing::Header;
using service_testing::Inputs;
using service_testing::MakeInputs;
using service_testing::ServiceTest;
using ::testing::HasSubstr;

class StreamLimitsServiceTest : public ServiceTest {
 protected:
  void SetUp() override {}  // each test starts the service with its limits
  void StartWith(absl::Duration idle, int64_t min_rate, absl::Duration grace,
                 int64_t max_upload = 0) {
    ServiceOptions o;
    o.streams.idle_timeout = idle;
    o.streams.min_upload_rate = min_rate;
    o.streams.min_upload_grace = grace;
    o.max_upload_bytes = max_upload;
    Start(o);
  }
  void ExpectReleased() {
    ExpectBaseline();
    EXPECT_EQ(service_->upload_reserved_bytes(), 0);
    EXPECT_EQ(service_->watched_streams(), 0u);
  }
};

// A header (and optionally one small chunk of Q), then silence until the server ends the call;
// bounded by a 20 s deadline.
grpc::Status HeaderThenSilence(v1::AttentionService::Stub* stub, const v1::AttendHeader& h,
                               bool one_chunk, absl::Duration* lived) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  const absl::Time start = absl::Now();
  auto stream = stub->Attend(&ctx);
  v1::AttendRequest req;
  *req.mutable_header() = h;
  stream->Write(req);
  if (one_chunk) {
    req.Clear();
    req.mutable_chunk()->set_tensor(v1::TENSOR_Q);
    req.mutable_chunk()->set_data(std::string(64, '\0'));
    stream->Write(req);
  }
  v1::AttendResponse resp;
  while (stream->Read(&resp)) {
  }
  grpc::Status s = stream->Finish();
  *lived = absl::Now() - start;
  return s;
}

TEST_F(StreamLimitsServiceTest, SilentAttendEndsAtTheIdleTimeout) {
  StartWith(absl::Milliseconds(300), 0, absl::ZeroDuration());
  const v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 256, 2, 2, 16, R"({"dense": {}})");
  absl::Duration lived;
  const grpc::Status s = HeaderThenSilence(stub_.get(), h, /*one_chunk=*/false, &lived);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("--stream-idle-timeout=300ms"));
  EXPECT_GE(lived, absl::Milliseconds(300));
  EXPECT_LT(lived, absl::Seconds(5));
  ExpectReleased();
  // Normal requests are not affected.
  const Inputs in = MakeInputs(h, 3);
  EXPECT_TRUE(Attend(stub_.get(), h, in, 1 << 12).status.ok());
  ExpectReleased();
}

TEST_F(StreamLimitsServiceTest, SlowAttendEndsBelowTheMinimumRate) {
  StartWith(absl::ZeroDuration(), 1 << 20, absl::Milliseconds(300));
  const v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 256, 2, 2, 16, R"({"dense": {}})");
  absl::Duration lived;
  const grpc::Status s = HeaderThenSilence(stub_.get(), h, /*one_chunk=*/true, &lived);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("upload too slow: 64 bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr("--min-upload-rate=1048576"));
  EXPECT_LT(lived, absl::Seconds(5));
  ExpectReleased();
}

TEST_F(StreamLimitsServiceTest, SilentAppendContextEndsAtTheIdleTimeout) {
  StartWith(absl::Milliseconds(300), 0, absl::ZeroDuration());
  ASSERT_TRUE(CreateBf16Context(stub_.get(), "idle", 2, 16, 1024).ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  v1::AppendContextResponse resp;
  auto w = stub_->AppendContext(&ctx, &resp);
  v1::AppendContextRequest m;
  m.mutable_header()->set_context("idle");
  m.mutable_header()->set_tokens(100);
  w->Write(m);
  const absl::Time start = absl::Now();
  const grpc::Status s = w->Finish();  // waits for the server's status
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("appending to the context"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  grpc::ClientContext del;
  v1::DeleteContextRequest dreq;
  dreq.set_name("idle");
  v1::DeleteContextResponse dresp;
  EXPECT_TRUE(stub_->DeleteContext(&del, dreq, &dresp).ok());
  ExpectReleased();
}

TEST_F(StreamLimitsServiceTest, HeaderPastTheUploadCapIsRefusedNamingTheFlag) {
  // [1, 256, 2, 16] f32: q, k and v 32 KiB each.
  StartWith(absl::Seconds(60), 0, absl::ZeroDuration(), /*max_upload=*/64 << 10);
  const v1::AttendHeader h = Header(v1::DTYPE_F32, 1, 256, 2, 2, 16, R"({"dense": {}})");
  const CallResult r = Attend(stub_.get(), h, MakeInputs(h, 1), 1 << 12);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.status.error_message(), HasSubstr("limit --max-upload-bytes=65536"));
  const v1::AttendHeader small = Header(v1::DTYPE_F32, 1, 128, 2, 2, 16, R"({"dense": {}})");
  EXPECT_TRUE(Attend(stub_.get(), small, MakeInputs(small, 2), 1 << 12).status.ok());
  ExpectReleased();
}

}  // namespace
}  // namespace attnserve
