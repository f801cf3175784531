// ThreadPool: every item runs exactly once, also when several threads call ParallelFor at once
// (the case the TSan build, make tsan, exists to check) and when helpers start after the caller
// has already finished every item.
#include "core/util/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(ThreadPoolTest, EveryItemRunsOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n = " << n << ", i = " << i;
  }
}

TEST(ThreadPoolTest, ConcurrentCallersShareThePool) {
  ThreadPool pool(2);
  constexpr int kCallers = 4;
  constexpr int kRounds = 50;
  constexpr int64_t kItems = 64;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < kRounds; ++round) {
        // Plain (non-atomic) writes to distinct slots: the pool must order them before the
        // caller reads them back, which TSan checks.
        std::vector<int64_t> out(kItems, 0);
        pool.ParallelFor(kItems, [&](int64_t i) { out[i] = i + 1; });
        for (int64_t v : out) sums[c] += v;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(sums[c], kRounds * kItems * (kItems + 1) / 2) << "caller " << c;
  }
}

TEST(ThreadPoolTest, DestroyedRightAfterWork) {
  // Helpers queued for items the caller already finished may still be pending at destruction.
  for (int round = 0; round < 20; ++round) {
    ThreadPool pool(4);
    std::atomic<int64_t> total{0};
    pool.ParallelFor(5, [&](int64_t i) { total.fetch_add(i); });
    EXPECT_EQ(total.load(), 10);
  }
}

}  // namespace
}  // namespace attnserve
