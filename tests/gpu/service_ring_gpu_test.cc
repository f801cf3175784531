// The service's GPU ring on 2 GPUs (labels gpu, multigpu; skips below 2 visible GPUs): the real
// attnserve binary on --backend=cuda --devices=0,1 gets two ring requests in a row. Checks:
//   - both match the float64 reference and say placement ring on cuda:0 and cuda:1;
//   - the second ring reuses the NCCL communicators the first one created (one NCCL group made,
//     one communicator per device: attnserve_nccl_groups_created_total and
//     attnserve_nccl_communicators_created_total{device} stay at 1; the log says "new NCCL group"
//     once);
//   - each rank ran on its own device's worker with that device's allocator: the
//     device_memory_peak_bytes of cuda:0 and cuda:1 are both > 0 and within 10% of each other,
//     and both devices' tokens, busy seconds and NCCL bytes moved.
// The server binary: $ATTNSERVE_BINARY when set (a GPU host running a copied bundle), else the
// attnserve of this build.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/attn_client.h"
#include "core/cuda/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve::testing {
namespace {

// The value of the sample `name{labels}` whose label text contains `label` (e.g.
// device="cuda:1"), or of the unlabelled `name`; nullopt when there is none.
std::optional<double> Sample(const std::string& text, const std::string& name,
                             const std::string& label = "") {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#' || !absl::StartsWith(line, name)) continue;
    absl::string_view rest = line.substr(name.size());
    if (!rest.empty() && rest[0] != '{' && rest[0] != ' ') continue;  // a longer name
    if (!label.empty() && !absl::StrContains(rest, label)) continue;
    const size_t space = rest.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double v = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(rest.substr(space + 1)), &v)) return v;
  }
  return std::nullopt;
}

#ifndef ATTNSERVE_BINARY
#error "ATTNSERVE_BINARY must be defined (path of the attnserve binary)"
#endif

std::optional<int> ReadPort(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  if (in >> port && port > 0) return port;
  return std::nullopt;
}

// attnserve on loopback with kernel-chosen ports; ready once both port files exist.
struct Server {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<ChildProcess> process;
  int port = 0;
  int metrics_port = 0;
};

