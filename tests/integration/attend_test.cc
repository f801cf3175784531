// Every spec kind through the client library against the real server (CPU backend): O and LSE
// equal the float64 reference on fresh seeded inputs, for f32 and bf16, causal and not, with and
// without GQA.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/attn_client.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;

struct SpecCase {
  std::string name;
  // proto3 JSON of the spec; "$CSR" is replaced by a csr generator built for the token count.
  std::string json;
  int64_t tokens;
};

struct AttendCase {
  SpecCase spec;
  DType dtype;
  bool causal;
  bool gqa;
};

// A csr layout for `tokens` tokens at block size 64: each row keeps its diagonal, the previous
// block, and block 0 — different from every built-in generator, sorted and duplicate-free.
std::string CsrJson(int64_t tokens) {
  const int64_t nb = (tokens + 63) / 64;
  std::vector<int64_t> row_ptr = {0};
  std::vector<int64_t> col_idx;
  for (int64_t i = 0; i < nb; ++i) {
    std::vector<int64_t> cols = {0};
    if (i - 1 > 0) cols.push_back(i - 1);
    if (i > 0) cols.push_back(i);
    // Row i also keeps a block above the diagonal, which causal masks at token level.
    if (i + 2 < nb) cols.push_back(i + 2);
    col_idx.insert(col_idx.end(), cols.begin(), cols.end());
    row_ptr.push_back(static_cast<int64_t>(col_idx.size()));
  }
  return absl::StrCat(R"({"blockSparse": {"blockSize": 64, "csr": {"rowPtr": [)",
                      absl::StrJoin(row_ptr, ","), R"(], "colIdx": [)", absl::StrJoin(col_idx, ","),
                      "]}}}");
}

std::vector<SpecCase> SpecCases() {
  return {
      {"dense", R"({"dense": {}})", 257},
      {"window", R"({"window": {"size": 37}})", 300},
      {"dilated", R"({"dilated": {"segmentLengths": [64, 128, 256], "dilationRates": [1, 2, 4]}})",
       333},
      {"bs_local_window", R"({"blockSparse": {"blockSize": 64, "localWindow": {"width": 1}}})",
       450},
      {"bs_dilated_sparse",
       R"({"blockSparse": {"blockSize": 64, "dilatedSparse": {"rates": [2, 3]}}})", 512},
      {"bs_global_local",
       R"({"blockSparse": {"blockSize": 128, "globalLocal": {"globalBlocks": 1, "width": 1}}})",
       600},
      {"bs_strided", R"({"blockSparse": {"blockSize": 64, "strided": {"stride": 3, "width": 0}}})",
       400},
      {"bs_random",
       R"({"blockSparse": {"blockSize": 64, "random": {"keep": 0.3, "seed": "12345"}}})", 520},
      {"bs_csr", "$CSR", 390},
  };
}

