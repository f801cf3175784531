// Acceptance test of the limits against hostile clients (server/README.md "Limits and timeouts"):
// `attnctl bench --soak` keeps 500 silent streams and 50 slow uploaders open (plus a few oversized
// and cancelling ones) next to normal traffic for 60 s against the CPU backend with small
// timeouts. Every normal request must be answered correctly, every hostile stream must be ended
// by the server with the documented code, the server's RSS must stay below --max-upload-bytes +
// 256 MiB throughout and come back to within 64 MiB of its start, and the request gauges must
// return to 0.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined (path of the attnctl binary)"
#endif

namespace attnserve::testing {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// --max-upload-bytes. The hostile streams' reservations must fit under it (550 x 256 KiB of Q, K
// and V = 137.5 MiB) for normal requests to get in: the cap bounds memory, the timeouts free it.
constexpr int64_t kUploadCap = 256 * kMiB;

// VmRSS of `pid` in bytes (0 when unreadable).
int64_t Rss(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

bool ParseJsonObject(const std::string& output, google::protobuf::Struct* out) {
  const size_t begin = output.find('{');
  const size_t end = output.rfind('}');
  if (begin == std::string::npos || end == std::string::npos || end < begin) return false;
  return google::protobuf::util::JsonStringToMessage(output.substr(begin, end - begin + 1), out)
      .ok();
}

double Number(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? -1 : it->second.number_value();
}
const google::protobuf::Struct& Object(const google::protobuf::Struct& s, const std::string& key) {
  static const google::protobuf::Struct empty;
  auto it = s.fields().find(key);
  return it == s.fields().end() ? empty : it->second.struct_value();
}

TEST(HostileSoakTest, SilentAndSlowStreamsEndedNormalTrafficServedMemoryBounded) {
  ServerOptions options;
  options.extra_args = {"--stream-idle-timeout=5s", "--min-upload-grace=5s",
                        "--min-upload-rate=4096", absl::StrCat("--max-upload-bytes=", kUploadCap),
                        "--max-chunk-bytes=4194304", "--log-level=error"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const pid_t pid = (*server)->process().pid();
  const int64_t rss_start = Rss(pid);
  ASSERT_GT(rss_start, 0);

  // The test's own RSS samples, every 100 ms while the soak runs (attnctl samples too).
  std::atomic<bool> stop{false};
  std::atomic<int64_t> rss_peak{rss_start};
  std::thread sampler([&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(150);
    while (!stop.load() && absl::Now() < give_up) {
      rss_peak.store(std::max(rss_peak.load(), Rss(pid)));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  CommandResult r = RunLogged(
      "attnctl", ATTNCTL_BINARY,
      {"bench", "--soak", "--server=" + (*server)->target(), "--random", "1,128,4,2,64",
       "--dtype", "f32", "--seed=7", "--check", "--tolerance=1e-4", "--concurrency=2",
       "--duration=60s", "--timeout=30s",
       R"(--soak-specs={"dense": {}};{"window": {"size": 40}, "causal": true};{"blockSparse": {"blockSize": 64, "localWindow": {"width": 1}}})",
       "--silent-streams=500", "--slow-streams=50", "--slow-rate=512", "--oversized-streams=2",
       "--oversized-bytes=8388608", "--cancelling-streams=4", "--hostile-channels=8",
       absl::StrCat("--server-pid=", pid), "--soak-grace=10s", "--json"},
      absl::Seconds(110));
  stop.store(true);
  sampler.join();
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 4000);
  google::protobuf::Struct json;
  ASSERT_TRUE(ParseJsonObject(r.output, &json)) << r.output.substr(0, 4000);

  const google::protobuf::Struct& normal = Object(json, "normal");
  EXPECT_GT(Number(normal, "ok"), 30) << "normal traffic was starved";
  EXPECT_EQ(Number(normal, "failed"), 0);
  EXPECT_EQ(Number(normal, "mismatched"), 0);
  const auto& reference = normal.fields().at("reference_rel").list_value();
  EXPECT_EQ(reference.values_size(), 3) << "each spec's first answer is checked";

  // Each class: every stream it started ended with the one documented code, none left open.
  const google::protobuf::Struct& hostile = Object(json, "hostile");
  struct Expect {
    const char* name;
    const char* code;
    double min_started;
    double max_seconds;  // call start to status, at most
  };
  for (const Expect& e : {Expect{"silent", "DEADLINE_EXCEEDED", 500 * 2, 5 + 2},
                          Expect{"slow", "DEADLINE_EXCEEDED", 50 * 2, 5 + 2},
                          Expect{"oversized", "RESOURCE_EXHAUSTED", 2, 10},
                          Expect{"cancelling", "CANCELLED", 4, 5}}) {
    SCOPED_TRACE(e.name);
    const google::protobuf::Struct& c = Object(hostile, e.name);
    const double started = Number(c, "started");
    EXPECT_GE(started, e.min_started);
    EXPECT_EQ(Number(Object(c, "codes"), e.code), started);
    EXPECT_EQ(Number(c, "open_at_end"), 0);
    EXPECT_LE(Number(c, "max_s"), e.max_seconds);
  }

  // Memory: below the cap + 256 MiB throughout; back near the start once the streams are gone.
  const int64_t bound = kUploadCap + 256 * kMiB;
  EXPECT_LT(rss_peak.load(), bound) << "peak " << rss_peak.load() / kMiB << " MiB";
  EXPECT_LT(Number(Object(json, "server_rss_bytes"), "peak"), bound);
  int64_t rss_end = Rss(pid);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (rss_end > rss_start + 64 * kMiB && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    rss_end = Rss(pid);
  }
  EXPECT_LE(rss_end, rss_start + 64 * kMiB)
      << "start " << rss_start / kMiB << " MiB, end " << rss_end / kMiB << " MiB";
  std::printf("server RSS: start %.1f MiB, peak %.1f MiB, end %.1f MiB\n",
              rss_start / 1048576.0, rss_peak.load() / 1048576.0, rss_end / 1048576.0);

  absl::StatusOr<std::string> metrics = (*server)->ScrapeMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (const char* gauge : {"attnserve_inflight_requests", "attnserve_request_buffer_bytes",
                            "attnserve_queue_length"}) {
    absl::StatusOr<double> v = MetricSum(*metrics, gauge);
    ASSERT_TRUE(v.ok()) << gauge << ": " << v.status();
    EXPECT_EQ(*v, 0) << gauge;
  }
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

}  // namespace
}  // namespace attnserve::testing