absl::StatusOr<Server> StartServer(const std::vector<std::string>& extra) {
  Server s;
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnserve_gpu_");
  if (!dir.ok()) return dir.status();
  s.dir = *std::move(dir);
  const char* env = std::getenv("ATTNSERVE_BINARY");
  const std::string binary = env != nullptr && env[0] != '\0' ? env : ATTNSERVE_BINARY;
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--port-file=" + s.dir->File("port"),
                                   "--metrics-listen=127.0.0.1:0",
                                   "--metrics-port-file=" + s.dir->File("mport")};
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> process =
      ChildProcess::Spawn(binary, args, s.dir->File("attnserve.log"));
  if (!process.ok()) return process.status();
  s.process = *std::move(process);
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up && s.process->Running()) {
    if (s.port == 0) s.port = ReadPort(s.dir->File("port")).value_or(0);
    if (s.metrics_port == 0) s.metrics_port = ReadPort(s.dir->File("mport")).value_or(0);
    if (s.port != 0 && s.metrics_port != 0) return s;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::string log = s.process->Log();
  s.process->Stop(absl::Seconds(5)).IgnoreError();
  return absl::UnavailableError(absl::StrCat(binary, " did not start (",
                                             s.process->ExitDescription(), "):\n", log));
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

TEST(ServiceRingGpuTest, RanksOnTheirOwnWorkersWithCachedCommunicators) {
  SKIP_WITHOUT_GPUS(2);
  absl::StatusOr<Server> server = StartServer({"--backend=cuda", "--devices=0,1"});
  ASSERT_TRUE(server.ok()) << server.status();
  client::ClientOptions client_options;
  client_options.target = absl::StrCat("127.0.0.1:", server->port);
  client_options.max_attempts = 1;
  absl::StatusOr<std::unique_ptr<client::AttnClient>> attn_or =
      client::AttnClient::Create(client_options);
  ASSERT_TRUE(attn_or.ok()) << attn_or.status();
  client::AttnClient* attn = attn_or->get();

  const DType dtype = DType::kBF16;
  const int64_t batch = 1, tokens = 2048, q_heads = 8, kv_heads = 4, head_dim = 128;
  v1::AttentionSpec spec = SpecFromJson(R"({"dense": {}, "causal": true})");
  for (int i = 0; i < 2; ++i) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat("request ", i, ", seed ", seed));
    absl::StatusOr<Problem> problem =
        MakeProblem(dtype, batch, tokens, q_heads, kv_heads, head_dim, spec, seed);
    ASSERT_TRUE(problem.ok()) << problem.status();
    client::AttendInput input = AttendInputFor(*problem);
    input.return_lse = true;
    input.placement = v1::PLACEMENT_RING;
    input.request_id = absl::StrCat("service-ring-gpu-", i);
    client::CallOptions call;
    call.timeout = absl::Seconds(120);
    absl::StatusOr<client::AttendResult> r = attn->Attend(input, call);
    ASSERT_TRUE(r.ok()) << r.status() << "\n" << server->process->Log();
    EXPECT_EQ(r->header.placement(), v1::PLACEMENT_RING);
    EXPECT_EQ(std::vector<std::string>(r->header.devices().begin(), r->header.devices().end()),
              (std::vector<std::string>{"cuda:0", "cuda:1"}));
    EXPECT_GT(r->header.flops(), 0.0);
    ASSERT_TRUE(r->lse.has_value());
    ErrorStats stats;
    const absl::Status check =
        CheckResult(*problem, *r, OTolerance(dtype), LseTolerance(dtype), &stats);
    EXPECT_TRUE(check.ok()) << check;
    std::printf("ring request %d: O rel err %.3e, LSE abs err %.3e\n", i, stats.o_rel,
                stats.lse_max_abs);
  }

  absl::StatusOr<std::string> metrics = HttpGet(server->metrics_port, "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::printf("%s\n", metrics->c_str());
  // One group for {0, 1}, one communicator per device: the second ring reused them.
  EXPECT_EQ(Sample(*metrics, "attnserve_nccl_groups_created_total"), 1.0);
  std::map<std::string, double> peak;
  for (const std::string device : {"cuda:0", "cuda:1"}) {
    SCOPED_TRACE(device);
    const std::string label = absl::StrCat("device=\"", device, "\"");
    EXPECT_EQ(Sample(*metrics, "attnserve_nccl_communicators_created_total", label), 1.0);
    const std::optional<double> p = Sample(*metrics, "attnserve_device_memory_peak_bytes", label);
    ASSERT_TRUE(p.has_value());
    EXPECT_GT(*p, 0.0);
    peak[device] = *p;
    EXPECT_EQ(Sample(*metrics, "attnserve_device_tokens_total", label),
              static_cast<double>(2 * batch * tokens / 2));
    EXPECT_GT(Sample(*metrics, "attnserve_device_busy_seconds_total", label).value_or(0), 0.0);
    EXPECT_GT(Sample(*metrics, "attnserve_nccl_bytes_total",
                     absl::StrCat(label, ",direction=\"send\""))
                  .value_or(0),
              0.0);
  }
  const double hi = std::max(peak["cuda:0"], peak["cuda:1"]);
  const double lo = std::min(peak["cuda:0"], peak["cuda:1"]);
  EXPECT_LE((hi - lo) / hi, 0.10) << "peak cuda:0 " << peak["cuda:0"] << ", cuda:1 "
                                  << peak["cuda:1"];

  const std::string log = server->process->Log(size_t{1} << 20);
  EXPECT_EQ(Count(log, "new NCCL group"), 1) << log;
  EXPECT_EQ(Count(log, "NCCL communicator rank"), 2) << log;
  EXPECT_TRUE(server->process->Stop().ok()) << server->process->Log();
}

}  // namespace
}  // namespace attnserve::testing