std::vector<AttendCase> AllCases() {
  std::vector<AttendCase> cases;
  for (const SpecCase& s : SpecCases()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (bool causal : {false, true}) {
        // GQA in half the cases, chosen so that each spec kind sees both.
        const bool gqa = causal != (dtype == DType::kBF16);
        cases.push_back({s, dtype, causal, gqa});
      }
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<AttendCase>& info) {
  const AttendCase& c = info.param;
  return absl::StrCat(c.spec.name, "_", std::string(DTypeName(c.dtype)), c.causal ? "_causal" : "",
                      c.gqa ? "_gqa" : "");
}

class AttendTest : public SharedServerTest<::testing::TestWithParam<AttendCase>> {};

TEST_P(AttendTest, MatchesReference) {
  const AttendCase& c = GetParam();
  std::string json = c.spec.json == "$CSR" ? CsrJson(c.spec.tokens) : c.spec.json;
  v1::AttentionSpec spec = SpecFromJson(json);
  spec.set_causal(c.causal);
  const uint64_t seed = FreshSeed();
  const int64_t batch = c.gqa ? 1 : 2;
  const int64_t q_heads = 4;
  const int64_t kv_heads = c.gqa ? 2 : 4;
  const int64_t head_dim = c.gqa ? 32 : 64;
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", spec ", json, c.causal ? " causal" : "", ", [", batch,
                            ", ", c.spec.tokens, ", ", q_heads, "/", kv_heads, ", ", head_dim, "] ",
                            std::string(DTypeName(c.dtype))));
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  absl::StatusOr<Problem> problem =
      MakeProblem(c.dtype, batch, c.spec.tokens, q_heads, kv_heads, head_dim, spec, seed);
  ASSERT_TRUE(problem.ok()) << problem.status();

  std::unique_ptr<client::AttnClient> attn = server_->NewClient();
  ASSERT_NE(attn, nullptr);
  client::AttendInput input = AttendInputFor(*problem);
  input.return_lse = true;
  input.request_id = absl::StrCat("attend-test-", CaseName({c, 0}));
  client::CallOptions call;
  call.timeout = absl::Seconds(60);
  absl::StatusOr<client::AttendResult> result = attn->Attend(input, call);
  ASSERT_TRUE(result.ok()) << result.status() << "\nserver log:\n" << server_->Log();
  EXPECT_EQ(result->header.request_id(), input.request_id);
  EXPECT_EQ(result->header.backend(), "cpu");
  EXPECT_FALSE(result->header.devices().empty());
  EXPECT_GE(result->header.sparsity(), 0.0);
  EXPECT_LT(result->header.sparsity(), 1.0);
  EXPECT_GT(result->header.flops(), 0.0);
  ASSERT_TRUE(result->lse.has_value());
  ErrorStats stats;
  EXPECT_TRUE(
      CheckResult(*problem, *result, OTolerance(c.dtype), LseTolerance(c.dtype), &stats).ok())
      << CheckResult(*problem, *result, OTolerance(c.dtype), LseTolerance(c.dtype));
  std::printf("O max rel err %.3e, LSE max abs err %.3e, sparsity %.3f\n", stats.o_rel,
              stats.lse_max_abs, result->header.sparsity());
}

INSTANTIATE_TEST_SUITE_P(AllSpecs, AttendTest, ::testing::ValuesIn(AllCases()), CaseName);

// Without return_lse the response carries O only, and small response chunks (many of them) still
// assemble to the same O.
TEST(AttendOptionsTest, NoLseAndSmallResponseChunks) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  absl::StatusOr<Problem> problem =
      MakeProblem(DType::kF32, 1, 300, 2, 1, 64, SpecFromJson(R"({"dense": {}})"), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  client::ClientOptions options;
  options.target = (*server)->target();
  options.chunk_bytes = 10000;  // not a multiple of the element size: chunks split elements
  absl::StatusOr<std::unique_ptr<client::AttnClient>> attn = client::AttnClient::Create(options);
  ASSERT_TRUE(attn.ok()) << attn.status();
  client::AttendInput input = AttendInputFor(*problem);
  input.return_lse = false;
  input.response_chunk_bytes = 4096;
  int64_t last_sent = -1;
  int64_t last_received = -1;
  int calls = 0;
  client::CallOptions call;
  call.timeout = absl::Seconds(60);
  call.progress = [&](const client::Progress& p) {
    ++calls;
    EXPECT_GE(p.sent_bytes, last_sent);
    EXPECT_LE(p.sent_bytes, p.send_total_bytes);
    EXPECT_LE(p.received_bytes, std::max<int64_t>(p.receive_total_bytes, 0));
    last_sent = p.sent_bytes;
    last_received = p.received_bytes;
  };
  absl::StatusOr<client::AttendResult> result = (*attn)->Attend(input, call);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->lse.has_value());
  EXPECT_TRUE(result->header.lse_shape().empty());
  EXPECT_EQ(last_sent, static_cast<int64_t>(problem->q.nbytes() + 2 * problem->k.nbytes()));
  EXPECT_EQ(last_received, static_cast<int64_t>(problem->q.nbytes()));
  EXPECT_GT(calls, 10);
  absl::Status check = CheckResult(*problem, *result, OTolerance(DType::kF32), 0);
  EXPECT_TRUE(check.ok()) << check;
}

