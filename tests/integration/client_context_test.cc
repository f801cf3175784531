// The C++ client's inference shapes against the real server (CPU backend): keys of another
// length with a query offset, and a context created, appended in pieces, attended with Q alone,
// listed and deleted, every result equal to the float64 reference.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attn_client.h"
#include "core/reference/reference.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"
#include "wire/convert.h"

namespace attnserve::testing {
namespace {

using client::AttendInput;

// O and LSE of `r` against the reference of (spec with q_offset) on q, k, v.
void ExpectReference(const v1::AttentionSpec& proto_spec, int64_t q_offset, const HostTensor& q,
                     const HostTensor& k, const HostTensor& v, const client::AttendResult& r) {
  AttentionSpec spec = *SpecFromProto(proto_spec);
  spec.q_offset = q_offset;
  absl::StatusOr<ReferenceResult> ref = ReferenceAttention(spec, q, k, v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_TRUE(r.lse.has_value());
  const ErrorStats e = CompareToReference(*ref, r.o, &*r.lse);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LE(e.o_rel, OTolerance(q.dtype()));
  EXPECT_LE(e.lse_max_abs, LseTolerance(q.dtype()));
}

class ClientContextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = ServerProcess::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static ServerProcess* server_;
};
ServerProcess* ClientContextTest::server_ = nullptr;

TEST_F(ClientContextTest, KeysOfAnotherLengthWithAnOffset) {
  auto client = server_->NewClient();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const HostTensor q = RandomTensor(DType::kF32, {2, 24, 4, 32}, seed);
  const HostTensor k = RandomTensor(DType::kF32, {2, 300, 2, 32}, seed + 1);
  const HostTensor v = RandomTensor(DType::kF32, {2, 300, 2, 32}, seed + 2);
  AttendInput in;
  in.q = &q;
  in.k = &k;
  in.v = &v;
  in.spec = SpecFromJson(R"({"dense": {}, "causal": true})");
  in.q_offset = 200;
  auto r = client->Attend(in);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectReference(in.spec, 200, q, k, v, *r);
}

TEST_F(ClientContextTest, ContextLifecycle) {
  auto client = server_->NewClient();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const HostTensor k = RandomTensor(DType::kBF16, {1, 500, 2, 64}, seed);
  const HostTensor v = RandomTensor(DType::kBF16, {1, 500, 2, 64}, seed + 1);
  auto created = client->CreateContext("client-ctx", DType::kBF16, 2, 64);
  ASSERT_TRUE(created.ok()) << created.status();
  // Two appends: rows [0, 320) and [320, 500), the second guarded by expect_tokens.
  const int64_t row = 2 * 64 * 2;
  for (auto [from, n] : {std::pair<int64_t, int64_t>{0, 320}, {320, 180}}) {
    HostTensor kp = *HostTensor::Create(DType::kBF16, {n, 2, 64});
    HostTensor vp = *HostTensor::Create(DType::kBF16, {n, 2, 64});
    std::memcpy(kp.data(), k.data() + from * row, n * row);
    std::memcpy(vp.data(), v.data() + from * row, n * row);
    auto appended = client->AppendContext("client-ctx", kp, vp, from);
    ASSERT_TRUE(appended.ok()) << appended.status();
    EXPECT_EQ(appended->tokens(), from + n);
  }
  const HostTensor q = RandomTensor(DType::kBF16, {1, 4, 8, 64}, seed + 2);
  AttendInput in;
  in.q = &q;
  in.shape = AttentionShape{1, 4, 8, 2, 64};
  in.spec = SpecFromJson(R"({"window": {"size": "100"}, "causal": true})");
  in.context = "client-ctx";
  auto r = client->Attend(in);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectReference(in.spec, 500 - 4, q, k, v, *r);  // default: the context's last rows
  in.k = &k;
  EXPECT_EQ(client->Attend(in).status().code(), absl::StatusCode::kInvalidArgument);
  auto listed = client->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->contexts_size(), 1);
  EXPECT_EQ(listed->contexts(0).tokens(), 500);
  ASSERT_TRUE(client->DeleteContext("client-ctx").ok());
  EXPECT_EQ(client->GetContext("client-ctx").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace attnserve::testing
