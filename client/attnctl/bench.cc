// attnctl bench: the same request from --concurrency threads (closed loop; a list sweeps the
// levels) or at --rate requests per second (open loop), --requests times or for --duration;
// throughput, latency percentiles and errors by gRPC code, as a table and in --report-csv and
// --report-json files (bench_report.h).
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/harness/flags.h"
#include "bench/harness/run_record.h"
#include "client/attnctl/bench_load.h"
#include "client/attnctl/bench_report.h"
#include "client/attnctl/bench_soak.h"
#include "client/attnctl/check.h"
#include "client/attnctl/common.h"
#include "client/attnctl/output.h"
#include "client/attnctl/problem.h"
#include "client/attnctl/regions.h"
#include "core/util/json.h"

ABSL_FLAG(std::string, concurrency, "1",
          "threads sending requests, each its next one when the last answered (at most 1024); a "
          "comma-separated list such as 1,2,4,8,16 runs the load at each level in turn");
ABSL_FLAG(std::string, rate, "",
          "open loop instead: requests per second, sent on schedule whether or not earlier ones "
          "answered (latency counts from the scheduled start); a list runs each rate in turn");
ABSL_FLAG(int64_t, max_inflight, 64,
          "with --rate: calls outstanding at most; a request falling due past it is dropped and "
          "counted (at most 1024)");
