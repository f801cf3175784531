// attnctl bench's sweep report: one row per concurrency level (closed loop) or per request rate
// (open loop), written as a table for a terminal, as CSV (--report-csv) and as JSON (--report-json,
// or --json on stdout). Both files carry the run record the other benches write (device, date,
// commit, command: bench/harness/run_record.h); bench/plot_results.py draws the JSON.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_BENCH_REPORT_H_
#define ATTNSERVE_CLIENT_ATTNCTL_BENCH_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/harness/run_record.h"
#include "core/util/json.h"

namespace attnserve::attnctl {

// What one level or rate measured. Latencies are in seconds: of each call (closed loop) or from
// each request's scheduled start to its answer (open loop, so that queueing shows).
struct BenchRow {
  int64_t concurrency = 0;   // closed loop: threads sending; open loop: 0
  double target_rate = 0;    // open loop: requests/s asked for; closed loop: 0
  int64_t max_inflight = 0;  // open loop: the bound on calls outstanding
  int64_t requests = 0;      // sent
  int64_t ok = 0;
  int64_t failed = 0;
  int64_t dropped = 0;  // open loop: not sent, --max-inflight calls were outstanding
  std::map<std::string, int64_t> errors;  // gRPC code name -> count
  double elapsed_s = 0;
  double requests_per_s = 0;  // successful requests over elapsed_s (the achieved rate)
  double bytes_per_s = 0;     // request + response payload bytes of those
  double tokens_per_s = 0;    // B * Nq of those
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0, min = 0;
  double max_send_lag_s = 0;  // open loop: the latest a request was sent after its schedule
  // Means over the successful calls of the server's stage figures (response header).
  double receive = 0, queue = 0, compute = 0, copy = 0, kernel = 0;
};

// What the rows share: where, when and what was measured.
struct BenchReportHeader {
  bench::RunRecord record;
  std::string server;          // --server
  std::string server_version;  // Describe
  std::string backend;         // "cpu", "cuda"
  std::string placement;       // "single on cpu:0"
  std::vector<int64_t> shape;  // Q's [B, Nq, Hq, D]
  int64_t kv_heads = 0;
  int64_t kv_tokens = 0;
  std::string dtype;
  std::string spec_json;  // the spec, JSON text
  uint64_t seed = 0;
  int64_t request_bytes = 0;   // Q + K + V payload of one request
  int64_t response_bytes = 0;  // O payload of one answer
  bool open_loop = false;      // rows are rates (--rate) instead of concurrency levels
  std::string transport;       // "grpc", "shm", "cuda_ipc"
};

// "INVALID_ARGUMENT=2;UNAVAILABLE=1" ("" when none).
std::string ErrorsText(const std::map<std::string, int64_t>& errors);

// The human table: a header line, one line per row (latencies in ms).
std::string ReportTable(const BenchReportHeader& header, const std::vector<BenchRow>& rows);

// {device, date, commit, command, bench, server, ..., rows: [...]}.
Json ReportJson(const BenchReportHeader& header, const std::vector<BenchRow>& rows);

// A header line and one line per row; every line carries the run record and the problem.
std::string ReportCsv(const BenchReportHeader& header, const std::vector<BenchRow>& rows);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_BENCH_REPORT_H_
