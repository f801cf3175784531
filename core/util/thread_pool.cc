#include "core/util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace attnserve {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  // Shared state lives on the heap: helpers that start after the caller has finished all items
  // still touch it.
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto drain = [state, n, &fn]() {
    int64_t finished = 0;
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      fn(i);
      ++finished;
    }
    if (finished > 0 && state->done.fetch_add(finished) + finished == n) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->cv.notify_all();
    }
  };
  const int64_t helpers = std::min<int64_t>(num_threads(), n - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Helpers capture `fn` by reference: they only call it while items remain, and the caller
    // waits below until every item has finished, so `fn` outlives every call.
    for (int64_t i = 0; i < helpers; ++i) tasks_.emplace_back(drain);
  }
  cv_.notify_all();
  drain();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

}  // namespace attnserve
