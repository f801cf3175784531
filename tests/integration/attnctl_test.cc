// attnctl against the real server: run (random inputs with --check, and .npy inputs with --out
// read back), describe, health, bench --json, and the documented exit codes of failures.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attn_client.h"
#include "core/tensor/npy.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined (path of the attnctl binary)"
#endif

namespace attnserve::testing {
namespace {

class AttnctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start();
    if (!s.ok()) {
      start_error_ = new std::string(s.status().ToString());
      return;
    }
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << *start_error_; }

  // attnctl <args...>, bounded.
  static CommandResult Attnctl(std::vector<std::string> args) {
    std::string line = "attnctl";
    for (const std::string& a : args) absl::StrAppend(&line, " ", a);
    std::printf("$ %s\n", line.c_str());
    absl::StatusOr<CommandResult> r = RunCommand(ATTNCTL_BINARY, args, absl::Seconds(120));
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return {};
    }
    std::printf("%s(exit %d)\n", r->output.c_str(), r->exit_code);
    return *r;
  }

  static std::string Server() { return "--server=" + server_->target(); }

  static ServerProcess* server_;
  static std::string* start_error_;
};

ServerProcess* AttnctlTest::server_ = nullptr;
std::string* AttnctlTest::start_error_ = nullptr;

bool Contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// The JSON object in a command's output (stdout and stderr are captured together, so anything
// gRPC logs to stderr may surround it).
bool ParseJsonObject(const std::string& output, google::protobuf::Struct* out) {
  const size_t begin = output.find('{');
  const size_t end = output.rfind('}');
  if (begin == std::string::npos || end == std::string::npos || end < begin) return false;
  return google::protobuf::util::JsonStringToMessage(output.substr(begin, end - begin + 1), out)
      .ok();
}

