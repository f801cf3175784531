#include "server/stream_limits.h"

#include <atomic>
#include <functional>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(CheckUploadTest, IdleTimeoutEndsASilentStreamNamingTheFlag) {
  StreamLimits l;
  l.idle_timeout = absl::Seconds(5);
  l.min_upload_rate = 0;
  EXPECT_FALSE(CheckUpload(l, kStart, kStart, 0, kStart + absl::Seconds(4.9), "receiving"));
  std::optional<absl::Status> s =
      CheckUpload(l, kStart, kStart, 0, kStart + absl::Seconds(5), "receiving the request");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s->message(), HasSubstr("--stream-idle-timeout=5s"));
  EXPECT_THAT(s->message(), HasSubstr("receiving the request"));
  // A message resets the clock.
  EXPECT_FALSE(CheckUpload(l, kStart, kStart + absl::Seconds(3), 10, kStart + absl::Seconds(7),
                           "receiving"));
  l.idle_timeout = absl::ZeroDuration();  // off
  EXPECT_FALSE(CheckUpload(l, kStart, kStart, 0, kStart + absl::Hours(10), "receiving"));
}

TEST(CheckUploadTest, MinimumRateAppliesAfterTheGraceOnTheAverage) {
  StreamLimits l;
  l.idle_timeout = absl::ZeroDuration();
  l.min_upload_rate = 1000;
  l.min_upload_grace = absl::Seconds(10);
  const absl::Time t = kStart + absl::Seconds(9);
  EXPECT_FALSE(CheckUpload(l, kStart, t, 0, t, "receiving")) << "within the grace";
  const absl::Time later = kStart + absl::Seconds(20);
  EXPECT_FALSE(CheckUpload(l, kStart, later, 20000, later, "receiving")) << "1000 B/s: enough";
  std::optional<absl::Status> s = CheckUpload(l, kStart, later, 19999, later, "receiving");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s->message(), HasSubstr("--min-upload-rate=1000"));
  EXPECT_THAT(s->message(), HasSubstr("--min-upload-grace=10s"));
  l.min_upload_rate = 0;
  EXPECT_FALSE(CheckUpload(l, kStart, later, 0, later, "receiving"));
}

TEST(UploadBudgetTest, RefusesPastTheCapNamingTheFlagAndReleases) {
  UploadBudget budget(100, "--max-upload-bytes");
  UploadBudget::Reservation a, b, c;
  ASSERT_TRUE(budget.Reserve(60, "header", &a).ok());
  absl::Status s = budget.Reserve(41, "header: q, k and v", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("--max-upload-bytes=100"));
  EXPECT_THAT(s.message(), HasSubstr("hold 60"));
  EXPECT_EQ(b.bytes(), 0);
  ASSERT_TRUE(budget.Reserve(40, "header", &b).ok());
  EXPECT_EQ(budget.held_bytes(), 100);
  a.Release();
  EXPECT_EQ(budget.held_bytes(), 40);
  {
    UploadBudget::Reservation moved = std::move(b);
    EXPECT_EQ(budget.held_bytes(), 40);
  }
  EXPECT_EQ(budget.held_bytes(), 0) << "a reservation releases when destroyed";
  EXPECT_EQ(budget.Reserve(101, "header", &c).code(), absl::StatusCode::kResourceExhausted);
  UploadBudget unlimited(0, "--max-upload-bytes");
  EXPECT_TRUE(unlimited.Reserve(int64_t{1} << 50, "header", &c).ok());
}

class FakeStream : public WatchedStream {
 public:
  std::function<void()> CheckLimits(absl::Time) override {
    ++checks;
    if (expired.exchange(false)) return [this] { ++finished; };
    return nullptr;
  }
  std::atomic<int> checks{0};
  std::atomic<int> finished{0};
  std::atomic<bool> expired{false};
};

TEST(StreamWatchdogTest, ChecksRegisteredStreamsAndRunsTheirContinuations) {
  std::atomic<int> ticks{0};
  StreamWatchdog dog(absl::Milliseconds(10), [&] { ++ticks; });
  FakeStream s;
  dog.Add(&s);
  EXPECT_EQ(dog.size(), 1u);
  s.expired = true;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (s.finished.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(s.finished.load(), 1);
  dog.Remove(&s);
  const int checks = s.checks.load();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(s.checks.load(), checks) << "no checks after Remove";
  EXPECT_GT(ticks.load(), 0);
}

TEST(StreamWatchdogTest, PeriodIsATenthOfTheShortestLimitWithinBounds) {
  StreamLimits l;
  l.idle_timeout = absl::Seconds(5);
  l.min_upload_rate = 1;
  l.min_upload_grace = absl::Seconds(1);
  EXPECT_EQ(StreamWatchdog::PeriodFor(l), absl::Milliseconds(100));
  l.idle_timeout = absl::Milliseconds(20);
  EXPECT_EQ(StreamWatchdog::PeriodFor(l), absl::Milliseconds(10));
  l.idle_timeout = absl::Hours(1);
  l.min_upload_rate = 0;
  EXPECT_EQ(StreamWatchdog::PeriodFor(l), absl::Milliseconds(250));
}

}  // namespace
}  // namespace attnserve
