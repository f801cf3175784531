#include "server/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/cpu/cpu_device.h"

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
  bool HeadDimSupported(int64_t) const override { return true; }
  absl::Status RunTask(int64_t, const DeviceTask&) override {
    return absl::UnimplementedError("gate device: no tasks");
  }
  DeviceStats Stats() const override {
    DeviceStats s;
    s.memory_free_bytes = int64_t{1} << 40;
    return s;
  }
  HostMemory& host_memory() override { return host_memory_; }
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
  PlainHostMemory host_memory_;
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
    EXPECT_EQ(result.placement, Placement::kSingle);
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

// ---- multi-device placement (MakeMultiDevicePlanner) on real CPU devices ----------------------

struct CpuHarness {
  explicit CpuHarness(int n) {
    std::vector<std::unique_ptr<Device>> devices;
    for (int i = 0; i < n; ++i) devices.push_back(MakeCpuDevice(i, 1));
    pool = *DevicePool::FromDevices(std::move(devices));
    scheduler = *Scheduler::Create(Options(64), pool.get(), nullptr, MakeMultiDevicePlanner());
  }
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<Scheduler> scheduler;
};

HostTensor Filled(std::vector<int64_t> dims, uint32_t seed) {
  HostTensor t = *HostTensor::Create(DType::kF32, std::move(dims));
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.data_as<float>()[i] = static_cast<float>(x >> 8) / static_cast<float>(1 << 24) - 0.5f;
  }
  return t;
}

std::shared_ptr<Job> MakeAttentionJob(std::promise<JobResult>* result, PlacementHint hint,
                                      bool causal) {
  auto job = std::make_shared<Job>();
  job->shape = AttentionShape{2, 101, 4, 2, 16};
  job->dtype = DType::kF32;
  job->spec.causal = causal;
  job->placement_hint = hint;
  job->q = Filled({2, 101, 4, 16}, 1);
  job->k = Filled({2, 101, 2, 16}, 2);
  job->v = Filled({2, 101, 2, 16}, 3);
  job->done = [result](JobResult r) { result->set_value(std::move(r)); };
  return job;
}

double MaxAbsDiff(const HostTensor& a, const HostTensor& b) {
  if (a.dims() != b.dims()) return 1e30;
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a.data_as<float>()[i] - b.data_as<float>()[i])));
  }
  return d;
}

TEST(MultiDeviceSchedulerTest, RingAndDataParallelMatchSingle) {
  CpuHarness h(3);
  for (bool causal : {false, true}) {
    std::promise<JobResult> rs, rr, rd;
    ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&rs, PlacementHint::kSingle, causal)).ok());
    JobResult single = rs.get_future().get();
    ASSERT_TRUE(single.status.ok()) << single.status;
    EXPECT_EQ(single.placement, Placement::kSingle);
    ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&rr, PlacementHint::kRing, causal)).ok());
    ASSERT_TRUE(
        h.scheduler->Submit(MakeAttentionJob(&rd, PlacementHint::kDataParallel, causal)).ok());
    JobResult ring = rr.get_future().get();
    JobResult dp = rd.get_future().get();
    ASSERT_TRUE(ring.status.ok()) << ring.status;
    ASSERT_TRUE(dp.status.ok()) << dp.status;
    EXPECT_EQ(ring.placement, Placement::kRing);
    EXPECT_EQ(ring.devices.size(), 3u);
    EXPECT_EQ(dp.placement, Placement::kDataParallel);
    EXPECT_EQ(dp.devices.size(), 3u);  // 4 batch x kv-head units over 3 devices
    EXPECT_LE(MaxAbsDiff(ring.outputs.o, single.outputs.o), 1e-5);
    EXPECT_LE(MaxAbsDiff(ring.outputs.lse, single.outputs.lse), 1e-5);
    EXPECT_LE(MaxAbsDiff(dp.outputs.o, single.outputs.o), 1e-6);
    EXPECT_LE(MaxAbsDiff(dp.outputs.lse, single.outputs.lse), 1e-6);
    EXPECT_NEAR(ring.info.flops, single.info.flops, 1e-6 * single.info.flops);
  }
  EXPECT_EQ(h.scheduler->running(), 0u);
  for (size_t i = 0; i < h.pool->size(); ++i) {
    EXPECT_EQ(h.pool->device(i).Stats().memory_used_bytes, 0) << i;
  }
}

TEST(MultiDeviceSchedulerTest, CancelledRingFailsAndReleasesTheGroup) {
  CpuHarness h(2);
  std::promise<JobResult> r1, r2;
  auto cancelled = MakeAttentionJob(&r1, PlacementHint::kRing, false);
  cancelled->cancel.store(true);
  ASSERT_TRUE(h.scheduler->Submit(cancelled).ok());
  EXPECT_EQ(r1.get_future().get().status.code(), absl::StatusCode::kCancelled);
  // Both devices are free again: the next ring runs.
  ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r2, PlacementHint::kRing, true)).ok());
  JobResult ok = r2.get_future().get();
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.devices.size(), 2u);
}

TEST(MultiDeviceSchedulerTest, OneDeviceIsAlwaysSingle) {
  CpuHarness h(1);
  for (PlacementHint hint :
       {PlacementHint::kRing, PlacementHint::kDataParallel, PlacementHint::kAuto}) {
    std::promise<JobResult> r;
    ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r, hint, false)).ok());
    JobResult result = r.get_future().get();
    EXPECT_TRUE(result.status.ok()) << result.status;
    EXPECT_EQ(result.placement, Placement::kSingle);
    EXPECT_EQ(result.devices, std::vector<std::string>{"cpu:0"});
  }
}

TEST(MultiDeviceSchedulerTest, ImpossibleHintIsRejected) {
  CpuHarness h(2);
  std::promise<JobResult> r;
  auto job = MakeAttentionJob(&r, PlacementHint::kDataParallel, false);
  job->shape = AttentionShape{1, 101, 4, 1, 16};  // one batch x kv-head unit
  job->k = Filled({1, 101, 1, 16}, 2);
  job->v = Filled({1, 101, 1, 16}, 3);
  job->q = Filled({1, 101, 4, 16}, 1);
  absl::Status s = h.scheduler->Submit(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("data_parallel"));
}

TEST(MultiDeviceSchedulerTest, MixedPlacementsConcurrently) {
  CpuHarness h(3);
  std::promise<JobResult> reference;
  ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&reference, PlacementHint::kSingle, true)).ok());
  const JobResult single = reference.get_future().get();
  ASSERT_TRUE(single.status.ok()) << single.status;
  const PlacementHint hints[] = {PlacementHint::kRing, PlacementHint::kSingle,
                                 PlacementHint::kDataParallel, PlacementHint::kAuto};
  const Placement placements[] = {Placement::kRing, Placement::kSingle, Placement::kDataParallel,
                                  Placement::kSingle};
  std::vector<std::promise<JobResult>> results(16);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&results[i], hints[i % 4], true)).ok());
  }
  for (size_t i = 0; i < results.size(); ++i) {
    JobResult r = results[i].get_future().get();
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_LE(MaxAbsDiff(r.outputs.o, single.outputs.o), 1e-5) << i;
    if (hints[i % 4] != PlacementHint::kAuto) EXPECT_EQ(r.placement, placements[i % 4]) << i;
  }
  EXPECT_EQ(h.scheduler->queue_length(), 0u);
}

}  // namespace
}  // namespace attnserve
