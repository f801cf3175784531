#include "core/parallel/communicator.h"

#include <atomic>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

WaitOptions Timeout(absl::Duration d) {
  WaitOptions w;
  w.timeout = d;
  return w;
}

TEST(InProcessCommGroupTest, CreateRejectsEmptyGroup) {
  EXPECT_EQ(InProcessCommGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessCommGroupTest, SingleRankSendsToItself) {
  auto group = InProcessCommGroup::Create(1).value();
  Communicator* c = group->comm(0);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<int32_t> send = {1, 2, 3, 4}, recv(4, -1);
  ASSERT_TRUE(c->SendRecv(send.data(), 16, 0, recv.data(), 16, 0, Timeout(absl::Seconds(5))).ok());
  EXPECT_EQ(recv, send);
  EXPECT_EQ(c->bytes_sent(), 16);
  EXPECT_EQ(c->bytes_received(), 16);
}

// P threads pass buffers around the ring several times, double-buffered as the ring driver does,
// and check every byte and the byte counters.
TEST(InProcessCommGroupTest, RingRotatesBuffers) {
  for (int P : {2, 3, 4}) {
    SCOPED_TRACE(P);
    auto group = InProcessCommGroup::Create(P).value();
    constexpr int kWords = 1000;
    std::vector<absl::Status> status(P);
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r) {
      threads.emplace_back([&, r] {
        Communicator* c = group->comm(r);
        std::vector<int32_t> cur(kWords), next(kWords);
        std::iota(cur.begin(), cur.end(), r * kWords);  // rank r's shard
        for (int t = 0; t + 1 < P; ++t) {
          auto pending = c->StartSendRecv(cur.data(), kWords * 4, (r + 1) % P, next.data(),
                                          kWords * 4, (r - 1 + P) % P);
          if (!pending.ok()) {
            status[r] = pending.status();
            return;
          }
          // "Compute" on cur while it is being sent: reading it is allowed.
          int64_t sum = std::accumulate(cur.begin(), cur.end(), int64_t{0});
          (void)sum;
          status[r] = c->Wait(*std::move(pending), Timeout(absl::Seconds(10)));
          if (!status[r].ok()) return;
          std::swap(cur, next);
          const int src = (r - t - 1 + 2 * P) % P;
          if (cur[0] != src * kWords || cur[kWords - 1] != src * kWords + kWords - 1) {
            status[r] = absl::InternalError("wrong data");
            return;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < P; ++r) {
      EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
      EXPECT_EQ(group->comm(r)->bytes_sent(), int64_t{4} * kWords * (P - 1));
      EXPECT_EQ(group->comm(r)->bytes_received(), int64_t{4} * kWords * (P - 1));
    }
  }
}

TEST(InProcessCommGroupTest, MissingSenderTimesOutInsteadOfHanging) {
  auto group = InProcessCommGroup::Create(2).value();
  int32_t buf = 0;
  const absl::Time start = absl::Now();
  absl::Status s =
      group->comm(0)->SendRecv(nullptr, 0, kNoPeer, &buf, 4, 1, Timeout(absl::Milliseconds(100)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(group->comm(0)->bytes_received(), 0);
}

TEST(InProcessCommGroupTest, UnmatchedSendTimesOutAndIsWithdrawn) {
  auto group = InProcessCommGroup::Create(2).value();
  {
    int32_t value = 7;
    absl::Status s = group->comm(0)->SendRecv(&value, 4, 1, nullptr, 0, kNoPeer,
                                              Timeout(absl::Milliseconds(50)));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  }  // `value` is gone: rank 1 must not find it in its mailbox
  int32_t got = -1;
  absl::Status s =
      group->comm(1)->SendRecv(nullptr, 0, kNoPeer, &got, 4, 0, Timeout(absl::Milliseconds(50)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(got, -1);
  EXPECT_EQ(group->comm(0)->bytes_sent(), 0);
}

TEST(InProcessCommGroupTest, AbortReleasesBlockedWaiters) {
  auto group = InProcessCommGroup::Create(3).value();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      int32_t buf;
      status[r] =
          group->comm(r)->SendRecv(nullptr, 0, kNoPeer, &buf, 4, 2, Timeout(absl::Seconds(30)));
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  group->comm(2)->Abort(absl::CancelledError("request cancelled"));
  for (auto& t : threads) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const auto& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_EQ(s.message(), "request cancelled");
  }
  // Later transfers fail at once.
  int32_t x = 0;
  EXPECT_EQ(group->comm(0)->StartSendRecv(&x, 4, 1, nullptr, 0, kNoPeer).status().code(),
            absl::StatusCode::kCancelled);
}

TEST(InProcessCommGroupTest, CancelFlagEndsWait) {
  auto group = InProcessCommGroup::Create(2).value();
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(30));
    cancel.store(true);
  });
  WaitOptions w;
  w.timeout = absl::Seconds(30);
  w.cancel = &cancel;
  int32_t buf;
  const absl::Time start = absl::Now();
  absl::Status s = group->comm(0)->SendRecv(nullptr, 0, kNoPeer, &buf, 4, 1, w);
  canceller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(InProcessCommGroupTest, ByteCountMismatchFailsBothSides) {
  auto group = InProcessCommGroup::Create(2).value();
  std::vector<uint8_t> send(8, 1), recv(4, 0);
  absl::Status s0, s1;
  std::thread t0([&] {
    s0 = group->comm(0)->SendRecv(send.data(), 8, 1, nullptr, 0, kNoPeer,
                                  Timeout(absl::Seconds(10)));
  });
  s1 = group->comm(1)->SendRecv(nullptr, 0, kNoPeer, recv.data(), 4, 0, Timeout(absl::Seconds(10)));
  t0.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kInternal) << s0;
  EXPECT_EQ(s1.code(), absl::StatusCode::kInternal) << s1;
  EXPECT_EQ(recv, std::vector<uint8_t>(4, 0));
}

TEST(InProcessCommGroupTest, RejectsBadPeers) {
  auto group = InProcessCommGroup::Create(2).value();
  int32_t x = 0;
  EXPECT_EQ(group->comm(0)->StartSendRecv(&x, 4, 2, nullptr, 0, kNoPeer).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group->comm(0)->StartSendRecv(&x, -1, 1, nullptr, 0, kNoPeer).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve
