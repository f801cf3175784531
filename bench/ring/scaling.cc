// attnbench_ring's scaling bench: T1 (one GPU) vs T2 (the ring) per N, engine and causality,
// the data-parallel memory, then the longest dense causal N per mode. See ring_bench.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/util/json.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/run_record.h"
#include "bench/ring/ring_bench.h"
#include "bench/ring/ring_run.h"
#include "bench/ring/single_gpu.h"

namespace attnserve::bench {
namespace {

// The results file, rewritten after every case so that a run cut short by a timeout still
// leaves its results.
struct ScalingReport {
  Json header = Json::Object();
  Json cases = Json::Array();
  Json longest = Json::Array();
  std::vector<std::string> table = {
      "| engine | N | causal | T1 (s) | T2 ring (s) | eff T1/(P*T2) | T1 TF/s | ring TF/s | DP (s) "
      "| ring peak GiB/GPU | DP peak GiB/GPU | 1-GPU peak GiB | NCCL MiB sent/recv per GPU | "
      "check |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"};

  void Write(const std::string& path, double wall_s) const {
    if (path.empty()) return;
    Json j = header;
    j.Set("cases", cases).Set("longest", longest).Set("wall_s", wall_s);
    const absl::Status st = WriteJsonFile(path, j, 2);
    if (!st.ok()) std::printf("%s\n", st.ToString().c_str());
  }
};

// T1: one GPU on the full sequence, median of opt.reps after opt.warmup.
struct SingleFigures {
  std::vector<double> times;
  int64_t peak = 0;
};
absl::StatusOr<SingleFigures> TimeSingle(SingleGpu& g, const RingBenchOptions& opt) {
  SingleFigures f;
  for (int it = 0; it < opt.warmup + opt.reps; ++it) {
    absl::StatusOr<double> t = RunSingleOnce(g);
    if (!t.ok()) return t.status();
    if (it >= opt.warmup) f.times.push_back(*t);
  }
  f.peak = g.alloc->Stats().peak_bytes;
  return f;
}

struct RingTotals {
  int64_t peak = 0, sent = 0, recv = 0;
  std::vector<int64_t> peaks, sents, recvs, cudnn_pieces;
};
RingTotals Totals(const std::vector<RingCudaRankStats>& stats) {
  RingTotals t;
  for (const RingCudaRankStats& s : stats) {
    t.cudnn_pieces.push_back(s.cudnn_pieces);
    t.peaks.push_back(s.peak_device_bytes);
    t.sents.push_back(s.bytes_sent);
    t.recvs.push_back(s.bytes_received);
    t.peak = std::max(t.peak, s.peak_device_bytes);
    t.sent = std::max(t.sent, s.bytes_sent);
    t.recv = std::max(t.recv, s.bytes_received);
  }
  return t;
}

// One scaling case: T1, the ring checked against T1's output, data parallel; printed, added to
// the table and the results.
void RunScalingCase(const RingBenchOptions& opt, int64_t n, const std::string& engine,
                    bool causal, ScalingReport& report) {
  const AttentionShape shape{1, n, opt.heads, opt.heads, opt.dim};
  const double flops = DenseFlops(shape, causal);
  std::string err;
  SingleFigures t1f;
  auto single = MakeSingleGpu(0, shape, causal, 1234, opt.cuda,
                              engine == "cudnn" ? SingleGpuEngine::kCudnn : SingleGpuEngine::kOwn);
  if (single.ok()) {
    absl::StatusOr<SingleFigures> timed = TimeSingle(**single, opt);
    if (timed.ok()) t1f = *timed;
    if (!timed.ok()) err = absl::StrCat("single: ", timed.status().ToString());
  } else {
    err = absl::StrCat("single: ", single.status().ToString());
  }
  const double t1 = Median(t1f.times);
  RingResult ring;
  if (err.empty()) {
    ring = RunRing({shape, causal, opt.devices, opt.warmup, opt.reps, 1234, engine == "cudnn"},
                   opt.cuda, single->get());
    if (!ring.status.ok()) err = absl::StrCat("ring: ", ring.status.ToString());
  }
  single = absl::UnknownError("released");  // free device 0 before the data-parallel run
  const double t2 = Median(ring.times);
  DpResult dp;
  if (err.empty()) {
    dp = RunDataParallel(shape, causal, opt.devices, /*warmup=*/0, /*reps=*/1, opt.cuda);
    if (!dp.status.ok()) err = absl::StrCat("data-parallel: ", dp.status.ToString());
  }
  const double eff = t1 / (opt.devices * t2);
  const RingTotals rt = Totals(ring.stats);
  int64_t dp_peak = 0;
  for (int64_t b : dp.peak_bytes) dp_peak = std::max(dp_peak, b);
  const bool check_ok = ring.check_o_rel <= 1e-2 && ring.check_lse_abs <= 2e-3;
  std::printf(
      "[%s] N=%lld causal=%d  T1 %.4f s (%.1f TF/s)  T2 %.4f s (%.1f TF/s)  eff %.3f  DP %.4f s  "
      "peak GiB ring %.2f dp %.2f 1gpu %.2f  nccl MiB/GPU sent %.1f recv %.1f  check o_rel "
      "%.2e lse %.2e %s %s\n",
      engine.c_str(), static_cast<long long>(n), causal, t1, flops / t1 / 1e12, t2,
      flops / t2 / 1e12, eff, dp.median_s, rt.peak / kGiB, dp_peak / kGiB, t1f.peak / kGiB,
      rt.sent / 1048576.0, rt.recv / 1048576.0, ring.check_o_rel, ring.check_lse_abs,
      check_ok ? "OK" : "FAIL", err.c_str());
  std::fflush(stdout);
  report.table.push_back(absl::StrFormat(
      "| %s | %d | %s | %.4f | %.4f | %.3f | %.1f | %.1f | %.4f | %.2f | %.2f | %.2f | "
      "%.1f/%.1f | %s |",
      engine, n, causal ? "yes" : "no", t1, t2, eff, flops / t1 / 1e12, flops / t2 / 1e12,
      dp.median_s, rt.peak / kGiB, dp_peak / kGiB, t1f.peak / kGiB, rt.sent / 1048576.0,
      rt.recv / 1048576.0, err.empty() ? (check_ok ? "ok" : "FAIL") : "error"));
  report.cases.Push(Json::Object()
                        .Set("n", n)
                        .Set("causal", causal)
                        .Set("engine", engine)
                        .Set("ring_cudnn_pieces_per_gpu", Json::ArrayOf(rt.cudnn_pieces))
                        .Set("flops", flops)
                        .Set("t1_s", t1)
                        .Set("t1_runs_s", Json::ArrayOf(t1f.times))
                        .Set("t2_s", t2)
                        .Set("t2_runs_s", Json::ArrayOf(ring.times))
                        .Set("efficiency", eff)
                        .Set("t1_tflops", flops / t1 / 1e12)
                        .Set("t2_tflops", flops / t2 / 1e12)
                        .Set("dp_s", dp.median_s)
                        .Set("ring_peak_bytes_per_gpu", Json::ArrayOf(rt.peaks))
                        .Set("dp_peak_bytes_per_gpu", Json::ArrayOf(dp.peak_bytes))
                        .Set("single_peak_bytes", t1f.peak)
                        .Set("nccl_bytes_sent_per_gpu", Json::ArrayOf(rt.sents))
                        .Set("nccl_bytes_received_per_gpu", Json::ArrayOf(rt.recvs))
                        .Set("check_o_rel", ring.check_o_rel)
                        .Set("check_lse_abs", ring.check_lse_abs)
                        .Set("check_ok", check_ok)
                        .Set("error", err));
}

// One dense causal run at N on one GPU or on the ring: its time and peak bytes per GPU.
struct LongestRun {
  absl::Status status;
  double t = NAN;
  int64_t peak = 0;
};
LongestRun RunLongestOnce(bool ring, int64_t n, const RingBenchOptions& opt) {
  const AttentionShape shape{1, n, opt.heads, opt.heads, opt.dim};
  LongestRun r;
  if (!ring) {
    auto g = MakeSingleGpu(0, shape, true, 99, opt.cuda);
    if (!g.ok()) {
      r.status = g.status();
      return r;
    }
    absl::StatusOr<double> t = RunSingleOnce(**g);
    r.status = t.status();
    if (t.ok()) r.t = *t;
    r.peak = (*g)->alloc->Stats().peak_bytes;
    return r;
  }
  RingResult rr = RunRing({shape, true, opt.devices, 0, 1, 99, false}, opt.cuda);
  r.status = rr.status;
  if (r.status.ok()) {
    r.t = rr.times[0];
    for (const auto& s : rr.stats) r.peak = std::max(r.peak, s.peak_device_bytes);
  }
  return r;
}

// Longest dense causal sequence per mode, the modes interleaved per N so that a bench budget
// cut treats them alike. Returns the summary lines.
std::string RunLongestSweep(const RingBenchOptions& opt, const std::function<double()>& elapsed,
                            ScalingReport& report) {
  struct ModeState {
    const char* name;
    bool ring;
    double last_t = 0;
    int64_t last_n = 0, best_n = 0, best_peak = 0;
    double best_t = NAN;
    bool stopped = false;
    std::string stop = "all sizes ran";
  };
  ModeState modes[2] = {{"1gpu", false}, {"ring", true}};
  for (int64_t n : opt.longest) {
    for (ModeState& m : modes) {
      if (m.stopped) continue;
      if (m.last_n > 0) {
        const double ratio = static_cast<double>(n) / m.last_n;
        const double predicted = m.last_t * ratio * ratio;
        if (predicted > opt.max_run_s) {
          m.stop = absl::StrFormat("N=%d predicted %.0f s > %.0f s", n, predicted, opt.max_run_s);
          m.stopped = true;
          continue;
        }
        if (elapsed() + predicted > opt.budget_s + 60) {
          m.stop = absl::StrFormat("N=%d: bench budget", n);
          m.stopped = true;
          continue;
        }
      }
      const LongestRun r = RunLongestOnce(m.ring, n, opt);
      std::printf("longest %s N=%lld: %s %.3f s peak %.2f GiB/GPU\n", m.name,
                  static_cast<long long>(n), r.status.ok() ? "ok" : r.status.ToString().c_str(),
                  r.t, r.peak / kGiB);
      std::fflush(stdout);
      report.longest.Push(Json::Object()
                              .Set("mode", m.name)
                              .Set("n", n)
                              .Set("ok", r.status.ok())
                              .Set("time_s", r.t)
                              .Set("peak_bytes_per_gpu", r.peak)
                              .Set("error", r.status.ok() ? "" : r.status.ToString()));
      report.Write(opt.json, elapsed());
      if (!r.status.ok()) {
        m.stop = absl::StrCat("N=", n, " failed: ", r.status.message());
        m.stopped = true;
        continue;
      }
      m.last_t = m.best_t = r.t;
      m.last_n = m.best_n = n;
      m.best_peak = r.peak;
    }
  }
  std::string summary;
  for (const ModeState& m : modes) {
    summary += absl::StrFormat("longest dense causal %s: N=%d (%.2f s, %.2f GiB/GPU); stop: %s\n",
                               m.name, m.best_n, m.best_t, m.best_peak / kGiB, m.stop);
    report.longest.Push(
        Json::Object().Set("mode", m.name).Set("longest_n", m.best_n).Set("stop", m.stop));
  }
  return summary;
}

}  // namespace

int RunScalingBench(const RingBenchOptions& opt) {
  const auto start = Clock::now();
  auto elapsed = [&] { return Seconds(start, Clock::now()); };
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaDeviceProp prop{};
  if (count > 0) cudaGetDeviceProperties(&prop, 0);
  std::printf("attnbench_ring: %d GPU(s), %s; ring over %d\n", count, prop.name, opt.devices);
  if (count < opt.devices) {
    std::printf("need %d GPUs, found %d\n", opt.devices, count);
    return 2;
  }
  ScalingReport report;
  report.header.Set("bench", "attnbench_ring");
  AddRunRecord(MakeRunRecord(prop.name, opt.commit), report.header);
  report.header.Set("gpus", opt.devices)
      .Set("dtype", "bf16")
      .Set("batch", 1)
      .Set("heads", opt.heads)
      .Set("head_dim", opt.dim)
      .Set("reps", opt.reps)
      .Set("flops_formula", "4*B*Hq*D*pairs (causal N(N+1)/2)");

  std::vector<std::string> engines;
  if (opt.engine == "both" || opt.engine == "own") engines.push_back("own");
  if (opt.engine == "both" || opt.engine == "cudnn") engines.push_back("cudnn");
  for (int64_t n : opt.ns) {
    for (const std::string& engine : engines) {
      for (bool causal : {false, true}) {
        if (elapsed() > opt.budget_s) {
          std::printf("N=%lld causal=%d: skipped (bench budget %.0f s spent)\n",
                      static_cast<long long>(n), causal, opt.budget_s);
          report.cases.Push(
              Json::Object().Set("n", n).Set("causal", causal).Set("skipped", "budget"));
          continue;
        }
        RunScalingCase(opt, n, engine, causal, report);
        report.Write(opt.json, elapsed());
      }
    }
  }
  const std::string longest_summary = RunLongestSweep(opt, elapsed, report);
  std::printf("\n%s\n", absl::StrJoin(report.table, "\n").c_str());
  std::printf("%s", longest_summary.c_str());
  std::printf("bench wall %.1f s\n", elapsed());
  report.Write(opt.json, elapsed());
  if (!opt.json.empty()) std::printf("wrote %s\n", opt.json.c_str());
  return 0;
}

}  // namespace attnserve::bench
