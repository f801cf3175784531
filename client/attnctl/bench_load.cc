#include "client/attnctl/bench_load.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/attnctl/output.h"

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// Collects the answers of a run from several threads.
class Recorder {
 public:
  explicit Recorder(bool keep_first_result) : keep_first_result_(keep_first_result) {}

  void Record(absl::StatusOr<client::AttendResult> r, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.ok()) {
      stats_.latencies.push_back(seconds);
      stats_.receive += r->header.receive_seconds();
      stats_.queue += r->header.queue_seconds();
      stats_.compute += r->header.compute_seconds();
      stats_.copy += r->header.copy_seconds();
      stats_.kernel += r->header.kernel_seconds();
      if (stats_.backend.empty()) {
        stats_.backend = r->header.backend();
        stats_.ran_on = absl::StrCat(ShortEnumName(v1::Placement_Name(r->header.placement())),
                                     " on ", absl::StrJoin(r->header.devices(), ", "));
      }
      if (keep_first_result_ && !stats_.first_result) stats_.first_result = *std::move(r);
      completed_.fetch_add(1);
    } else {
      ++stats_.errors[absl::StatusCodeToString(r.status().code())];
      if (stats_.first_error.empty()) stats_.first_error = r.status().ToString();
      failed_.fetch_add(1);
    }
  }

  int64_t completed() const { return completed_.load(); }
  int64_t failed() const { return failed_.load(); }

  // The progress line, when `live`: "[bench] 12 ok, 0 failed, 24.0 req/s, 0.5 s".
  void DrawLive(absl::Time start) const {
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    std::fprintf(stderr, "\r[bench] %" PRId64 " ok, %" PRId64 " failed, %.1f req/s, %.1f s",
                 completed(), failed(), elapsed > 0 ? completed() / elapsed : 0.0, elapsed);
  }

  // The stats once every thread is done; latencies sorted.
  BenchStats Finish(absl::Time start) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    stats_.failed = failed_.load();
    std::sort(stats_.latencies.begin(), stats_.latencies.end());
    return std::move(stats_);
  }

 private:
  const bool keep_first_result_;
  std::mutex mu_;
  BenchStats stats_;
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> failed_{0};
};

}  // namespace

BenchStats RunClosedLoop(client::AttnClient& client, const client::AttendInput& input,
                         const Load& load) {
  client::CallOptions call;
  call.timeout = load.timeout;
  // Each thread claims request numbers until the count (or the duration) runs out; every call is
  // bounded by --timeout, so the whole run is bounded by (count or duration) + timeout.
  const int64_t max_requests = load.duration ? std::numeric_limits<int64_t>::max() : load.requests;
  std::atomic<int64_t> next{0};
  Recorder recorder(load.keep_first_result);
  const absl::Time start = absl::Now();
  const absl::Time stop_at = load.duration ? start + *load.duration : absl::InfiniteFuture();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < load.concurrency; ++t) {
    threads.emplace_back([&] {
      while (absl::Now() < stop_at && next.fetch_add(1) < max_requests) {
        const absl::Time begin = absl::Now();
        absl::StatusOr<client::AttendResult> r = client.Attend(input, call);
        recorder.Record(std::move(r), absl::ToDoubleSeconds(absl::Now() - begin));
      }
    });
  }
  // Waits for the workers, drawing the live line every half second on a terminal. Bounded: the
  // workers stop by themselves (see above); this loop ends when they have.
  while (recorder.completed() + recorder.failed() < max_requests) {
    if (load.duration && absl::Now() >= stop_at + load.timeout) break;
    absl::SleepFor(absl::Milliseconds(load.live ? 500 : 50));
    if (load.live) recorder.DrawLive(start);
    if (load.duration && absl::Now() >= stop_at) break;
  }
  for (std::thread& t : threads) t.join();
  if (load.live) std::fprintf(stderr, "\n");
  return recorder.Finish(start);
}

