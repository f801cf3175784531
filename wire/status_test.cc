#include "wire/status.h"

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(StatusUtilTest, MapsEveryCanonicalCodeAndKeepsTheMessage) {
  for (int c = 0; c <= 16; ++c) {
    const absl::Status s(static_cast<absl::StatusCode>(c), c == 0 ? "" : "field: rule");
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    if (c != 0) {
      EXPECT_EQ(g.error_message(), "field: rule");
    }
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("x")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::DeadlineExceededError("x")).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  // Codes outside the canonical range become UNKNOWN.
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "odd")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

TEST(StatusUtilTest, CodeNames) {
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace attnserve