ABSL_FLAG(int64_t, requests, 100,
          "requests in all, unless --duration is given (per level or rate)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "send for this long instead of a request count (used only when given; per level or "
          "rate)");
ABSL_FLAG(std::string, report_csv, "",
          "also write the report to this CSV file: one row per level or rate, with device, date, "
          "commit and command");
ABSL_FLAG(std::string, report_json, "",
          "also write the report to this JSON file: the run record and one object per level or "
          "rate (bench/plot_results.py draws it)");

ABSL_DECLARE_FLAG(bool, soak);  // bench_soak_main.cc

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// Throughput and latency summary of a run.
struct Summary {
  int64_t ok = 0;
  double rps = 0;
  double tokens_per_s = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
};

Summary Summarize(const BenchStats& stats, const Problem& problem) {
  Summary s;
  s.ok = static_cast<int64_t>(stats.latencies.size());
  s.rps = stats.elapsed > 0 ? s.ok / stats.elapsed : 0;
  s.tokens_per_s = s.rps * static_cast<double>(problem.q.dim(0) * problem.q.dim(1));
  for (double l : stats.latencies) s.mean += l;
  if (s.ok > 0) {
    s.mean /= s.ok;
    s.min = stats.latencies.front();
    s.max = stats.latencies.back();
  }
  return s;
}

void PrintJson(const Problem& problem, const Load& load, const BenchStats& stats,
               const std::optional<CheckOutcome>& outcome) {
  const Summary s = Summarize(stats, problem);
  const std::vector<double>& l = stats.latencies;
  Json errors = Json::Object();
  for (const auto& [code, count] : stats.errors) errors.Set(code, count);
  Json latency = Json::Object();
  latency.Set("p50", Percentile(l, 0.5))
      .Set("p90", Percentile(l, 0.9))
      .Set("p99", Percentile(l, 0.99))
      .Set("mean", s.mean)
      .Set("min", s.min)
      .Set("max", s.max);
  Json report = Json::Object();
  report.Set("server", absl::GetFlag(FLAGS_server))
      .Set("backend", stats.backend)
      .Set("placement", stats.ran_on)
      .Set("shape", Json::ArrayOf(problem.q.dims()))
      .Set("kv_heads", problem.k.dim(2))
      .Set("dtype", DTypeName(problem.q.dtype()))
      .Set("spec", Json::Raw(SpecJson(problem.spec)))
      .Set("seed", problem.seed)
      .Set("concurrency", load.concurrency)
      .Set("requests", s.ok + stats.failed)
      .Set("ok", s.ok)
      .Set("failed", stats.failed)
      .Set("errors", std::move(errors))
      .Set("elapsed_s", stats.elapsed)
      .Set("requests_per_s", s.rps)
      .Set("tokens_per_s", s.tokens_per_s)
      .Set("latency_s", std::move(latency));
  const double n = s.ok > 0 ? static_cast<double>(s.ok) : 1.0;
  Json stages = Json::Object();
  stages.Set("receive", stats.receive / n)
      .Set("queue", stats.queue / n)
      .Set("compute", stats.compute / n)
      .Set("copy", stats.copy / n)
      .Set("kernel", stats.kernel / n)
      .Set("kernel_share_of_latency", s.mean > 0 ? stats.kernel / n / s.mean : 0.0);
  report.Set("server_stages_mean_s", std::move(stages));
  if (outcome) {
    Json check = Json::Object();
    check.Set("o_rel", outcome->o_rel)
        .Set("lse_max_abs", outcome->lse_max_abs)
        .Set("nonfinite", outcome->nonfinite)
        .Set("tolerance", outcome->tolerance)
        .Set("pass", outcome->pass);
    report.Set("check", std::move(check));
  }
  std::printf("%s\n", report.Dump().c_str());
}

void PrintText(const Problem& problem, const Load& load, const BenchStats& stats,
               const std::optional<CheckOutcome>& outcome) {
  const Summary s = Summarize(stats, problem);
  const std::vector<double>& l = stats.latencies;
  std::printf("bench      %s, spec %s, concurrency %" PRId64 ", %s\n", problem.description.c_str(),
              SpecJson(problem.spec).c_str(), load.concurrency,
              stats.backend.empty()
                  ? "backend ?"
                  : absl::StrCat("backend ", stats.backend, ", placement ", stats.ran_on).c_str());
  std::printf("requests   %" PRId64 " ok, %" PRId64 " failed in %.3f s\n", s.ok, stats.failed,
              stats.elapsed);
  std::printf("throughput %.2f requests/s, %.1f tokens/s\n", s.rps, s.tokens_per_s);
  std::printf("latency    p50 %.4f s, p90 %.4f s, p99 %.4f s (min %.4f, mean %.4f, max %.4f)\n",
              Percentile(l, 0.5), Percentile(l, 0.9), Percentile(l, 0.99), s.min, s.mean, s.max);
  if (s.ok > 0) {
    const double n = static_cast<double>(s.ok);
    std::printf(
        "server     mean receive %.4f s, queue %.4f s, compute %.4f s (copies %.4f s, kernel "
        "%.4f s); kernel is %.1f%% of the mean latency\n",
        stats.receive / n, stats.queue / n, stats.compute / n, stats.copy / n, stats.kernel / n,
        s.mean > 0 ? 100.0 * stats.kernel / n / s.mean : 0.0);
  }
  for (const auto& [code, count] : stats.errors) {
    std::printf("errors     %s: %" PRId64 "\n", code.c_str(), count);
  }
  if (!stats.first_error.empty()) std::printf("first error %s\n", stats.first_error.c_str());
  if (outcome) {
    std::printf("check      O max rel err %.3e, LSE max abs err %.3e, tolerance %.1e: %s\n",
                outcome->o_rel, outcome->lse_max_abs, outcome->tolerance,
                outcome->pass ? "PASS" : "FAIL");
  }
}

// kExitRpcBase + the code of the most frequent error (ties: the first code by name).
int MostFrequentErrorExit(const std::map<std::string, int64_t>& errors) {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  int64_t most = 0;
  for (const auto& [name, count] : errors) {
    if (count <= most) continue;
    most = count;
    for (int c = 1; c <= 16; ++c) {
      if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == name) {
        code = static_cast<absl::StatusCode>(c);
      }
    }
  }
  return kExitRpcBase + static_cast<int>(code);
}

// The loads to run, one per concurrency level or rate, and the report files.
struct Plan {
  std::vector<Load> loads;
  bool open_loop = false;
  std::string report_csv, report_json;
  // A table (and the report document for --json) instead of the single run's summary.
  bool table() const { return open_loop || loads.size() > 1; }
};

