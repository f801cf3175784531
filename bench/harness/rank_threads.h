// Rank threads for the multi-GPU benches: one host thread per rank (only that thread touches its
// device), a barrier they meet at around every timed run, and an abort that releases everyone
// when one rank fails, so that a failing rank never leaves the others blocked.
#ifndef ATTNSERVE_BENCH_HARNESS_RANK_THREADS_H_
#define ATTNSERVE_BENCH_HARNESS_RANK_THREADS_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace attnserve::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The median of `v` (the mean of the middle two for an even count); NaN when empty.
inline double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  // Blocks until all n threads arrived; false (at once, or when woken) once Abort was called.
  bool Arrive();
  void Abort();

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
};

// ABORTED "another rank failed": what a rank returns when Arrive() comes back false.
absl::Status OtherRankFailed();

// Runs body(rank) on `ranks` threads and joins them. When a body fails, `on_failure` (if set)
// runs on that thread with its status (e.g. to abort an NCCL group) and then `barrier` (if set)
// is aborted. Returns one status per rank.
std::vector<absl::Status> RunRankThreads(int ranks, const std::function<absl::Status(int)>& body,
                                         Barrier* barrier = nullptr,
                                         const std::function<void(const absl::Status&)>&
                                             on_failure = nullptr);

// The first failure of `statuses`, else OK. Ranks that only reported OtherRankFailed() come
// after the rank that caused it.
absl::Status FirstFailure(const std::vector<absl::Status>& statuses);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_BENCH_HARNESS_RANK_THREADS_H_
