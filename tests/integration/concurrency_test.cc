// Many clients at once: every response equals the reference of its own request (no cross-talk
// between calls), and a server with a queue of one refuses the overflow with RESOURCE_EXHAUSTED
// without hanging or corrupting the requests it accepts.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/attn_client.h"
#include "gtest/gtest.h"
#include "wire/convert.h"
#include "tests/integration/server_fixture.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;

constexpr int kThreads = 8;
constexpr int kRequestsPerThread = 50;

// Spec kinds cycled through by the mixed workload (valid for any token count >= 1).
const char* const kSpecs[] = {
    R"({"dense": {}})",
    R"({"window": {"size": 9}})",
    R"({"dilated": {"segmentLengths": [32, 64], "dilationRates": [1, 2]}})",
    R"({"blockSparse": {"blockSize": 64, "localWindow": {"width": 1}}})",
    R"({"blockSparse": {"blockSize": 64, "dilatedSparse": {"rates": [2]}}})",
    R"({"blockSparse": {"blockSize": 64, "globalLocal": {"globalBlocks": 1, "width": 0}}})",
    R"({"blockSparse": {"blockSize": 64, "strided": {"stride": 2, "width": 0}}})",
    R"({"blockSparse": {"blockSize": 64, "random": {"keep": 0.5, "seed": "3"}}})",
};

