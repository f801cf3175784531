// attnctl bench: the same request from --concurrency threads, --requests times or for
// --duration; throughput, latency percentiles and errors by gRPC code.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/attnctl/check.h"
#include "client/attnctl/common.h"
#include "client/attnctl/output.h"
#include "client/attnctl/problem.h"
#include "client/attnctl/regions.h"
#include "core/util/json.h"

ABSL_FLAG(int64_t, concurrency, 1, "threads sending requests (at most 1024)");
ABSL_FLAG(int64_t, requests, 100, "requests in all, unless --duration is given");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "send for this long instead of a request count (used only when given)");

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// How many requests, from how many threads, under which call options.
struct Load {
  int64_t concurrency = 1;
  int64_t requests = 0;                   // ignored with a duration
  std::optional<absl::Duration> duration;
  absl::Duration timeout;
  bool keep_first_result = false;  // for --check
  bool live = false;               // draw a progress line on stderr
};

// What a load run saw.
struct BenchStats {
  std::vector<double> latencies;  // seconds of each successful call, ascending
  std::map<std::string, int64_t> errors;  // gRPC code name -> count
  int64_t failed = 0;
  std::string first_error;
  std::optional<client::AttendResult> first_result;
  std::string backend;
  std::string ran_on;  // placement and devices of the first successful request
  double elapsed = 0;
  // Sums over the successful calls of the server's stage figures (response header).
  double receive = 0, queue = 0, compute = 0, copy = 0, kernel = 0;
};

BenchStats RunLoad(client::AttnClient& client, const client::AttendInput& input,
                   const Load& load) {
  client::CallOptions call;
  call.timeout = load.timeout;
  // Each thread claims request numbers until the count (or the duration) runs out; every call is
  // bounded by --timeout, so the whole run is bounded by (count or duration) + timeout.
  const int64_t max_requests =
      load.duration ? std::numeric_limits<int64_t>::max() : load.requests;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
  std::mutex mu;
  BenchStats stats;
  const absl::Time start = absl::Now();
  const absl::Time stop_at = load.duration ? start + *load.duration : absl::InfiniteFuture();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < load.concurrency; ++t) {
    threads.emplace_back([&] {
      while (absl::Now() < stop_at && next.fetch_add(1) < max_requests) {
        const absl::Time begin = absl::Now();
        absl::StatusOr<client::AttendResult> r = client.Attend(input, call);
        const double seconds = absl::ToDoubleSeconds(absl::Now() - begin);
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          stats.latencies.push_back(seconds);
          stats.receive += r->header.receive_seconds();
          stats.queue += r->header.queue_seconds();
          stats.compute += r->header.compute_seconds();
          stats.copy += r->header.copy_seconds();
          stats.kernel += r->header.kernel_seconds();
          if (stats.backend.empty()) {
            stats.backend = r->header.backend();
            stats.ran_on =
                absl::StrCat(ShortEnumName(v1::Placement_Name(r->header.placement())), " on ",
                             absl::StrJoin(r->header.devices(), ", "));
          }
          if (load.keep_first_result && !stats.first_result) stats.first_result = *std::move(r);
          completed.fetch_add(1);
        } else {
          ++stats.errors[absl::StatusCodeToString(r.status().code())];
          if (stats.first_error.empty()) stats.first_error = r.status().ToString();
          failed.fetch_add(1);
        }
      }
    });
  }
  // Waits for the workers, drawing the live line every half second on a terminal. Bounded: the
  // workers stop by themselves (see above); this loop ends when they have.
  while (completed.load() + failed.load() < max_requests) {
    if (load.duration && absl::Now() >= stop_at + load.timeout) break;
    absl::SleepFor(absl::Milliseconds(load.live ? 500 : 50));
    if (load.live) {
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
      std::fprintf(stderr, "\r[bench] %" PRId64 " ok, %" PRId64 " failed, %.1f req/s, %.1f s",
                   completed.load(), failed.load(), elapsed > 0 ? completed.load() / elapsed : 0.0,
                   elapsed);
    }
    if (load.duration && absl::Now() >= stop_at) break;
  }
  for (std::thread& t : threads) t.join();
  if (load.live) std::fprintf(stderr, "\n");
  stats.elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  stats.failed = failed.load();
  std::sort(stats.latencies.begin(), stats.latencies.end());
  return stats;
}

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