// A report file can be written: checked before the run, so that a long sweep does not end in a
// file error.
absl::Status CheckWritable(absl::string_view flag, const std::string& path) {
  const bool existed = access(path.c_str(), F_OK) == 0;
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot write '", path, "'"));
  out.close();
  if (!existed) std::remove(path.c_str());  // written after the run
  return absl::OkStatus();
}

// The load flags, checked.
absl::StatusOr<Plan> PlanFromFlags(const FlagSet& flags) {
  Load base;
  if (flags.Has("requests") && flags.Has("duration")) {
    return absl::InvalidArgumentError("--requests and --duration are exclusive");
  }
  absl::StatusOr<int64_t> requests = IntAtLeast(FLAGS_requests, 1);
  if (!requests.ok()) return requests.status();
  base.requests = *requests;
  if (flags.Has("duration")) {
    absl::StatusOr<absl::Duration> d = PositiveDuration(FLAGS_duration);
    if (!d.ok()) return d.status();
    if (*d == absl::InfiniteDuration())
      return absl::InvalidArgumentError("--duration: expected a finite duration");
    base.duration = *d;
  }
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags, absl::Minutes(5));
  if (!timeout.ok()) return timeout.status();
  base.timeout = *timeout;
  base.keep_first_result = CheckRequested();
  base.live = isatty(STDERR_FILENO) && !absl::GetFlag(FLAGS_json);

  Plan plan;
  plan.open_loop = flags.Has("rate");
  if (plan.open_loop) {
    if (flags.Has("concurrency")) {
      return absl::InvalidArgumentError(
          "--rate (open loop) and --concurrency (closed loop) are exclusive; --max-inflight "
          "bounds the calls outstanding at a rate");
    }
    absl::StatusOr<int64_t> inflight = IntAtLeast(FLAGS_max_inflight, 1);
    if (!inflight.ok()) return inflight.status();
    if (*inflight > 1024) return absl::InvalidArgumentError("--max-inflight: at most 1024");
    absl::StatusOr<std::vector<double>> rates =
        PositiveList("rate", absl::GetFlag(FLAGS_rate), 1e6);
    if (!rates.ok()) return rates.status();
    for (double rate : *rates) {
      Load load = base;
      load.rate = rate;
      load.max_inflight = *inflight;
      if (load.duration && absl::ToDoubleSeconds(*load.duration) * rate < 1) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--rate %g for --duration %s sends no request; give a longer duration",
                            rate, absl::FormatDuration(*load.duration)));
      }
      plan.loads.push_back(load);
    }
  } else {
    if (flags.Has("max_inflight")) {
      return absl::InvalidArgumentError(
          "--max-inflight bounds the open loop of --rate; the closed loop has --concurrency "
          "calls outstanding");
    }
    absl::StatusOr<std::vector<int64_t>> levels =
        IntList("concurrency", absl::GetFlag(FLAGS_concurrency), 1, 1024);
    if (!levels.ok()) return levels.status();
    for (int64_t level : *levels) {
      Load load = base;
      load.concurrency = level;
      plan.loads.push_back(load);
    }
  }
  // Only the first run keeps a result to check.
  for (size_t i = 1; i < plan.loads.size(); ++i) plan.loads[i].keep_first_result = false;
  plan.report_csv = absl::GetFlag(FLAGS_report_csv);
  plan.report_json = absl::GetFlag(FLAGS_report_json);
  if (flags.Has("report_csv") && plan.report_csv.empty()) {
    return absl::InvalidArgumentError("--report-csv: expected a file name");
  }
  if (flags.Has("report_json") && plan.report_json.empty()) {
    return absl::InvalidArgumentError("--report-json: expected a file name");
  }
  if (!plan.report_csv.empty() && plan.report_csv == plan.report_json) {
    return absl::InvalidArgumentError("--report-csv and --report-json name the same file");
  }
  if (!plan.report_csv.empty()) {
    if (absl::Status s = CheckWritable("--report-csv", plan.report_csv); !s.ok()) return s;
  }
  if (!plan.report_json.empty()) {
    if (absl::Status s = CheckWritable("--report-json", plan.report_json); !s.ok()) return s;
  }
  return plan;
}