BenchStats RunOpenLoop(client::AttnClient& client, const client::AttendInput& input,
                       const Load& load) {
  client::CallOptions call;
  call.timeout = load.timeout;
  const int64_t total =
      load.duration ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(
                                               absl::ToDoubleSeconds(*load.duration) * load.rate)))
                    : load.requests;
  Recorder recorder(load.keep_first_result);
  // Due requests wait in `queue` (by their scheduled start) for a worker. Workers are started as
  // needed, so that there are always at least as many as calls outstanding (queued or running):
  // a due request never waits for a worker, and the workers never outnumber --max-inflight.
  std::mutex mu;
  std::condition_variable wake;
  std::deque<absl::Time> queue;
  bool closed = false;
  std::atomic<int64_t> outstanding{0};
  std::vector<std::thread> workers;
  auto work = [&] {
    while (true) {
      absl::Time scheduled;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return closed || !queue.empty(); });
        if (queue.empty()) return;  // closed and drained
        scheduled = queue.front();
        queue.pop_front();
      }
      absl::StatusOr<client::AttendResult> r = client.Attend(input, call);
      recorder.Record(std::move(r), absl::ToDoubleSeconds(absl::Now() - scheduled));
      outstanding.fetch_sub(1);
    }
  };
  int64_t dropped = 0;
  double max_lag = 0;
  const absl::Duration interval = absl::Seconds(1.0 / load.rate);
  const absl::Time start = absl::Now();
  absl::Time next_draw = start + absl::Milliseconds(500);
  for (int64_t i = 0; i < total; ++i) {
    const absl::Time due = start + i * interval;
    const absl::Time now = absl::Now();
    if (due > now) absl::SleepFor(due - now);
    max_lag = std::max(max_lag, absl::ToDoubleSeconds(absl::Now() - due));
    if (outstanding.load() >= load.max_inflight) {
      ++dropped;
      continue;
    }
    const int64_t n = outstanding.fetch_add(1) + 1;
    if (static_cast<int64_t>(workers.size()) < n) workers.emplace_back(work);
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(due);
    }
    wake.notify_one();
    if (load.live && absl::Now() >= next_draw) {
      recorder.DrawLive(start);
      next_draw += absl::Milliseconds(500);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
  }
  wake.notify_all();
  // Every call is bounded by --timeout, so the workers end within it.
  for (std::thread& t : workers) t.join();
  if (load.live) {
    recorder.DrawLive(start);
    std::fprintf(stderr, "\n");
  }
  BenchStats stats = recorder.Finish(start);
  stats.dropped = dropped;
  stats.max_send_lag = max_lag;
  stats.window = static_cast<double>(total) / load.rate;
  return stats;
}

BenchRow MakeRow(const BenchStats& stats, const Load& load, int64_t payload_bytes, int64_t tokens) {
  BenchRow row;
  const std::vector<double>& l = stats.latencies;
  if (load.rate > 0) {
    row.target_rate = load.rate;
    row.max_inflight = load.max_inflight;
  } else {
    row.concurrency = load.concurrency;
  }
  row.ok = static_cast<int64_t>(l.size());
  row.failed = stats.failed;
  row.dropped = stats.dropped;
  row.requests = row.ok + row.failed;
  row.errors = stats.errors;
  row.elapsed_s = std::max(stats.elapsed, stats.window);
  row.requests_per_s = row.elapsed_s > 0 ? row.ok / row.elapsed_s : 0;
  row.bytes_per_s = row.requests_per_s * static_cast<double>(payload_bytes);
  row.tokens_per_s = row.requests_per_s * static_cast<double>(tokens);
  row.p50 = Percentile(l, 0.5);
  row.p90 = Percentile(l, 0.9);
  row.p99 = Percentile(l, 0.99);
  if (!l.empty()) {
    row.min = l.front();
    row.max = l.back();
    for (double v : l) row.mean += v;
    row.mean /= static_cast<double>(l.size());
    const double n = static_cast<double>(l.size());
    row.receive = stats.receive / n;
    row.queue = stats.queue / n;
    row.compute = stats.compute / n;
    row.copy = stats.copy / n;
    row.kernel = stats.kernel / n;
  }
  row.max_send_lag_s = stats.max_send_lag;
  return row;
}

}  // namespace attnserve::attnctl