// The load flags, checked.
absl::StatusOr<Load> LoadFromFlags(const FlagSet& flags) {
  Load load;
  absl::StatusOr<int64_t> concurrency = IntAtLeast(FLAGS_concurrency, 1);
  if (!concurrency.ok()) return concurrency.status();
  if (*concurrency > 1024) return absl::InvalidArgumentError("--concurrency: at most 1024");
  load.concurrency = *concurrency;
  if (flags.Has("requests") && flags.Has("duration")) {
    return absl::InvalidArgumentError("--requests and --duration are exclusive");
  }
  absl::StatusOr<int64_t> requests = IntAtLeast(FLAGS_requests, 1);
  if (!requests.ok()) return requests.status();
  load.requests = *requests;
  if (flags.Has("duration")) {
    absl::StatusOr<absl::Duration> d = PositiveDuration(FLAGS_duration);
    if (!d.ok()) return d.status();
    load.duration = *d;
  }
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags, absl::Minutes(5));
  if (!timeout.ok()) return timeout.status();
  load.timeout = *timeout;
  load.keep_first_result = CheckRequested();
  load.live = isatty(STDERR_FILENO) && !absl::GetFlag(FLAGS_json);
  return load;
}

int BenchMain(const FlagSet& flags) {
  int load_exit = kExitUsage;
  absl::StatusOr<Problem> problem = LoadProblem(flags, /*files=*/nullptr, &load_exit);
  if (!problem.ok()) return UsageError("bench", problem.status());
  absl::StatusOr<v1::Placement> placement = PlacementFromFlags();
  if (!placement.ok()) return UsageError("bench", placement.status());
  absl::StatusOr<Load> load = LoadFromFlags(flags);
  if (!load.ok()) return UsageError("bench", load.status());
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
  input.return_lse = load->keep_first_result;
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
  BenchStats stats = RunLoad(**client, input, *load);
  if (regions && stats.first_result) {
    if (absl::Status s = regions->ReadOutputs(&*stats.first_result); !s.ok()) {
      return Report("reading the outputs back", s, kExitLocal);
    }
  }

  std::optional<CheckOutcome> outcome;
  if (stats.first_result) {
    absl::StatusOr<CheckOutcome> o = CheckAgainstReference(*problem, *stats.first_result);
    if (!o.ok()) return Report("--check", o.status(), kExitLocal);
    outcome = *o;
  }
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(*problem, *load, stats, outcome);
  } else {
    PrintText(*problem, *load, stats, outcome);
  }
  if (outcome && !outcome->pass) return kExitCheck;
  if (stats.failed > 0) return MostFrequentErrorExit(stats.errors);
  return kExitOk;
}

}  // namespace

Command BenchCommand() {
  std::vector<FlagUse> flags = ConnectionFlags();
  for (const FlagUse& use : ProblemFlags()) flags.push_back(use);
  for (const FlagUse& use : ShapeFlags()) flags.push_back(use);
  flags.insert(flags.end(), {{"concurrency", "C"}, {"requests", "R"}, {"duration", "DURATION"}});
  for (const FlagUse& use : CheckFlags()) flags.push_back(use);
  flags.insert(flags.end(),
               {PlacementFlag(), {"chunk_bytes", "N"}, {"connections", "N"}, {"json", ""}});
  for (const FlagUse& use : RegionFlags()) flags.push_back(use);
  return Command{
      "bench",
      "bench --server HOST:PORT --random B,N,Hq,Hkv,D [--q-len NQ] [--kv-len NKV]\n"
      "      [--q-offset P] (--requests R | --duration 10s)\n"
      "      [--concurrency C] [--spec JSON] [--causal] [--dtype bf16] [--seed S] [--check]\n"
      "      [--tolerance T] [--json] [--timeout 5m] [--chunk-bytes N] [--connections N]\n"
      "      [--max-attempts N]\n"
      "      [--placement auto|single|data|ring] [--shm | --cuda-ipc [--cuda-device N]]",
      "Sends --requests requests (or as many as fit in --duration) from --concurrency threads\n"
      "and prints requests/s, tokens/s (B * N per request), p50/p90/p99 latency and errors by\n"
      "gRPC code; --json prints one JSON object instead. On a terminal a live progress line\n"
      "goes to stderr. --check verifies the first response against the reference.\n"
      "--shm / --cuda-ipc: inputs and outputs through one shared region (see run --help).\n",
      std::move(flags),
      &BenchMain,
  };
}

}  // namespace attnserve::attnctl
