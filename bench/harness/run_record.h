// What every result file records about its run, gathered in one place: the device, the date, the
// commit and the command line (docs/BENCHMARKS.md: each result says where, when, from which code
// and how it was measured).
#ifndef ATTNSERVE_BENCH_HARNESS_RUN_RECORD_H_
#define ATTNSERVE_BENCH_HARNESS_RUN_RECORD_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "core/util/json.h"

namespace attnserve::bench {

struct RunRecord {
  std::string device;   // e.g. "NVIDIA H200" or "cpu: AMD EPYC 7B13, 2 threads"
  std::string date;     // UTC, ISO 8601 ("2026-11-22T17:05:00Z")
  std::string commit;   // see BenchCommit
  std::string command;  // BenchCommandLine()
};

// The commit the binary was built from: `override` when set (attnbench_ring --commit), else
// $ATTNSERVE_COMMIT (the GPU bundles set it: no git checkout there), else `git rev-parse` in the
// working directory, else the commit at configure time, else "unknown".
std::string BenchCommit(std::string_view override = "");

// The record of a run on `device`, taken now.
RunRecord MakeRunRecord(std::string device, std::string_view commit_override = "");

// Adds "device", "date", "commit" and "command" to the object `json`, in that order.
void AddRunRecord(const RunRecord& record, Json& json);

// Writes a bench's result file (--json-out): INTERNAL "--json-out: ..." when it cannot, else
// prints "  wrote PATH".
absl::Status WriteJsonOut(const std::string& path, const Json& json);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_HARNESS_RUN_RECORD_H_
