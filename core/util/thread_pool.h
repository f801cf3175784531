// A fixed-size pool of worker threads with a blocking ParallelFor.
#ifndef ATTNSERVE_CORE_UTIL_THREAD_POOL_H_
#define ATTNSERVE_CORE_UTIL_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attnserve {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()); }

  // Runs fn(i) for i in [0, n), spread over the pool and the calling thread; returns when all are
  // done. Items are handed out dynamically (an atomic counter), so uneven items balance. Safe to
  // call from several threads at once; must not be called from inside fn.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_THREAD_POOL_H_