// "cpu: <model>" or "NVIDIA H200" ("2 x NVIDIA H200"), from Describe; "unknown" without it.
std::string DeviceText(const absl::StatusOr<v1::DescribeResponse>& d) {
  if (!d.ok() || d->devices().empty()) return "unknown";
  std::set<std::string> models;
  for (const v1::DeviceInfo& dev : d->devices()) models.insert(dev.model());
  std::string text = absl::StrJoin(models, ", ");
  if (d->backend() == "cpu") return absl::StrCat("cpu: ", text);
  if (d->devices_size() > 1) return absl::StrCat(d->devices_size(), " x ", text);
  return text;
}

// This process's command line, as the run record writes one.
std::string OwnCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args = absl::StrSplit(raw, '\0', absl::SkipEmpty());
  if (args.empty()) return "attnctl bench";
  return bench::ShellCommandLine(args);
}

BenchReportHeader MakeHeader(client::AttnClient& client, const Problem& problem, const Plan& plan,
                             RegionMode regions, const BenchStats& first) {
  client::CallOptions call;
  call.timeout = absl::Seconds(10);
  absl::StatusOr<v1::DescribeResponse> described = client.Describe(call);
  BenchReportHeader h;
  h.record = bench::MakeRunRecord(DeviceText(described));
  h.record.command = OwnCommandLine();
  h.server = absl::GetFlag(FLAGS_server);
  if (described.ok()) h.server_version = described->version();
  h.backend = first.backend.empty() && described.ok() ? described->backend() : first.backend;
  h.placement = first.ran_on;
  h.shape = problem.q.dims();
  h.kv_heads = problem.k.dim(2);
  h.kv_tokens = problem.k.dim(1);
  h.dtype = DTypeName(problem.q.dtype());
  h.spec_json = SpecJson(problem.spec);
  h.seed = problem.seed;
  h.request_bytes =
      static_cast<int64_t>(problem.q.nbytes() + problem.k.nbytes() + problem.v.nbytes());
  h.response_bytes = problem.q.numel() / problem.q.dim(3) * problem.v.dim(3) *
                     static_cast<int64_t>(DTypeSize(problem.q.dtype()));
  h.open_loop = plan.open_loop;
  h.transport = regions == RegionMode::kShm       ? "shm"
                : regions == RegionMode::kCudaIpc ? "cuda_ipc"
                                                  : "grpc";
  return h;
}

// Writes `text` to `path`; says so on stderr (stdout may hold --json).
absl::Status WriteReport(absl::string_view flag, const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(flag, ": cannot write '", path, "'"));
  std::fprintf(stderr, "attnctl: bench: wrote %s\n", path.c_str());
  return absl::OkStatus();
}

