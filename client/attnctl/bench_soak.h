// attnctl bench soak mode: normal requests (mixed specs, every answer checked) alongside hostile
// streams -- silent (a header, then nothing), slow (a header, then bytes below a rate), oversized
// (a chunk above the server's limits) and cancelling (a header and part of the data, then a
// cancel) -- for a duration, optionally sampling the server's resident memory. Each hostile class
// keeps its count of streams open: one that ends is replaced by a new one until the duration is
// over. The hostile streams are gRPC callback reactors multiplexed over a few channels and driven
// by one thread, so hundreds of them cost no thread each.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_BENCH_SOAK_H_
#define ATTNSERVE_CLIENT_ATTNCTL_BENCH_SOAK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "attnserve/v1/attnserve.pb.h"
#include "client/attn_client.h"
#include "client/attnctl/flag_parser.h"
#include "client/attnctl/problem.h"
#include "core/util/json.h"

namespace attnserve::attnctl {

struct SoakOptions {
  std::string target;  // host:port
  absl::Duration duration = absl::Seconds(60);
  int64_t concurrency = 1;                   // threads of normal requests
  std::vector<v1::AttentionSpec> specs;      // normal requests cycle through these (>= 1)
  absl::Duration timeout = absl::Minutes(1);  // of a normal request
  bool check = false;  // check each spec's first answer against the reference (the others
                       // against that first answer)
  double tolerance = 0;  // for the comparison with the first answer (0: check's default)
  // Hostile streams kept open at once, per class.
  int64_t silent = 0;
  int64_t slow = 0;
  int64_t oversized = 0;
  int64_t cancelling = 0;
  int64_t slow_rate = 64;                     // bytes per second of each slow stream
  int64_t oversized_bytes = int64_t{80} << 20;  // payload of the oversized chunk
  int64_t hostile_channels = 4;
  // How long after the duration hostile streams may take to be ended by the server before the
  // tool cancels them (counted as "open_at_end").
  absl::Duration grace = absl::Seconds(15);
  int64_t server_pid = 0;  // > 0: sample /proc/<pid>/status VmRSS every 100 ms
  absl::Duration settle = absl::Seconds(3);  // after everything ended, before the last sample
};

struct SoakClass {
  int64_t started = 0;
  std::map<std::string, int64_t> codes;  // client-side status code -> count
  int64_t open_at_end = 0;               // still open after duration + grace (then cancelled)
  double min_seconds = 0, max_seconds = 0;  // call start to status
};

struct SoakReport {
  int64_t normal_ok = 0;
  int64_t normal_failed = 0;
  int64_t normal_mismatched = 0;  // answers that differ from their spec's first (or the reference)
  std::map<std::string, int64_t> normal_codes;
  std::string first_error;
  double p50 = 0, p99 = 0, max_latency = 0;
  std::vector<double> reference_rel;  // per spec: the first answer against the reference (check)
  std::map<std::string, SoakClass> classes;  // "silent", "slow", "oversized", "cancelling"
  // Server RSS in bytes (server_pid > 0): before, peak during, and after everything ended.
  int64_t rss_start = 0, rss_peak = 0, rss_end = 0;
  double elapsed = 0;
};

// Runs the soak; bounded by duration + max(timeout, grace) + settle.
SoakReport RunSoak(client::AttnClient& client, const Problem& problem, const SoakOptions& options);

Json SoakReportJson(const SoakReport& report);
// attnctl bench --soak: the soak flags, the run, the report (text or --json), the exit code.
int SoakMain(const FlagSet& flags, const Problem& problem);
std::string SoakReportText(const SoakReport& report);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_BENCH_SOAK_H_