TEST_F(AttnctlTest, RunRandomWithCheck) {
  const uint64_t seed = FreshSeed();
  CommandResult r = Attnctl({"run", Server(), "--random", "2,200,4,2,32", "--dtype", "f32",
                             absl::StrCat("--seed=", seed), "--spec",
                             R"({"blockSparse": {"blockSize": 64, "localWindow": {"width": 1}}})",
                             "--causal", "--check", "--tolerance=1e-5"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "backend    cpu")) << r.output;
  EXPECT_TRUE(Contains(r.output, "GFLOP/s")) << r.output;
  EXPECT_TRUE(Contains(r.output, "sparsity")) << r.output;
  EXPECT_TRUE(Contains(r.output, "\"causal\":true")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;

  r = Attnctl({"run", Server(), "--random=1,300,2,2,64", "--dtype=bf16",
               absl::StrCat("--seed=", seed + 1), R"(--spec={"window": {"size": 17}})", "--check"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
}

// --shm: the same request through a shared-memory region, checked the same way; the region is
// gone afterwards. --cuda-ipc in a CPU build says so (exit 1).
TEST_F(AttnctlTest, RunAndBenchThroughSharedMemory) {
  const uint64_t seed = FreshSeed();
  CommandResult r = Attnctl({"run", Server(), "--random=1,260,4,2,64", "--dtype=f32",
                             absl::StrCat("--seed=", seed), "--causal", "--check",
                             "--tolerance=1e-5", "--shm"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "regions    shm /")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
  r = Attnctl({"bench", Server(), "--random=1,128,2,2,64", "--requests=6", "--concurrency=2",
               "--check", "--shm"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
  auto list = server_->NewClient()->ListRegions();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->regions_size(), 0);
  r = Attnctl({"run", Server(), "--random=1,64,2,2,64", "--shm", "--cuda-ipc"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST_F(AttnctlTest, RunNpyInputsWritesOutputs) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnctl_npy_");
  ASSERT_TRUE(dir.ok());
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const std::string spec_json =
      R"({"dilated": {"segmentLengths": [64, 128], "dilationRates": [1, 2]}})";
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string dt(DTypeName(dtype));
    SCOPED_TRACE(dt);
    absl::StatusOr<Problem> problem =
        MakeProblem(dtype, 1, 250, 4, 2, 32, SpecFromJson(spec_json), seed);
    ASSERT_TRUE(problem.ok());
    const std::string q = (*dir)->File(dt + "_q.npy");
    const std::string k = (*dir)->File(dt + "_k.npy");
    const std::string v = (*dir)->File(dt + "_v.npy");
    const std::string o = (*dir)->File(dt + "_o.npy");
    const std::string lse = (*dir)->File(dt + "_lse.npy");
    ASSERT_TRUE(WriteNpy(q, problem->q).ok());
    ASSERT_TRUE(WriteNpy(k, problem->k).ok());
    ASSERT_TRUE(WriteNpy(v, problem->v).ok());
    std::vector<std::string> args = {"run",   Server(), "--q",   q,        "--k",
                                     k,       "--v",    v,       "--spec", spec_json,
                                     "--out", o,        "--lse", lse,      "--chunk-bytes=5000"};
    if (dtype == DType::kBF16) args.push_back("--dtype=bf16");  // bf16 .npy files are raw '<u2'
    CommandResult r = Attnctl(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "wrote      O to " + o)) << r.output;

    client::AttendResult read_back;
    absl::StatusOr<HostTensor> o_read = ReadNpy(o, dtype);
    ASSERT_TRUE(o_read.ok()) << o_read.status();
    absl::StatusOr<HostTensor> lse_read = ReadNpy(lse, DType::kF32);
    ASSERT_TRUE(lse_read.ok()) << lse_read.status();
    read_back.o = *std::move(o_read);
    read_back.lse = *std::move(lse_read);
    absl::Status check = CheckResult(*problem, read_back, OTolerance(dtype), LseTolerance(dtype));
    EXPECT_TRUE(check.ok()) << check;
  }
}

TEST_F(AttnctlTest, DescribeAndHealth) {
  CommandResult r = Attnctl({"describe", Server()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "backend     cpu")) << r.output;
  EXPECT_TRUE(Contains(r.output, "cpu:0")) << r.output;
  EXPECT_TRUE(Contains(r.output, "block_sparse")) << r.output;

  r = Attnctl({"describe", Server(), "--json"});
  EXPECT_EQ(r.exit_code, 0);
  google::protobuf::Struct json;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output;
  EXPECT_EQ(json.fields().at("backend").string_value(), "cpu");
  EXPECT_GE(json.fields().at("devices").list_value().values_size(), 1);

  r = Attnctl({"health", Server()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "SERVING")) << r.output;
}

TEST_F(AttnctlTest, BenchJson) {
  CommandResult r = Attnctl({"bench", Server(), "--random=1,128,2,1,32", "--dtype=bf16",
                             "--requests=8", "--concurrency=2", R"(--spec={"dense": {}})",
                             "--causal", "--check", "--json", "--timeout=30s"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  google::protobuf::Struct json;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output;
  const auto& f = json.fields();
  EXPECT_EQ(f.at("ok").number_value(), 8);
  EXPECT_EQ(f.at("failed").number_value(), 0);
  EXPECT_EQ(f.at("concurrency").number_value(), 2);
  EXPECT_GT(f.at("requests_per_s").number_value(), 0);
  EXPECT_GT(f.at("tokens_per_s").number_value(), 0);
  const auto& latency = f.at("latency_s").struct_value().fields();
  EXPECT_GT(latency.at("p50").number_value(), 0);
  EXPECT_LE(latency.at("p50").number_value(), latency.at("p90").number_value());
  EXPECT_LE(latency.at("p90").number_value(), latency.at("p99").number_value());
  EXPECT_TRUE(f.at("check").struct_value().fields().at("pass").bool_value());
  EXPECT_EQ(f.at("backend").string_value(), "cpu");

  // The text form names the same quantities.
  r = Attnctl({"bench", Server(), "--random=1,64,1,1,16", "--dtype=f32", "--duration=1s",
               "--concurrency=2", "--timeout=30s"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "requests/s")) << r.output;
  EXPECT_TRUE(Contains(r.output, "p99")) << r.output;
}

TEST_F(AttnctlTest, FailuresHaveDocumentedExitCodes) {
  CommandResult r = Attnctl({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "Exit codes")) << r.output;

  r = Attnctl({"run", Server(), "--random=1,64,1,1,16", "--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "unknown flag --no-such-flag")) << r.output;

  r = Attnctl({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);

  // Rejected by the server: 10 + INVALID_ARGUMENT (3), with the code name and the field.
  r = Attnctl({"run", Server(), "--random=1,64,1,1,16", "--dtype=f32",
               R"(--spec={"dilated": {"segmentLengths": [8], "dilationRates": [16]}})"});
  EXPECT_EQ(r.exit_code, 13);
  EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT")) << r.output;
  EXPECT_TRUE(Contains(r.output, "spec.dilated.dilation_rates[0]")) << r.output;

  // Malformed JSON never reaches the server: a usage error.
  r = Attnctl({"run", Server(), "--random=1,64,1,1,16", "--spec={\"dense\": "});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "spec")) << r.output;

  // Nobody listening: 10 + UNAVAILABLE (14).
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  r = Attnctl({"health", absl::StrCat("--server=127.0.0.1:", *port), "--timeout=2s"});
  EXPECT_EQ(r.exit_code, 24);
  EXPECT_TRUE(Contains(r.output, "UNAVAILABLE")) << r.output;
}

// --placement: the hint reaches the server (2 CPU workers) and run/bench print what ran.
TEST(AttnctlPlacementTest, PlacementFlag) {
  ServerOptions options;
  options.extra_args = {"--cpu-workers=2", "--cpu-threads=1"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = "--server=" + (*server)->target();
  auto attnctl = [](std::vector<std::string> args) -> CommandResult {
    absl::StatusOr<CommandResult> r = RunCommand(ATTNCTL_BINARY, args, absl::Seconds(120));
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return {};
    }
    std::printf("%s(exit %d)\n", r->output.c_str(), r->exit_code);
    return *r;
  };
  CommandResult r = attnctl({"run", target, "--random=1,301,4,2,32", "--dtype=f32", "--causal",
                             "--placement=ring", "--check", "--tolerance=1e-5"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "on cpu:0, cpu:1, placement ring") ||
              Contains(r.output, "on cpu:1, cpu:0, placement ring"))
      << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;

  r = attnctl({"run", target, "--random=2,130,4,2,32", "--dtype=f32", "--placement", "data",
               "--check", "--tolerance=1e-5"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "placement data_parallel")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;

  r = attnctl({"bench", target, "--random=1,200,2,2,16", "--dtype=f32", "--requests=2",
               "--placement=ring"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "placement ring on")) << r.output;

  r = attnctl({"run", target, "--random=1,64,1,1,16", "--placement=sideways"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "--placement")) << r.output;
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

}  // namespace
}  // namespace attnserve::testing
