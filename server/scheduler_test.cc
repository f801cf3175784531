#include "server/scheduler.h"

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

// A device whose runs block until released (or cancelled), to hold the queue in a known state.
class GateDevice final : public Device {
 public:
  explicit GateDevice(int index, int64_t estimate = 1000) : index_(index), estimate_(estimate) {}
  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string name() const override { return absl::StrCat("cpu:", index_); }
  std::string uuid() const override { return absl::StrCat("cpu-", index_); }
  std::string model() const override { return "gate"; }
  DeviceStats Stats() const override {
    DeviceStats s;
    s.memory_free_bytes = int64_t{1} << 40;
    return s;
  }
  int64_t EstimateBytes(const AttentionSpec&, const AttentionShape&, DType) const override {
    return estimate_;
  }
  absl::StatusOr<AttentionOutputs> Run(const AttentionSpec&, const HostTensor&, const HostTensor&,
                                       const HostTensor&, const RunControl& control,
                                       RunInfo* info) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++started_;
    cv_.notify_all();
    while (!open_) {
      if (control.cancel != nullptr && control.cancel->load()) {
        return absl::CancelledError("cancelled while running");
      }
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
    info->flops = 10;
    return AttentionOutputs{};
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void WaitStarted(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_ >= n; });
  }

 private:
  const int index_;
  const int64_t estimate_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int started_ = 0;
};

struct Harness {
  explicit Harness(SchedulerOptions options, int64_t estimate = 1000) {
    auto dev = std::make_unique<GateDevice>(0, estimate);
    gate = dev.get();
    std::vector<std::unique_ptr<Device>> devices;
    devices.push_back(std::move(dev));
    pool = *DevicePool::FromDevices(std::move(devices));
    scheduler = *Scheduler::Create(options, pool.get(), nullptr);
  }
  GateDevice* gate;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<Scheduler> scheduler;
};

SchedulerOptions Options(int max_queue, std::optional<int64_t> max_inflight_bytes = std::nullopt) {
  SchedulerOptions o;
  o.max_queue = max_queue;
  o.max_inflight_bytes = max_inflight_bytes;
  return o;
}

std::shared_ptr<Job> MakeJob(std::promise<JobResult>* result) {
  auto job = std::make_shared<Job>();
  job->shape = AttentionShape{1, 1, 1, 1, 1};
  job->done = [result](JobResult r) { result->set_value(std::move(r)); };
  return job;
}

TEST(SchedulerTest, QueueLimit) {
  Harness h(Options(2));
  std::promise<JobResult> r1, r2, r3, r4;
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r1)).ok());
  h.gate->WaitStarted(1);  // job 1 runs, the queue is empty
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r2)).ok());
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r3)).ok());
  EXPECT_EQ(h.scheduler->queue_length(), 2u);
  absl::Status s = h.scheduler->Submit(MakeJob(&r4));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "queue: 2 requests waiting (limit --max-queue=2)");
  h.gate->Open();
  for (auto* r : {&r1, &r2, &r3}) {
    JobResult result = r->get_future().get();
    EXPECT_TRUE(result.status.ok()) << result.status;
    EXPECT_EQ(result.devices, std::vector<std::string>{"cpu:0"});
    EXPECT_EQ(result.placement, v1::PLACEMENT_SINGLE);
    EXPECT_EQ(result.info.flops, 10);
  }
  EXPECT_EQ(h.scheduler->queue_length(), 0u);
}

TEST(SchedulerTest, CancelQueuedAndRunningJobs) {
  Harness h(Options(4));
  std::promise<JobResult> r1, r2;
  auto running = MakeJob(&r1);
  auto queued = MakeJob(&r2);
  ASSERT_TRUE(h.scheduler->Submit(running).ok());
  h.gate->WaitStarted(1);
  ASSERT_TRUE(h.scheduler->Submit(queued).ok());
  queued->cancel.store(true);
  h.scheduler->Cancel(queued.get());
  EXPECT_EQ(r2.get_future().get().status.code(), absl::StatusCode::kCancelled);
  running->cancel.store(true);
  h.scheduler->Cancel(running.get());  // not queued: the run sees the flag
  EXPECT_EQ(r1.get_future().get().status.code(), absl::StatusCode::kCancelled);
}

TEST(SchedulerTest, ExpiredDeadlineIsNotRun) {
  Harness h(Options(4));
  h.gate->Open();
  std::promise<JobResult> r;
  auto job = MakeJob(&r);
  job->deadline = absl::Now() - absl::Seconds(1);
  ASSERT_TRUE(h.scheduler->Submit(job).ok());
  EXPECT_EQ(r.get_future().get().status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(SchedulerTest, RejectsJobsNoDeviceCanHold) {
  Harness h(Options(4, 100), /*estimate=*/1000);
  std::promise<JobResult> r;
  absl::Status s = h.scheduler->Submit(MakeJob(&r));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("device memory"));
}

TEST(SchedulerTest, ShutdownFailsQueuedJobs) {
  Harness h(Options(4));
  std::promise<JobResult> r1, r2;
  auto running = MakeJob(&r1);
  ASSERT_TRUE(h.scheduler->Submit(running).ok());
  h.gate->WaitStarted(1);
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r2)).ok());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    h.gate->Open();
  });
  h.scheduler->Shutdown();
  opener.join();
  EXPECT_EQ(r2.get_future().get().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(r1.get_future().get().status.ok());
  std::promise<JobResult> r3;
  EXPECT_EQ(h.scheduler->Submit(MakeJob(&r3)).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace attnserve
