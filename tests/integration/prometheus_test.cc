// The real Prometheus server (Debian's /usr/bin/prometheus) scrapes attnserve's /metrics endpoint
// and sees the device memory, token and request-duration series after a few requests.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/attn_client.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

#ifndef PROMETHEUS_BINARY
#define PROMETHEUS_BINARY "/usr/bin/prometheus"
#endif

namespace attnserve::testing {
namespace {

// Percent-encodes a PromQL expression for a query string.
std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrCat("%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// Starts Prometheus on a free loopback port, scraping `metrics_port` every second. A port taken
// between PickFreePort and Prometheus binding it makes Prometheus exit: try a few ports.
absl::StatusOr<std::unique_ptr<ChildProcess>> StartPrometheus(const TempDir& dir, int metrics_port,
                                                              int* web_port) {
  const std::string config = dir.File("prometheus.yml");
  {
    std::ofstream out(config);
    out << "global:\n"
        << "  scrape_interval: 1s\n"
        << "  scrape_timeout: 1s\n"
        << "  evaluation_interval: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: attnserve\n"
        << "    scrape_interval: 1s\n"
        << "    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << metrics_port << "']\n";
    if (!out) return absl::InternalError("cannot write " + config);
  }
  absl::Status last = absl::UnknownError("not started");
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    absl::StatusOr<std::unique_ptr<ChildProcess>> prom = ChildProcess::Spawn(
        PROMETHEUS_BINARY,
        {"--config.file=" + config,
         "--storage.tsdb.path=" + dir.File(absl::StrCat("data", attempt)),
         absl::StrCat("--web.listen-address=127.0.0.1:", *port), "--log.level=warn"},
        dir.File(absl::StrCat("prometheus", attempt, ".log")));
    if (!prom.ok()) return prom.status();
    // Ready when /-/ready answers 200; bounded.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up && (*prom)->Running()) {
      if (HttpGet(*port, "/-/ready", absl::Seconds(1)).ok()) {
        *web_port = *port;
        return prom;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    last = absl::UnavailableError(absl::StrCat("prometheus on port ", *port, " not ready (",
                                               (*prom)->ExitDescription(), "):\n", (*prom)->Log()));
    (*prom)->Stop(absl::Seconds(5)).IgnoreError();
  }
  return last;
}

TEST(PrometheusTest, ScrapesAttnserveMetrics) {
  if (access(PROMETHEUS_BINARY, X_OK) != 0) {
    GTEST_SKIP() << PROMETHEUS_BINARY
                 << " is not installed (scripts/bootstrap installs Debian's prometheus package)";
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnserve_prom_");
  ASSERT_TRUE(dir.ok()) << dir.status();
  int web_port = 0;
  absl::StatusOr<std::unique_ptr<ChildProcess>> prom =
      StartPrometheus(**dir, (*server)->metrics_port(), &web_port);
  ASSERT_TRUE(prom.ok()) << prom.status();

  // A few requests so that the counters move.
  std::unique_ptr<client::AttnClient> attn = (*server)->NewClient();
  ASSERT_NE(attn, nullptr);
  const uint64_t seed = FreshSeed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Problem> problem = MakeProblem(
        DType::kBF16, 1, 256, 4, 2, 64, SpecFromJson(R"({"dense": {}, "causal": true})"), seed + i);
    ASSERT_TRUE(problem.ok()) << problem.status();
    client::AttendInput input = AttendInputFor(*problem);
    client::CallOptions call;
    call.timeout = absl::Seconds(30);
    absl::StatusOr<client::AttendResult> result = attn->Attend(input, call);
    ASSERT_TRUE(result.ok()) << result.status();
  }

  // Each query must return at least one sample within the bound (Prometheus scrapes every 1 s).
  const std::vector<std::string> queries = {"attnserve_device_memory_used_bytes",
                                            "attnserve_device_tokens_total > 0",
                                            "attnserve_request_duration_seconds_count > 0"};
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  for (const std::string& query : queries) {
    SCOPED_TRACE(query);
    std::string last;
    bool found = false;
    while (!found && absl::Now() < give_up) {
      absl::StatusOr<std::string> body =
          HttpGet(web_port, "/api/v1/query?query=" + UrlEncode(query), absl::Seconds(2));
      if (body.ok()) {
        last = *body;
        // {"status":"success","data":{"resultType":"vector","result":[{"metric":...}]}}
        std::string compact = absl::StrReplaceAll(*body, {{" ", ""}, {"\n", ""}});
        found = compact.find("\"status\":\"success\"") != std::string::npos &&
                compact.find("\"result\":[{") != std::string::npos;
      } else {
        last = body.status().ToString();
      }
      if (!found) absl::SleepFor(absl::Milliseconds(250));
    }
    EXPECT_TRUE(found) << "no samples within 30 s; last answer: " << last << "\nprometheus log:\n"
                       << (*prom)->Log();
    if (found) std::printf("%s: %s\n", query.c_str(), last.substr(0, 300).c_str());
  }
  EXPECT_TRUE((*prom)->Stop(absl::Seconds(15)).ok()) << (*prom)->Log();
}

}  // namespace
}  // namespace attnserve::testing