TEST(ConcurrencyTest, MixedRequestsFromManyThreadsEachMatchTheirReference) {
  ServerOptions options;
  options.extra_args = {"--cpu_workers=2"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  // One client (one channel) shared by every thread, as an application would.
  std::unique_ptr<client::AttnClient> attn = (*server)->NewClient();
  ASSERT_NE(attn, nullptr);
  const uint64_t base_seed = FreshSeed();
  std::printf("base seed %llu\n", static_cast<unsigned long long>(base_seed));

  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> ok_count{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(base_seed + 1000 * t);
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(what);
      };
      for (int i = 0; i < kRequestsPerThread; ++i) {
        const uint64_t seed = base_seed + 1000 * t + 10 * i;
        const DType dtype = (rng() % 2) ? DType::kF32 : DType::kBF16;
        const int64_t tokens = 40 + static_cast<int64_t>(rng() % 160);
        const int64_t kv_heads = 1 + static_cast<int64_t>(rng() % 2);
        const int64_t q_heads = kv_heads * (1 + static_cast<int64_t>(rng() % 2));
        const int64_t head_dim = (rng() % 2) ? 16 : 32;
        const int64_t batch = 1 + static_cast<int64_t>(rng() % 2);
        const char* spec_json = kSpecs[(t + i) % std::size(kSpecs)];
        v1::AttentionSpec spec = SpecFromJson(spec_json);
        spec.set_causal(rng() % 2);
        const std::string id = absl::StrCat("t", t, "-r", i);
        const std::string what =
            absl::StrCat(id, " seed ", seed, " [", batch, ", ", tokens, ", ", q_heads, "/",
                         kv_heads, ", ", head_dim, "] ", std::string(DTypeName(dtype)), " ",
                         spec_json, spec.causal() ? " causal" : "");
        absl::StatusOr<Problem> problem =
            MakeProblem(dtype, batch, tokens, q_heads, kv_heads, head_dim, spec, seed);
        if (!problem.ok()) {
          fail(absl::StrCat(what, ": ", problem.status().ToString()));
          continue;
        }
        client::AttendInput input = AttendInputFor(*problem);
        input.request_id = id;
        client::CallOptions call;
        call.timeout = absl::Seconds(60);
        absl::StatusOr<client::AttendResult> result = attn->Attend(input, call);
        if (!result.ok()) {
          fail(absl::StrCat(what, ": ", result.status().ToString()));
          continue;
        }
        if (result->header.request_id() != id) {
          fail(absl::StrCat(what, ": response for request id ", result->header.request_id()));
          continue;
        }
        absl::Status check = CheckResult(*problem, *result, OTolerance(dtype), LseTolerance(dtype));
        if (!check.ok()) {
          fail(absl::StrCat(what, ": ", check.ToString()));
          continue;
        }
        ok_count.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("%d of %d requests correct in %.1f s\n", ok_count.load(),
              kThreads * kRequestsPerThread, seconds);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(ok_count.load(), kThreads * kRequestsPerThread);
  EXPECT_TRUE((*server)->Running()) << (*server)->Log();
}

// Tiny requests back to back (each a millisecond of work) stress the per-call state machine of
// the server: a call finishing while its job completes, its response write and its half-close
// all race. Every call must complete correctly and the server must stay up.
TEST(ConcurrencyTest, ManyTinyRequestsBackToBack) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::AttnClient> attn = (*server)->NewClient();
  ASSERT_NE(attn, nullptr);
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  absl::StatusOr<Problem> problem =
      MakeProblem(DType::kF32, 1, 64, 1, 1, 16, SpecFromJson(R"({"dense": {}})"), seed);
  ASSERT_TRUE(problem.ok()) << problem.status();
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(problem->spec);
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<ReferenceResult> ref =
      ReferenceAttention(*spec, problem->q, problem->k, problem->v);
  ASSERT_TRUE(ref.ok()) << ref.status();

  constexpr int kTinyThreads = 4;
  constexpr int kTinyRequests = 500;
  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < kTinyThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kTinyRequests; ++i) {
        client::AttendInput input = AttendInputFor(*problem);
        input.request_id = absl::StrCat("tiny-", t, "-", i);
        client::CallOptions call;
        call.timeout = absl::Seconds(20);
        absl::StatusOr<client::AttendResult> result = attn->Attend(input, call);
        absl::Status check =
            result.ok() ? CheckResultAgainst(*ref, *problem, *result, OTolerance(DType::kF32),
                                             LseTolerance(DType::kF32))
                        : result.status();
        if (!check.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(absl::StrCat(input.request_id, ": ", check.ToString()));
          return;  // the rest of this thread's calls would only repeat the failure
        }
        ok.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("%d of %d tiny requests correct in %.1f s\n", ok.load(), kTinyThreads * kTinyRequests,
              absl::ToDoubleSeconds(absl::Now() - start));
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(ok.load(), kTinyThreads * kTinyRequests) << "attnserve's log:\n" << (*server)->Log();
  EXPECT_TRUE((*server)->Running())
      << "attnserve " << (*server)->process().ExitDescription() << "; its log:\n"
      << (*server)->Log();
}

TEST(ConcurrencyTest, QueueLimitRefusesOverflowWithoutHangingOrCorruption) {
  ServerOptions options;
  options.extra_args = {"--max_queue=1", "--cpu_workers=1"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::AttnClient> attn = (*server)->NewClient();
  ASSERT_NE(attn, nullptr);

  // Two distinct problems (so that a response handed to the wrong call would show), each large
  // enough (~0.8 GFLOP of dense causal work) to keep the single worker busy while the rest arrive.
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::vector<Problem> problems;
  std::vector<ReferenceResult> references;
  for (int p = 0; p < 2; ++p) {
    absl::StatusOr<Problem> problem =
        MakeProblem(DType::kF32, 1, 1024, 4, 2, 64,
                    SpecFromJson(R"({"dense": {}, "causal": true})"), seed + 100 * p);
    ASSERT_TRUE(problem.ok()) << problem.status();
    absl::StatusOr<AttentionSpec> spec = SpecFromProto(problem->spec);
    ASSERT_TRUE(spec.ok());
    absl::StatusOr<ReferenceResult> ref =
        ReferenceAttention(*spec, problem->q, problem->k, problem->v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    problems.push_back(*std::move(problem));
    references.push_back(*std::move(ref));
  }

  constexpr int kCalls = 16;
  std::mutex mu;
  std::vector<std::string> failures;
  int ok = 0;
  int refused = 0;
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int c = 0; c < kCalls; ++c) {
    threads.emplace_back([&, c] {
      const Problem& problem = problems[c % 2];
      client::AttendInput input = AttendInputFor(problem);
      input.request_id = absl::StrCat("queue-", c);
      client::CallOptions call;
      call.timeout = absl::Seconds(120);  // a hang shows as DEADLINE_EXCEEDED, not a stuck test
      absl::StatusOr<client::AttendResult> result = attn->Attend(input, call);
      std::lock_guard<std::mutex> lock(mu);
      if (result.ok()) {
        absl::Status check = CheckResultAgainst(references[c % 2], problem, *result,
                                                OTolerance(DType::kF32), LseTolerance(DType::kF32));
        if (check.ok() && result->header.request_id() == input.request_id) {
          ++ok;
        } else {
          failures.push_back(absl::StrCat(input.request_id, ": ", check.ToString(), " id ",
                                          result->header.request_id()));
        }
      } else if (result.status().code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
        if (result.status().message().find("queue") == std::string::npos) {
          failures.push_back(absl::StrCat(input.request_id,
                                          ": RESOURCE_EXHAUSTED without naming "
                                          "the queue: ",
                                          result.status().ToString()));
        }
      } else {
        failures.push_back(absl::StrCat(input.request_id, ": ", result.status().ToString()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("%d ok, %d refused in %.1f s\n", ok, refused,
              absl::ToDoubleSeconds(absl::Now() - start));
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(ok + refused, kCalls);
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1) << "16 simultaneous calls never exceeded a queue of 1";
  ASSERT_TRUE((*server)->Running()) << (*server)->Log();
  EXPECT_TRUE((*server)->CheckHealth().ok());
}

}  // namespace
}  // namespace attnserve::testing
