#include "client/attnctl/bench_report.h"

#include <cinttypes>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attnserve::attnctl {
namespace {

// A CSV field: quoted (quotes doubled) when it holds a comma, a quote or a line break.
std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// %.6g, as the JSON writer prints doubles.
std::string Number(double v) { return absl::StrFormat("%.6g", v); }

constexpr const char* kCsvColumns[] = {"mode",          "concurrency",    "target_rate",
                                       "max_inflight",  "requests",       "ok",
                                       "failed",        "dropped",        "errors",
                                       "elapsed_s",     "requests_per_s", "bytes_per_s",
                                       "tokens_per_s",  "latency_p50_s",  "latency_p90_s",
                                       "latency_p99_s", "latency_max_s",  "latency_mean_s",
                                       "latency_min_s", "max_send_lag_s", "device",
                                       "date",          "commit",         "command",
                                       "server",        "backend",        "placement",
                                       "transport",     "shape",          "kv_heads",
                                       "kv_tokens",     "dtype",          "spec",
                                       "request_bytes", "response_bytes"};

}  // namespace

std::string ErrorsText(const std::map<std::string, int64_t>& errors) {
  std::vector<std::string> parts;
  for (const auto& [code, count] : errors) parts.push_back(absl::StrCat(code, "=", count));
  return absl::StrJoin(parts, ";");
}

std::string ReportTable(const BenchReportHeader& h, const std::vector<BenchRow>& rows) {
  std::string out = absl::StrFormat(
      "bench      [%s] %s, kv_heads %d, spec %s, backend %s, placement %s, %s\n",
      absl::StrJoin(h.shape, ", "), h.dtype, h.kv_heads, h.spec_json,
      h.backend.empty() ? "?" : h.backend, h.placement.empty() ? "?" : h.placement, h.transport);
  absl::StrAppendFormat(&out, "payload    %.3f MiB in, %.3f MiB out per request\n",
                        h.request_bytes / 1048576.0, h.response_bytes / 1048576.0);
  absl::StrAppendFormat(&out, "%12s %8s %8s %7s %7s %10s %10s %9s %9s %9s %9s  %s\n",
                        h.open_loop ? "rate/s" : "concurrency", "requests", "ok", "failed",
                        "dropped", "req/s", "MiB/s", "p50 ms", "p90 ms", "p99 ms", "max ms",
                        "errors");
  for (const BenchRow& r : rows) {
    const std::string level = h.open_loop ? Number(r.target_rate) : absl::StrCat(r.concurrency);
    const std::string errors = ErrorsText(r.errors);
    absl::StrAppendFormat(&out, "%12s %8d %8d %7d %7d %10.2f %10.2f %9.3f %9.3f %9.3f %9.3f  %s\n",
                          level, r.requests, r.ok, r.failed, r.dropped, r.requests_per_s,
                          r.bytes_per_s / 1048576.0, 1e3 * r.p50, 1e3 * r.p90, 1e3 * r.p99,
                          1e3 * r.max, errors.empty() ? "-" : errors);
  }
  if (h.open_loop) {
    absl::StrAppend(&out,
                    "(open loop: latency from each request's scheduled start; req/s is the "
                    "achieved rate)\n");
  }
  return out;
}

Json ReportJson(const BenchReportHeader& h, const std::vector<BenchRow>& rows) {
  Json report = Json::Object();
  bench::AddRunRecord(h.record, report);
  report.Set("bench", "attnctl bench")
      .Set("mode", h.open_loop ? "rate" : "concurrency")
      .Set("server", h.server)
      .Set("server_version", h.server_version)
      .Set("backend", h.backend)
      .Set("placement", h.placement)
      .Set("transport", h.transport)
      .Set("shape", Json::ArrayOf(h.shape))
      .Set("kv_heads", h.kv_heads)
      .Set("kv_tokens", h.kv_tokens)
      .Set("dtype", h.dtype)
      .Set("spec", Json::Raw(h.spec_json.empty() ? "{}" : h.spec_json))
      .Set("seed", static_cast<int64_t>(h.seed))
      .Set("request_bytes", h.request_bytes)
      .Set("response_bytes", h.response_bytes);
  Json array = Json::Array();
  for (const BenchRow& r : rows) {
    Json row = Json::Object();
    if (h.open_loop) {
      row.Set("target_rate", r.target_rate).Set("max_inflight", r.max_inflight);
    } else {
      row.Set("concurrency", r.concurrency);
    }
    Json errors = Json::Object();
    for (const auto& [code, count] : r.errors) errors.Set(code, count);
    Json latency = Json::Object();
    latency.Set("p50", r.p50)
        .Set("p90", r.p90)
        .Set("p99", r.p99)
        .Set("max", r.max)
        .Set("mean", r.mean)
        .Set("min", r.min);
    Json stages = Json::Object();
    stages.Set("receive", r.receive)
        .Set("queue", r.queue)
        .Set("compute", r.compute)
        .Set("copy", r.copy)
        .Set("kernel", r.kernel);
    row.Set("requests", r.requests)
        .Set("ok", r.ok)
        .Set("failed", r.failed)
        .Set("dropped", r.dropped)
        .Set("errors", std::move(errors))
        .Set("elapsed_s", r.elapsed_s)
        .Set("requests_per_s", r.requests_per_s)
        .Set("bytes_per_s", r.bytes_per_s)
        .Set("tokens_per_s", r.tokens_per_s)
        .Set("latency_s", std::move(latency));
    if (h.open_loop) row.Set("max_send_lag_s", r.max_send_lag_s);
    row.Set("server_stages_mean_s", std::move(stages));
    array.Push(std::move(row));
  }
  report.Set("rows", std::move(array));
  return report;
}

std::string ReportCsv(const BenchReportHeader& h, const std::vector<BenchRow>& rows) {
  std::string out = absl::StrCat(absl::StrJoin(kCsvColumns, ","), "\n");
  for (const BenchRow& r : rows) {
    const std::vector<std::string> fields = {h.open_loop ? "rate" : "concurrency",
                                             absl::StrCat(r.concurrency),
                                             Number(r.target_rate),
                                             absl::StrCat(r.max_inflight),
                                             absl::StrCat(r.requests),
                                             absl::StrCat(r.ok),
                                             absl::StrCat(r.failed),
                                             absl::StrCat(r.dropped),
                                             ErrorsText(r.errors),
                                             Number(r.elapsed_s),
                                             Number(r.requests_per_s),
                                             Number(r.bytes_per_s),
                                             Number(r.tokens_per_s),
                                             Number(r.p50),
                                             Number(r.p90),
                                             Number(r.p99),
                                             Number(r.max),
                                             Number(r.mean),
                                             Number(r.min),
                                             Number(r.max_send_lag_s),
                                             h.record.device,
                                             h.record.date,
                                             h.record.commit,
                                             h.record.command,
                                             h.server,
                                             h.backend,
                                             h.placement,
                                             h.transport,
                                             absl::StrJoin(h.shape, "x"),
                                             absl::StrCat(h.kv_heads),
                                             absl::StrCat(h.kv_tokens),
                                             h.dtype,
                                             h.spec_json,
                                             absl::StrCat(h.request_bytes),
                                             absl::StrCat(h.response_bytes)};
    std::vector<std::string> quoted;
    for (const std::string& f : fields) quoted.push_back(CsvField(f));
    absl::StrAppend(&out, absl::StrJoin(quoted, ","), "\n");
  }
  return out;
}

}  // namespace attnserve::attnctl