int BenchMain(const FlagSet& flags) {
  int load_exit = kExitUsage;
  absl::StatusOr<Problem> problem = LoadProblem(flags, /*files=*/nullptr, &load_exit);
  if (!problem.ok()) return UsageError("bench", problem.status());
  if (absl::GetFlag(FLAGS_soak)) {
    if (absl::Status s = ValidateCheckFlags(problem->q, problem->k.dim(1)); !s.ok()) {
      return UsageError("bench", s);
    }
    return SoakMain(flags, *problem);
  }
  absl::StatusOr<v1::Placement> placement = PlacementFromFlags();
  if (!placement.ok()) return UsageError("bench", placement.status());
  absl::StatusOr<Plan> plan = PlanFromFlags(flags);
  if (!plan.ok()) return UsageError("bench", plan.status());
  if (absl::Status s = ValidateCheckFlags(problem->q, problem->k.dim(1)); !s.ok()) {
    return UsageError("bench", s);
  }
  absl::StatusOr<std::unique_ptr<client::AttnClient>> client = ClientFromFlags();
  if (!client.ok()) return UsageError("bench", client.status());
  absl::StatusOr<RegionMode> region_mode = RegionModeFromFlags();
  if (!region_mode.ok()) return UsageError("bench", region_mode.status());

  client::AttendInput input;
  input.q = &problem->q;
  input.k = &problem->k;
  input.v = &problem->v;
  input.spec = problem->spec;
  input.return_lse = plan->loads.front().keep_first_result;
  input.placement = *placement;
  input.q_offset = problem->q_offset;
  // --shm / --cuda-ipc: every request reads the one region (and writes the same O into it).
  std::unique_ptr<RegionSession> regions;
  if (*region_mode != RegionMode::kNone) {
    absl::StatusOr<std::unique_ptr<RegionSession>> session = RegionSession::Start(
        **client, *problem, *region_mode, static_cast<int>(absl::GetFlag(FLAGS_cuda_device)));
    if (!session.ok()) return Report("region set-up", session.status(), kExitLocal);
    regions = *std::move(session);
    regions->Apply(&input);
  }
  const int64_t tokens = problem->q.dim(0) * problem->q.dim(1);
  std::vector<BenchStats> runs;
  std::vector<BenchRow> rows;
  std::map<std::string, int64_t> errors;
  for (const Load& load : plan->loads) {
    if (load.live && plan->table()) {
      std::fprintf(stderr, "[bench] %s\n",
                   load.rate > 0 ? absl::StrFormat("rate %g/s", load.rate).c_str()
                                 : absl::StrCat("concurrency ", load.concurrency).c_str());
    }
    runs.push_back(load.rate > 0 ? RunOpenLoop(**client, input, load)
                                 : RunClosedLoop(**client, input, load));
    for (const auto& [code, count] : runs.back().errors) errors[code] += count;
  }
  BenchStats& first = runs.front();
  if (regions && first.first_result) {
    if (absl::Status s = regions->ReadOutputs(&*first.first_result); !s.ok()) {
      return Report("reading the outputs back", s, kExitLocal);
    }
  }
  std::optional<CheckOutcome> outcome;
  if (first.first_result) {
    absl::StatusOr<CheckOutcome> o = CheckAgainstReference(*problem, *first.first_result);
    if (!o.ok()) return Report("--check", o.status(), kExitLocal);
    outcome = *o;
  }

  const bool json = absl::GetFlag(FLAGS_json);
  if (!plan->table()) {
    if (json) {
      PrintJson(*problem, plan->loads.front(), first, outcome);
    } else {
      PrintText(*problem, plan->loads.front(), first, outcome);
    }
  }
  if (plan->table() || !plan->report_csv.empty() || !plan->report_json.empty()) {
    BenchReportHeader header = MakeHeader(**client, *problem, *plan, *region_mode, first);
    for (size_t i = 0; i < runs.size(); ++i) {
      rows.push_back(
          MakeRow(runs[i], plan->loads[i], header.request_bytes + header.response_bytes, tokens));
    }
    Json document = ReportJson(header, rows);
    if (outcome) {
      Json check = Json::Object();
      check.Set("o_rel", outcome->o_rel)
          .Set("lse_max_abs", outcome->lse_max_abs)
          .Set("pass", outcome->pass);
      document.Set("check", std::move(check));
    }
    if (plan->table() && json) std::printf("%s\n", document.Dump(1).c_str());
    if (plan->table() && !json) {
      std::fputs(ReportTable(header, rows).c_str(), stdout);
      for (const BenchStats& run : runs) {
        if (!run.first_error.empty()) {
          std::printf("first error %s\n", run.first_error.c_str());
          break;
        }
      }
      if (outcome) {
        std::printf("check      O max rel err %.3e, LSE max abs err %.3e, tolerance %.1e: %s\n",
                    outcome->o_rel, outcome->lse_max_abs, outcome->tolerance,
                    outcome->pass ? "PASS" : "FAIL");
      }
    }
    if (!plan->report_csv.empty()) {
      absl::Status s = WriteReport("--report-csv", plan->report_csv, ReportCsv(header, rows));
      if (!s.ok()) return Report("bench", s, kExitLocal);
    }
    if (!plan->report_json.empty()) {
      absl::Status s = WriteReport("--report-json", plan->report_json, document.Dump(2) + "\n");
      if (!s.ok()) return Report("bench", s, kExitLocal);
    }
  }
  if (outcome && !outcome->pass) return kExitCheck;
  if (!errors.empty()) return MostFrequentErrorExit(errors);
  return kExitOk;
}

}  // namespace

