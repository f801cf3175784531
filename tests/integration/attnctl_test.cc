// attnctl against the real server: run (random inputs with --check, keys of another length with
// a query offset, and .npy inputs with --out read back), describe, health, bench --json, the
// context commands (create, append in pieces, attend with --check, stats, list, delete), and the
// documented exit codes of failures.
#include <cstdint>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

class AttnctlTest : public SharedServerTest<> {
 protected:
  // attnctl <args...>, bounded.
  static CommandResult Attnctl(std::vector<std::string> args) {
    return RunLogged("attnctl", ATTNCTL_BINARY, args, absl::Seconds(120));
  }

  static std::string Server() { return "--server=" + server_->target(); }
};

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
  EXPECT_TRUE(Contains(r.output, "\"causal\": true")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;

  r = Attnctl({"run", Server(), "--random=1,300,2,2,64", "--dtype=bf16",
               absl::StrCat("--seed=", seed + 1), R"(--spec={"window": {"size": 17}})", "--check"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
  // The spec echo writes int64 values as numbers (the proto3 mapping would write "17").
  EXPECT_TRUE(Contains(r.output, R"(spec       {"window": {"size": 17}})")) << r.output;
}

// --shm: the same request through a shared-memory region, checked the same way; the region is
// gone afterwards. --cuda-ipc in a CPU build says so (exit 1).
TEST_F(AttnctlTest, RunAndBenchThroughSharedMemory) {
  const uint64_t seed = FreshSeed();
  CommandResult r =
      Attnctl({"run", Server(), "--random=1,260,4,2,64", "--dtype=f32",
               absl::StrCat("--seed=", seed), "--causal", "--check", "--tolerance=1e-5", "--shm"});
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

// Nq != Nkv: 3 queries at positions 197-199 against 200 keys (a short decode), checked against
// the float64 reference; the same through a shared-memory region; and the flags' misuse.
TEST_F(AttnctlTest, RunKeysOfAnotherLengthWithAnOffset) {
  const uint64_t seed = FreshSeed();
  CommandResult r = Attnctl({"run", Server(), "--random=1,64,4,2,32", "--q-len", "3", "--kv-len",
                             "200", "--q-offset", "197", "--causal", "--dtype=f32",
                             absl::StrCat("--seed=", seed), "--check", "--tolerance=1e-5"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "[1, 3, 4, 32] f32, kv_heads 2, kv_tokens 200, q_offset 197"))
      << r.output;
  EXPECT_TRUE(Contains(r.output, "output     O [1, 3, 4, 32]")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;

  // Chunked prefill (40 queries at 160 over 200 keys), bf16, a window; then through --shm.
  for (const char* via : {"--quiet", "--shm"}) {
    r = Attnctl({"run", Server(), "--random=2,1,4,2,64", "--q-len=40", "--kv-len=200",
                 "--q-offset=160", R"(--spec={"window": {"size": 50}, "causal": true})",
                 absl::StrCat("--seed=", seed + 1), "--check", via});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
  }

  // --q-len and --kv-len shape random inputs only.
  r = Attnctl({"run", Server(), "--q=q.npy", "--k=k.npy", "--v=v.npy", "--q-len=3"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Contains(r.output, "--q-len")) << r.output;
  r = Attnctl({"run", Server(), "--random=1,64,1,1,16", "--kv-len=0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// A context's life through attnctl: created, appended in two pieces guarded by --expect-tokens
// (a wrong guard refused), attended with Q alone and checked against the float64 reference of
// the rows appended, its stats and listing, deleted; afterwards attends name it as deleted.
TEST_F(AttnctlTest, ContextLifecycle) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnctl_ctx_");
  ASSERT_TRUE(dir.ok());
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  constexpr int64_t kRows = 500, kFirst = 320, kRowBytes = 2 * 64 * 2;  // bf16 [2, 64] a row
  const HostTensor k = RandomTensor(DType::kBF16, {kRows, 2, 64}, seed);
  const HostTensor v = RandomTensor(DType::kBF16, {kRows, 2, 64}, seed + 1);
  ASSERT_TRUE(WriteNpy((*dir)->File("k.npy"), k).ok());
  ASSERT_TRUE(WriteNpy((*dir)->File("v.npy"), v).ok());
  // The pieces: rows [0, 320) as [T, Hkv, D], rows [320, 500) as [1, T, Hkv, D].
  const struct {
    const char* suffix;
    std::vector<int64_t> dims;
    int64_t from;
  } pieces[] = {{"1", {kFirst, 2, 64}, 0}, {"2", {1, kRows - kFirst, 2, 64}, kFirst}};
  for (const auto& p : pieces) {
    for (const auto& [name, all] : {std::pair{"k", &k}, std::pair{"v", &v}}) {
      HostTensor part = *HostTensor::Create(DType::kBF16, p.dims);
      std::memcpy(part.data(), all->data() + p.from * kRowBytes, part.nbytes());
      ASSERT_TRUE(WriteNpy((*dir)->File(absl::StrCat(name, p.suffix, ".npy")), part).ok());
    }
  }
  const std::string ctx = "attnctl-ctx";

  CommandResult r = Attnctl({"context", "create", ctx, Server(), "--dtype=bf16", "--kv-heads=2",
                             "--head-dim", "64", "--ttl=10m"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "context    " + ctx + " on cpu:0")) << r.output;
  EXPECT_TRUE(Contains(r.output, "0 rows, growable")) << r.output;
  EXPECT_TRUE(Contains(r.output, "ttl        600 s")) << r.output;

  r = Attnctl({"context", "append", ctx, Server(), "--k", (*dir)->File("k1.npy"), "--v",
               (*dir)->File("v1.npy"), "--expect-tokens=0", "--chunk-bytes=10000"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "appended   320 rows")) << r.output;
  EXPECT_TRUE(Contains(r.output, "rows/s")) << r.output;
  EXPECT_TRUE(Contains(r.output, ctx + " now 320 rows")) << r.output;

  // A guard that does not hold: FAILED_PRECONDITION (10 + 9), nothing appended.
  r = Attnctl({"context", "append", ctx, Server(), "--k", (*dir)->File("k2.npy"), "--v",
               (*dir)->File("v2.npy"), "--expect-tokens=0"});
  EXPECT_EQ(r.exit_code, 19) << r.output;
  EXPECT_TRUE(Contains(r.output, "FAILED_PRECONDITION")) << r.output;

  r = Attnctl({"context", "append", ctx, Server(), "--k", (*dir)->File("k2.npy"), "--v",
               (*dir)->File("v2.npy"), "--expect-tokens=320", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  google::protobuf::Struct json;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output;
  EXPECT_EQ(json.fields().at("appended_rows").number_value(), kRows - kFirst);
  EXPECT_EQ(json.fields().at("tokens").number_value(), kRows);

  // Decode-like: 4 random queries (8 heads over the context's 2) on the last rows, causal
  // window; then Q from a file at an explicit offset, written out.
  r = Attnctl({"context", "attend", ctx, Server(), absl::StrCat("--random-q=4,", seed + 2),
               "--q-heads=8", R"(--spec={"window": {"size": 100}, "causal": true})", "--check",
               "--k", (*dir)->File("k.npy"), "--v", (*dir)->File("v.npy")});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "q_offset default (496")) << r.output;
  EXPECT_TRUE(Contains(r.output, "output     O [1, 4, 8, 64] bf16")) << r.output;
  EXPECT_TRUE(Contains(r.output, "server: receive")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;

  const HostTensor q = RandomTensor(DType::kBF16, {16, 4, 64}, seed + 3);
  ASSERT_TRUE(WriteNpy((*dir)->File("q.npy"), q).ok());
  r = Attnctl({"context", "attend", ctx, Server(), "--q", (*dir)->File("q.npy"), "--q-offset=100",
               R"(--spec={"dense": {}, "causal": true})", "--check", "--k", (*dir)->File("k.npy"),
               "--v", (*dir)->File("v.npy"), "--out", (*dir)->File("o.npy")});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "q_offset 100")) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
  absl::StatusOr<HostTensor> o = ReadNpy((*dir)->File("o.npy"), DType::kBF16);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->dims(), (std::vector<int64_t>{1, 16, 4, 64}));

  // --check needs the rows; rows that are not the context's are refused before sending.
  r = Attnctl({"context", "attend", ctx, Server(), "--random-q=1", "--check"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Contains(r.output, "--check needs the context's rows")) << r.output;
  r = Attnctl({"context", "attend", ctx, Server(), "--random-q=1", "--check", "--k",
               (*dir)->File("k1.npy"), "--v", (*dir)->File("v1.npy")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Contains(r.output, "hold 320 rows but context 'attnctl-ctx' holds 500")) << r.output;

  r = Attnctl({"context", "stats", ctx, Server()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "500 rows, growable")) << r.output;
  EXPECT_TRUE(Contains(r.output, "attends    2 so far")) << r.output;
  r = Attnctl({"context", "stats", ctx, Server(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output;
  EXPECT_EQ(json.fields().at("tokens").number_value(), 500);  // int64 as a JSON number
  EXPECT_EQ(json.fields().at("device").string_value(), "cpu:0");

  r = Attnctl({"context", "list", Server()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "TOKENS")) << r.output;
  EXPECT_TRUE(Contains(r.output, ctx)) << r.output;
  r = Attnctl({"context", "list", Server(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output;
  ASSERT_EQ(json.fields().at("contexts").list_value().values_size(), 1);

  r = Attnctl({"context", "delete", ctx, Server()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "deleted    " + ctx)) << r.output;

  // Gone: NOT_FOUND (10 + 5), the message names the context and says it was deleted.
  r = Attnctl({"context", "attend", ctx, Server(), "--random-q=1"});
  EXPECT_EQ(r.exit_code, 15) << r.output;
  EXPECT_TRUE(Contains(r.output, "NOT_FOUND")) << r.output;
  EXPECT_TRUE(Contains(r.output, "'" + ctx + "'")) << r.output;
  EXPECT_TRUE(Contains(r.output, "deleted")) << r.output;
  r = Attnctl({"context", "delete", ctx, Server()});
  EXPECT_EQ(r.exit_code, 15) << r.output;
  r = Attnctl({"context", "list", Server()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "no contexts")) << r.output;
  auto list = server_->NewClient()->ListContexts();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->contexts_size(), 0);
}

// --shards 2 on a server of two CPU devices: the rows are split by sequence (the device line
// names both), appended across the split, and a decode step against them (each device attends
// its rows, the partials merged) matches the float64 reference of all the rows.
TEST(AttnctlSplitContextTest, ContextSplitOverTwoDevices) {
  ServerOptions options;
  options.extra_args = {"--cpu-workers=2", "--cpu-threads=1"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto Server = [&] { return "--server=" + (*server)->target(); };
  const auto Attnctl = [](std::vector<std::string> args) {
    return RunLogged("attnctl", ATTNCTL_BINARY, args, absl::Seconds(120));
  };
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnctl_split_");
  ASSERT_TRUE(dir.ok());
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const HostTensor k = RandomTensor(DType::kBF16, {400, 2, 64}, seed);
  const HostTensor v = RandomTensor(DType::kBF16, {400, 2, 64}, seed + 1);
  ASSERT_TRUE(WriteNpy((*dir)->File("k.npy"), k).ok());
  ASSERT_TRUE(WriteNpy((*dir)->File("v.npy"), v).ok());
  const std::string ctx = "attnctl-split";
  CommandResult r = Attnctl({"context", "create", ctx, Server(), "--kv-heads=2", "--head-dim=64",
                             "--capacity=400", "--shards=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "context    " + ctx + " on cpu:0,cpu:1")) << r.output;
  r = Attnctl({"context", "append", ctx, Server(), "--k", (*dir)->File("k.npy"), "--v",
               (*dir)->File("v.npy"), "--expect-tokens=0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Attnctl({"context", "attend", ctx, Server(), absl::StrCat("--random-q=2,", seed + 2),
               "--q-heads=8", R"(--spec={"dense": {}, "causal": true})", "--check", "--k",
               (*dir)->File("k.npy"), "--v", (*dir)->File("v.npy")});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, ": PASS")) << r.output;
  r = Attnctl({"context", "create", "bad-shards", Server(), "--kv-heads=2", "--head-dim=64",
               "--shards=-1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Contains(r.output, "--shards: expected a count >= 0")) << r.output;
  r = Attnctl({"context", "delete", ctx, Server()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

// The context commands' usage errors: no NAME, unknown subcommand, exclusive flags.
TEST_F(AttnctlTest, ContextUsageErrors) {
  CommandResult r = Attnctl({"context", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "attnctl context attend NAME")) << r.output;
  r = Attnctl({"context"});
  EXPECT_EQ(r.exit_code, 2);
  r = Attnctl({"context", "frobnicate", "x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "unknown context subcommand 'frobnicate'")) << r.output;
  r = Attnctl({"context", "create", Server(), "--kv-heads=2", "--head-dim=64"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "NAME")) << r.output;
  r = Attnctl({"context", "create", "a", "b", Server(), "--kv-heads=2", "--head-dim=64"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "unexpected argument 'b'")) << r.output;
  r = Attnctl({"context", "create", "a", Server(), "--head-dim=64"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "--kv-heads")) << r.output;
  r = Attnctl({"context", "create", "a", Server(), "--kv-heads=2", "--head-dim=64", "--capacity=8",
               "--growable"});
  EXPECT_EQ(r.exit_code, 2);
  r = Attnctl({"context", "append", "a", Server(), "--random=8", "--k=k.npy", "--v=v.npy"});
  EXPECT_EQ(r.exit_code, 2);
  r = Attnctl({"context", "attend", "a", Server()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.output, "--random-q")) << r.output;
  // A context nobody created: NOT_FOUND naming it.
  r = Attnctl({"context", "stats", "never-made", Server()});
  EXPECT_EQ(r.exit_code, 15);
  EXPECT_TRUE(Contains(r.output, "'never-made'")) << r.output;
}

TEST_F(AttnctlTest, DescribeAndHealth) {
  CommandResult r = Attnctl({"describe", Server()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.output, "backend     cpu")) << r.output;
  EXPECT_TRUE(Contains(r.output, "head dims [1-256]")) << r.output;
  EXPECT_TRUE(Contains(r.output, "cpu:0")) << r.output;
  EXPECT_TRUE(Contains(r.output, "block_sparse")) << r.output;

  r = Attnctl({"describe", Server(), "--json"});
  EXPECT_EQ(r.exit_code, 0);
  google::protobuf::Struct json;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output;
  EXPECT_EQ(json.fields().at("backend").string_value(), "cpu");
  EXPECT_GE(json.fields().at("devices").list_value().values_size(), 1);
  // Head dims as ranges (the CPU backend runs 1-256), int64 limits as numbers.
  const auto& limits = json.fields().at("limits").struct_value().fields();
  const auto& head_dims = limits.at("headDims").list_value();
  ASSERT_EQ(head_dims.values_size(), 1) << r.output;
  EXPECT_EQ(head_dims.values(0).struct_value().fields().at("min").number_value(), 1);
  EXPECT_EQ(head_dims.values(0).struct_value().fields().at("max").number_value(), 256);
  EXPECT_GT(limits.at("maxRequestBytes").number_value(), 0) << r.output;
  EXPECT_GT(json.fields()
                .at("devices")
                .list_value()
                .values(0)
                .struct_value()
                .fields()
                .at("memoryTotalBytes")
                .number_value(),
            0)
      << r.output;

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

// The --timeout default each subcommand shows in its usage line, in its flag list and in the
// overview (`attnctl help`) are one and the same (the code applies what the flag list shows).
TEST(AttnctlHelpTest, TimeoutDefaultsAgree) {
  auto one_line = [](std::string text) {
    return std::regex_replace(text, std::regex("\\s+"), " ");
  };
  absl::StatusOr<CommandResult> overview = RunCommand(ATTNCTL_BINARY, {"help"});
  ASSERT_TRUE(overview.ok()) << overview.status();
  std::smatch m;
  const std::string all = one_line(overview->output);
  ASSERT_TRUE(std::regex_search(all, m, std::regex(R"(--timeout DURATION .*?\(default ([^)]*)\))")))
      << all;
  const std::string defaults = m[1];  // "5m; health 5s; describe, context create, ... 10s"
  const std::string base = defaults.substr(0, defaults.find(';'));
  for (const char* command :
       {"run", "bench", "health", "describe", "context create", "context append", "context attend",
        "context stats", "context list", "context delete"}) {
    SCOPED_TRACE(command);
    std::vector<std::string> args = absl::StrSplit(command, ' ');
    args.push_back("--help");
    absl::StatusOr<CommandResult> help = RunCommand(ATTNCTL_BINARY, args);
    ASSERT_TRUE(help.ok()) << help.status();
    const std::string text = one_line(help->output);
    ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(\[--timeout ([^\]]+)\])"))) << text;
    const std::string usage_default = m[1];
    ASSERT_TRUE(
        std::regex_search(text, m, std::regex(R"(--timeout DURATION .*?\(default ([^)]*)\))")))
        << text;
    EXPECT_EQ(usage_default, m[1].str()) << text;
    // The overview: the command named with its default, or the base default.
    const bool named = std::regex_search(
        defaults,
        std::regex(absl::StrCat("(^|[;,] )", command, "(, [a-z ]+)* ", usage_default, "($|;)")));
    EXPECT_TRUE(named || (usage_default == base && defaults.find(command) == std::string::npos))
        << defaults;
  }
}

}  // namespace
}  // namespace attnserve::testing
