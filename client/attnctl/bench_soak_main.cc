// attnctl bench --soak: the soak flags and SoakMain (the run itself is bench_soak.cc).
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/attnctl/bench_soak.h"
#include "client/attnctl/check.h"
#include "client/attnctl/common.h"
#include "wire/convert.h"

ABSL_DECLARE_FLAG(double, tolerance);  // check.cc
ABSL_DECLARE_FLAG(bool, causal);       // problem.cc
ABSL_DECLARE_FLAG(absl::Duration, duration);    // bench.cc
ABSL_DECLARE_FLAG(std::string, concurrency);    // bench.cc

// Soak mode (bench_soak.h).
ABSL_FLAG(bool, soak, false,
          "soak mode: normal requests for --duration alongside hostile streams (--silent-streams, "
          "--slow-streams, --oversized-streams, --cancelling-streams); per-class outcomes and the "
          "server's RSS (--server-pid)");
ABSL_FLAG(int64_t, silent_streams, 0, "soak: streams that send a header, then nothing");
ABSL_FLAG(int64_t, slow_streams, 0, "soak: streams that send a header, then --slow-rate bytes/s");
ABSL_FLAG(int64_t, slow_rate, 64, "soak: bytes per second of each slow stream");
ABSL_FLAG(int64_t, oversized_streams, 0,
          "soak: streams that send a header, then one chunk of --oversized-bytes");
ABSL_FLAG(int64_t, oversized_bytes, int64_t{80} << 20,
          "soak: payload of the oversized chunk (above the server's --max-chunk-bytes)");
ABSL_FLAG(int64_t, cancelling_streams, 0,
          "soak: streams that send a header and part of Q, then cancel after 0.1-1 s");
ABSL_FLAG(int64_t, hostile_channels, 4, "soak: connections the hostile streams share");
ABSL_FLAG(std::string, soak_specs, "",
          "soak: normal requests cycle through these specs ('JSON;JSON;...'; default: --spec)");
ABSL_FLAG(int64_t, server_pid, 0, "soak: sample this process's VmRSS (the server, same host)");
ABSL_FLAG(absl::Duration, soak_grace, absl::Seconds(15),
          "soak: how long after --duration hostile streams may take to be ended by the server "
          "before they are cancelled and counted open_at_end");

namespace attnserve::attnctl {

// --soak: exit 0 when every normal request was answered OK and correctly and no hostile stream
// was left open; kExitCheck for a wrong answer; else the most frequent normal error.
int SoakMain(const FlagSet& flags, const Problem& problem) {
  SoakOptions o;
  o.target = absl::GetFlag(FLAGS_server);
  o.duration = absl::GetFlag(FLAGS_duration);
  absl::StatusOr<std::vector<int64_t>> concurrency =
      IntList("concurrency", absl::GetFlag(FLAGS_concurrency), 1, 1024);
  if (!concurrency.ok() || concurrency->size() != 1) {
    return UsageError("bench", absl::InvalidArgumentError("--concurrency: --soak takes one level"));
  }
  o.concurrency = concurrency->front();
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags, absl::Minutes(1));
  if (!timeout.ok()) return UsageError("bench", timeout.status());
  o.timeout = *timeout;
  o.check = CheckRequested();
  o.tolerance = absl::GetFlag(FLAGS_tolerance);
  for (const auto& [name, flag, out] :
       {std::tuple<const char*, const absl::Flag<int64_t>*, int64_t*>{
            "silent_streams", &FLAGS_silent_streams, &o.silent},
        {"slow_streams", &FLAGS_slow_streams, &o.slow},
        {"slow_rate", &FLAGS_slow_rate, &o.slow_rate},
        {"oversized_streams", &FLAGS_oversized_streams, &o.oversized},
        {"oversized_bytes", &FLAGS_oversized_bytes, &o.oversized_bytes},
        {"cancelling_streams", &FLAGS_cancelling_streams, &o.cancelling},
        {"hostile_channels", &FLAGS_hostile_channels, &o.hostile_channels},
        {"server_pid", &FLAGS_server_pid, &o.server_pid}}) {
    *out = absl::GetFlag(*flag);
    if (*out < 0 || *out > (int64_t{1} << 40)) {
      return UsageError("bench", absl::InvalidArgumentError(absl::StrCat(
                                     DashedFlag(name), ": must be in [0, 2^40], got ", *out)));
    }
  }
  if (o.hostile_channels < 1) o.hostile_channels = 1;
  o.grace = absl::GetFlag(FLAGS_soak_grace);
  if (absl::GetFlag(FLAGS_soak_specs).empty()) {
    o.specs.push_back(problem.spec);
  } else {
    for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_soak_specs), ';')) {
      absl::StatusOr<v1::AttentionSpec> spec = ParseSpecJsonProto(std::string(text));
      if (!spec.ok()) return UsageError("bench", spec.status());
      if (absl::GetFlag(FLAGS_causal)) spec->set_causal(true);
      o.specs.push_back(*std::move(spec));
    }
  }
  absl::StatusOr<std::unique_ptr<client::AttnClient>> client = ClientFromFlags();
  if (!client.ok()) return UsageError("bench", client.status());
  const SoakReport report = RunSoak(**client, problem, o);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", SoakReportJson(report).Dump(2).c_str());
  } else {
    std::fputs(SoakReportText(report).c_str(), stdout);
  }
  int64_t open = 0;
  for (const auto& [name, c] : report.classes) open += c.open_at_end;
  if (report.normal_mismatched > 0) return kExitCheck;
  if (report.normal_failed > 0) {
    // The most frequent failure's code, as bench reports it.
    std::string worst;
    for (const auto& [code, n] : report.normal_codes) {
      if (code != "OK" && (worst.empty() || n > report.normal_codes.at(worst))) worst = code;
    }
    for (int c = 1; c <= 16; ++c) {
      if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == worst) {
        return kExitRpcBase + c;
      }
    }
    return kExitLocal;
  }
  return open > 0 ? kExitLocal : kExitOk;
}

}  // namespace attnserve::attnctl