Command BenchCommand() {
  std::vector<FlagUse> flags = ConnectionFlags();
  for (const FlagUse& use : ProblemFlags()) flags.push_back(use);
  for (const FlagUse& use : ShapeFlags()) flags.push_back(use);
  flags.insert(flags.end(), {{"concurrency", "C[,C...]"},
                             {"rate", "R[,R...]", "-"},
                             {"max_inflight", "N"},
                             {"requests", "R"},
                             {"duration", "DURATION"}});
  for (const FlagUse& use : CheckFlags()) flags.push_back(use);
  flags.insert(flags.end(), {PlacementFlag(),
                             {"chunk_bytes", "N"},
                             {"connections", "N"},
                             {"json", ""},
                             {"report_csv", "FILE", "-"},
                             {"report_json", "FILE", "-"}});
  for (const FlagUse& use : RegionFlags()) flags.push_back(use);
  flags.insert(flags.end(), {{"soak", ""},
                             {"silent_streams", "N"},
                             {"slow_streams", "N"},
                             {"slow_rate", "BYTES_PER_S"},
                             {"oversized_streams", "N"},
                             {"oversized_bytes", "N"},
                             {"cancelling_streams", "N"},
                             {"hostile_channels", "N"},
                             {"soak_specs", "JSON;JSON", "-"},
                             {"server_pid", "PID", "-"},
                             {"soak_grace", "DURATION"}});
  return Command{
      "bench",
      "bench --server HOST:PORT --random B,N,Hq,Hkv,D [--q-len NQ] [--kv-len NKV]\n"
      "      [--q-offset P] (--requests R | --duration 10s)\n"
      "      [--concurrency C[,C...] | --rate R[,R...] [--max-inflight N]]\n"
      "      [--report-csv FILE] [--report-json FILE]\n"
      "      [--spec JSON] [--causal] [--dtype bf16] [--seed S] [--check]\n"
      "      [--tolerance T] [--json] [--timeout 5m] [--chunk-bytes N] [--connections N]\n"
      "      [--max-attempts N]\n"
      "      [--placement auto|single|data|ring] [--shm | --cuda-ipc [--cuda-device N]]",
      "Sends --requests requests (or as many as fit in --duration) from --concurrency threads\n"
      "and prints requests/s, tokens/s (B * N per request), p50/p90/p99 latency and errors by\n"
      "gRPC code; --json prints one JSON object instead. On a terminal a live progress line\n"
      "goes to stderr. --check verifies the first response against the reference.\n"
      "A list of levels (--concurrency 1,2,4,8,16) runs the same load at each in turn and\n"
      "prints one table row per level: requests/s, payload MiB/s, p50/p90/p99/max latency and\n"
      "errors by code. --rate R sends R requests per second on a fixed schedule (open loop,\n"
      "at most --max-inflight outstanding; one falling due past that is dropped and counted),\n"
      "measures latency from each request's scheduled start, so that queueing shows, and\n"
      "reports the achieved rate. --report-csv and --report-json also write the rows to files\n"
      "with the device, date, commit and command (--json prints that document for a sweep).\n"
      "--shm / --cuda-ipc: inputs and outputs through one shared region (see run --help).\n"
      "--soak: normal requests (--concurrency threads, cycling through --soak-specs, every\n"
      "answer compared with its spec's first, which --check compares with the reference) for\n"
      "--duration alongside hostile streams kept open at once: --silent-streams (a header, then\n"
      "nothing), --slow-streams (a header, then --slow-rate bytes/s), --oversized-streams (one\n"
      "chunk of --oversized-bytes), --cancelling-streams (part of Q, then a cancel). Prints the\n"
      "normal requests' outcome and latency, each class's status codes and how long its streams\n"
      "lived, and (--server-pid) the server's RSS at the start, peak and end (--json: one\n"
      "object). Exit 0 when every normal answer was OK and correct and the server ended every\n"
      "hostile stream within --duration + --soak-grace.\n",
      std::move(flags),
      &BenchMain,
  };
}

}  // namespace attnserve::attnctl