// The client retries UNAVAILABLE before any response: a server that is not listening yet.
TEST(AttendOptionsTest, RetriesWhileUnreachableThenFailsWithUnavailable) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  client::ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", *port);
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(50);
  options.max_backoff = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<client::AttnClient>> attn = client::AttnClient::Create(options);
  ASSERT_TRUE(attn.ok()) << attn.status();
  absl::StatusOr<Problem> problem =
      MakeProblem(DType::kF32, 1, 64, 1, 1, 16, SpecFromJson(R"({"dense": {}})"), 7);
  ASSERT_TRUE(problem.ok());
  client::AttendInput input = AttendInputFor(*problem);
  client::CallOptions call;
  call.timeout = absl::Seconds(20);
  const absl::Time start = absl::Now();
  absl::StatusOr<client::AttendResult> result = (*attn)->Attend(input, call);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  // Two backoffs of 40..120 ms each: well under the timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  absl::Status health = (*attn)->Health(call);
  EXPECT_EQ(health.code(), absl::StatusCode::kUnavailable) << health;
}

// A call made before the server listens succeeds once it does: the client retries UNAVAILABLE
// (nothing was received yet) with backoff, within the call's timeout.
TEST(AttendOptionsTest, RetriesUntilTheServerComesUp) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  client::ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", *port);
  options.max_attempts = 40;
  options.initial_backoff = absl::Milliseconds(100);
  options.max_backoff = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<client::AttnClient>> attn = client::AttnClient::Create(options);
  ASSERT_TRUE(attn.ok()) << attn.status();
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  absl::StatusOr<Problem> problem =
      MakeProblem(DType::kF32, 1, 100, 2, 2, 16, SpecFromJson(R"({"dense": {}})"), seed);
  ASSERT_TRUE(problem.ok());

  // The call starts first and keeps retrying; the server comes up on that port half a second
  // later (started from this thread: see ChildProcess on why the spawning thread must live on).
  client::AttendInput input = AttendInputFor(*problem);
  client::CallOptions call;
  call.timeout = absl::Seconds(60);
  absl::StatusOr<client::AttendResult> result = absl::UnknownError("not run");
  std::thread caller([&] { result = (*attn)->Attend(input, call); });
  absl::SleepFor(absl::Milliseconds(500));
  ServerOptions server_options;
  server_options.port = *port;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(server_options);
  caller.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->attempts, 1);
  std::printf("succeeded on attempt %d\n", result->attempts);
  absl::Status check =
      CheckResult(*problem, *result, OTolerance(DType::kF32), LseTolerance(DType::kF32));
  EXPECT_TRUE(check.ok()) << check;
}

// Client-side validation names the offending input.
TEST(AttendOptionsTest, ClientRejectsMismatchedInputs) {
  client::ClientOptions options;
  options.target = "127.0.0.1:1";
  absl::StatusOr<std::unique_ptr<client::AttnClient>> attn = client::AttnClient::Create(options);
  ASSERT_TRUE(attn.ok());
  HostTensor q = RandomTensor(DType::kF32, {1, 64, 2, 16}, 1);
  HostTensor k = RandomTensor(DType::kBF16, {1, 64, 1, 16}, 2);
  HostTensor v = RandomTensor(DType::kF32, {1, 64, 1, 16}, 3);
  client::AttendInput input;
  input.q = &q;
  input.k = &k;
  input.v = &v;
  absl::StatusOr<client::AttendResult> result = (*attn)->Attend(input);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("k: dtype"), std::string::npos) << result.status();

  client::ClientOptions bad;
  bad.target = "127.0.0.1:1";
  bad.chunk_bytes = 0;
  EXPECT_EQ(client::AttnClient::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve::testing
