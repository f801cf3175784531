// attnbench_ring: ring attention over GPUs against one GPU (the scaling bench), or the longest
// dense causal sequence under a per-GPU memory budget (--longest-causal). See ring_bench.h for
// what each measures and how.
//
//   attnbench_ring [--json=PATH] [--ns=262144,524288] [--reps=5] [--warmup=1] [--heads=8]
//                  [--dim=128] [--devices=2] [--longest=1048576,2097152,4194304]
//                  [--max_run_s=60] [--budget_s=220] [--commit=SHA] [--engine=own|cudnn|both]
//                  [--kernel=auto|sm80|sm90] [--sm90-schedule=...]
//   attnbench_ring --longest-causal --memory-budget-gib=4 [--time-cap-s=20] [--json=PATH]
// Flags take --name=value or --name value, with dashes or underscores. --kernel and
// --sm90-schedule pick our flash kernel; the ATTNSERVE_* environment variables override them
// (core/cuda/cuda_options.h), read once at start.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/cuda/plan_launch.h"
#include "bench/harness/flags.h"
#include "bench/ring/ring_bench.h"
#include "core/util/status_macros.h"

ABSL_FLAG(std::string, json, "", "write the results as JSON to this file");
ABSL_FLAG(std::vector<std::string>, ns, std::vector<std::string>({"262144", "524288"}),
          "scaling: sequence lengths");
ABSL_FLAG(std::vector<std::string>, longest,
          std::vector<std::string>({"1048576", "2097152", "4194304"}),
          "scaling: the longest-N sweep's lengths (empty: no sweep)");
ABSL_FLAG(int, reps, 5, "scaling: timed runs per case (median)");
ABSL_FLAG(int, warmup, 1, "scaling: untimed runs per case");
ABSL_FLAG(int64_t, heads, 8, "Hq = Hkv");
ABSL_FLAG(int64_t, dim, 128, "head dim");
ABSL_FLAG(int, devices, 2, "ring ranks (GPUs 0 .. devices-1)");
ABSL_FLAG(double, max_run_s, 60, "scaling: stop a longest-N mode when a run would take longer");
ABSL_FLAG(double, budget_s, 220, "skip stages that would start after this many seconds");
ABSL_FLAG(std::string, commit, "", "commit recorded in the JSON (default: $ATTNSERVE_COMMIT, git)");
ABSL_FLAG(std::string, engine, "both", "scaling: own|cudnn|both");
ABSL_FLAG(std::string, kernel, "auto", "our flash kernel: auto|sm80|sm90");
ABSL_FLAG(std::string, sm90_schedule, "",
          "Hopper kernel schedule: persistent (or v3; the only one); empty: the default");
ABSL_FLAG(bool, longest_causal, false, "run the longest-causal-under-a-memory-budget bench");
ABSL_FLAG(double, memory_budget_gib, 4, "--longest-causal: device memory per GPU, GiB");
ABSL_FLAG(double, time_cap_s, 20, "--longest-causal: an attempt fails when a run takes longer");

namespace attnserve::bench {
namespace {

absl::StatusOr<std::vector<int64_t>> PositiveInts(const char* flag,
                                                  const std::vector<std::string>& values) {
  std::vector<int64_t> out;
  for (const std::string& v : values) {
    int64_t x = 0;
    if (!absl::SimpleAtoi(v, &x) || x <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", v, "' is not a count > 0"));
    }
    out.push_back(x);
  }
  return out;
}

absl::Status Positive(const char* flag, double value, double min = 0, bool inclusive = false) {
  if (inclusive ? value >= min : value > min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", value, " is out of range"));
}

absl::StatusOr<RingBenchOptions> ReadOptions() {
  RingBenchOptions o;
  o.json = absl::GetFlag(FLAGS_json);
  ATTN_ASSIGN_OR_RETURN(o.ns, PositiveInts("ns", absl::GetFlag(FLAGS_ns)));
  ATTN_ASSIGN_OR_RETURN(o.longest, PositiveInts("longest", absl::GetFlag(FLAGS_longest)));
  o.reps = absl::GetFlag(FLAGS_reps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.dim = absl::GetFlag(FLAGS_dim);
  o.devices = absl::GetFlag(FLAGS_devices);
  o.max_run_s = absl::GetFlag(FLAGS_max_run_s);
  o.budget_s = absl::GetFlag(FLAGS_budget_s);
  o.commit = absl::GetFlag(FLAGS_commit);
  o.engine = absl::GetFlag(FLAGS_engine);
  o.memory_budget_gib = absl::GetFlag(FLAGS_memory_budget_gib);
  o.time_cap_s = absl::GetFlag(FLAGS_time_cap_s);
  ATTN_RETURN_IF_ERROR(Positive("reps", o.reps, 1, /*inclusive=*/true));
  ATTN_RETURN_IF_ERROR(Positive("warmup", o.warmup, 0, /*inclusive=*/true));
  ATTN_RETURN_IF_ERROR(Positive("heads", static_cast<double>(o.heads), 1, /*inclusive=*/true));
  ATTN_RETURN_IF_ERROR(Positive("devices", o.devices, 1, /*inclusive=*/true));
  ATTN_RETURN_IF_ERROR(Positive("memory_budget_gib", o.memory_budget_gib));
  ATTN_RETURN_IF_ERROR(Positive("time_cap_s", o.time_cap_s));
  if (o.engine != "own" && o.engine != "cudnn" && o.engine != "both") {
    return absl::InvalidArgumentError(
        absl::StrCat("--engine: expected own, cudnn or both, got '", o.engine, "'"));
  }
  ATTN_ASSIGN_OR_RETURN(o.cuda, BenchCudaOptions(absl::GetFlag(FLAGS_kernel),
                                                 absl::GetFlag(FLAGS_sm90_schedule)));
  return o;
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  absl::Status parsed = attnserve::bench::ParseBenchFlags(
      argc, argv,
      "attnbench_ring [--ns=262144,524288] [--devices=2] [--engine=own|cudnn|both] [--json=PATH]\n"
      "attnbench_ring --longest-causal --memory-budget-gib=4 [--time-cap-s=20] [--json=PATH]\n"
      "Ring attention over GPUs vs one GPU; see bench/ring/ring_bench.h.");
  absl::StatusOr<attnserve::bench::RingBenchOptions> opt =
      parsed.ok() ? attnserve::bench::ReadOptions()
                  : absl::StatusOr<attnserve::bench::RingBenchOptions>(parsed);
  if (!opt.ok()) {
    std::fprintf(stderr, "attnbench_ring: %s\n", opt.status().ToString().c_str());
    return 2;
  }
  return absl::GetFlag(FLAGS_longest_causal) ? attnserve::bench::RunLongestCausalBench(*opt)
                                             : attnserve::bench::RunScalingBench(*opt);
}
