#include "bench/harness/rank_threads.h"

#include <thread>

namespace attnserve::bench {

bool Barrier::Arrive() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return false;
  const int64_t generation = generation_;
  if (++count_ == n_) {
    count_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
  // A round that completed counts even when an abort came before this thread woke up: the
  // caller's next Arrive sees the abort.
  return generation_ != generation;
}

void Barrier::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

absl::Status OtherRankFailed() { return absl::AbortedError("another rank failed"); }

std::vector<absl::Status> RunRankThreads(int ranks, const std::function<absl::Status(int)>& body,
                                         Barrier* barrier,
                                         const std::function<void(const absl::Status&)>&
                                             on_failure) {
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = body(rank);
      if (status[rank].ok()) return;
      if (on_failure) on_failure(status[rank]);
      if (barrier != nullptr) barrier->Abort();
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

absl::Status FirstFailure(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok() && s != OtherRankFailed()) return s;
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace attnserve::bench
