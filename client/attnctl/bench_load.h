// The load attnctl bench sends: a closed loop (--concurrency threads, each sending its next
// request when the last one answered) or an open loop (--rate requests per second on a fixed
// schedule, whether or not earlier ones answered, at most --max-inflight outstanding).
#ifndef ATTNSERVE_CLIENT_ATTNCTL_BENCH_LOAD_H_
#define ATTNSERVE_CLIENT_ATTNCTL_BENCH_LOAD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/attn_client.h"
#include "client/attnctl/bench_report.h"

namespace attnserve::attnctl {

// How many requests, how they are sent, under which call options.
struct Load {
  int64_t concurrency = 1;    // closed loop: threads
  double rate = 0;            // > 0: open loop at this many requests/s
  int64_t max_inflight = 64;  // open loop: calls outstanding at most
  int64_t requests = 0;       // ignored with a duration
  std::optional<absl::Duration> duration;
  absl::Duration timeout;
  bool keep_first_result = false;  // for --check
  bool live = false;               // draw a progress line on stderr
};

// What a load run saw.
struct BenchStats {
  // Seconds of each successful call, ascending; open loop: from its scheduled start.
  std::vector<double> latencies;
  std::map<std::string, int64_t> errors;  // gRPC code name -> count
  int64_t failed = 0;
  int64_t dropped = 0;      // open loop: not sent (--max-inflight outstanding)
  double max_send_lag = 0;  // open loop: seconds a send was late on its schedule, at most
  double window = 0;        // open loop: the schedule's span, requests / rate
  std::string first_error;
  std::optional<client::AttendResult> first_result;
  std::string backend;
  std::string ran_on;  // placement and devices of the first successful request
  double elapsed = 0;
  // Sums over the successful calls of the server's stage figures (response header).
  double receive = 0, queue = 0, compute = 0, copy = 0, kernel = 0;
};

// --concurrency threads until --requests are sent or --duration is over. Bounded by (count or
// duration) + timeout.
BenchStats RunClosedLoop(client::AttnClient& client, const client::AttendInput& input,
                         const Load& load);

// Requests at start + i / rate for i < requests (--duration: duration * rate of them); one that
// falls due while max_inflight calls are outstanding is dropped. Bounded by the schedule's span
// + timeout.
BenchStats RunOpenLoop(client::AttnClient& client, const client::AttendInput& input,
                       const Load& load);

// The report row of a run. `payload_bytes`: request + response bytes of one call; `tokens`:
// B * Nq. The achieved rate divides the successful calls by the run's time, which in the open loop
// is at least the schedule's span.
BenchRow MakeRow(const BenchStats& stats, const Load& load, int64_t payload_bytes, int64_t tokens);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_BENCH_LOAD_H_
