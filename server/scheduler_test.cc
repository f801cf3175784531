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
// With `lanes` > 1 the scheduler may run that many at once; `free_bytes` is its free memory.
class GateDevice final : public Device {
 public:
  explicit GateDevice(int index, int64_t estimate = 1000, int lanes = 1,
                      int64_t free_bytes = int64_t{1} << 40)
      : index_(index), estimate_(estimate), lanes_(lanes), free_bytes_(free_bytes) {}
  int lanes() const override { return lanes_; }
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
    s.memory_free_bytes = free_bytes_;
    return s;
  }
  HostMemory& host_memory() override { return host_memory_; }
  int64_t EstimateBytes(const AttentionSpec&, const AttentionShape&, DType) const override {
    return estimate_;
  }
  absl::StatusOr<AttentionOutputs> Run(const AttentionSpec&, const HostTensor& q,
                                       const HostTensor&, const HostTensor&,
                                       const RunControl& control, RunInfo* info) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++started_;
    ++running_;
    max_running_ = std::max(max_running_, running_);
    cv_.notify_all();
    struct Leave {
      GateDevice* d;
      ~Leave() {
        --d->running_;
        ++d->finished_;
        d->cv_.notify_all();
      }
    } leave{this};
    while (!open_ && tokens_ == 0) {
      if (control.cancel != nullptr && control.cancel->load()) {
        return absl::CancelledError("cancelled while running");
      }
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
    if (!open_) --tokens_;
    info->flops = 10;
    AttentionOutputs out;
    if (q.dims().size() == 4) {  // shaped outputs (zeros), so a data-parallel run can scatter them
      out.o = *HostTensor::Create(q.dtype(), q.dims());
      out.lse = *HostTensor::Create(DType::kF32, {q.dims()[0], q.dims()[2], q.dims()[1]});
    }
    return out;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Lets `n` runs (running or later) finish.
  void Release(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_ += n;
    cv_.notify_all();
  }
  void WaitStarted(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_ >= n; });
  }
  void WaitFinished(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= n; });
  }
  int started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  int finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }
  int max_running() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_running_;
  }

 private:
  const int index_;
  const int64_t estimate_;
  const int lanes_;
  const int64_t free_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int tokens_ = 0;
  int started_ = 0;
  int running_ = 0;
  int finished_ = 0;
  int max_running_ = 0;
  PlainHostMemory host_memory_;
};

struct Harness {
  explicit Harness(SchedulerOptions options, int64_t estimate = 1000, int lanes = 1,
                   int64_t free_bytes = int64_t{1} << 40) {
    auto dev = std::make_unique<GateDevice>(0, estimate, lanes, free_bytes);
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

// ---- lanes: several runs on one device at once --------------------------------------------------

// Waits (bounded) until `pred` holds; false if it never did.
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// Gives a scheduler time to (wrongly) start something.
void Settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

TEST(SchedulerLanesTest, TwoSingleJobsRunConcurrentlyAndAThirdWaits) {
  Harness h(Options(8), /*estimate=*/1000, /*lanes=*/2);
  std::promise<JobResult> r1, r2, r3;
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r1)).ok());
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r2)).ok());
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r3)).ok());
  // Both lanes run before either run may finish (the gate is shut): they are concurrent.
  h.gate->WaitStarted(2);
  EXPECT_EQ(h.gate->finished(), 0);
  EXPECT_EQ(h.scheduler->running(), 2u);
  Settle();
  EXPECT_EQ(h.gate->started(), 2);  // the third waits for a lane
  EXPECT_EQ(h.scheduler->queue_length(), 1u);
  h.gate->Release(1);
  h.gate->WaitStarted(3);  // a lane came free: the third starts
  EXPECT_EQ(h.gate->finished(), 1);
  h.gate->Open();
  for (auto* r : {&r1, &r2, &r3}) {
    JobResult result = r->get_future().get();
    EXPECT_TRUE(result.status.ok()) << result.status;
    EXPECT_EQ(result.devices, std::vector<std::string>{"cpu:0"});
  }
  EXPECT_EQ(h.gate->max_running(), 2);
  EXPECT_TRUE(Eventually([&] { return h.scheduler->running() == 0; }));
}

TEST(SchedulerLanesTest, MemoryAdmissionCountsRunningJobs) {
  // 100 bytes free and 60-byte jobs: the second waits although a lane is free, as the first may
  // still allocate its 60 (two concurrent 40 GB requests must not share an 80 GB card).
  for (bool inflight_cap : {false, true}) {
    SCOPED_TRACE(inflight_cap ? "--max-inflight-bytes" : "free memory");
    Harness h(inflight_cap ? Options(8, 100) : Options(8), /*estimate=*/60, /*lanes=*/2,
              /*free_bytes=*/inflight_cap ? int64_t{1} << 40 : 100);
    std::promise<JobResult> r1, r2;
    ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r1)).ok());
    ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r2)).ok());
    h.gate->WaitStarted(1);
    Settle();
    EXPECT_EQ(h.gate->started(), 1);
    EXPECT_EQ(h.scheduler->queue_length(), 1u);
    h.gate->Release(1);
    h.gate->WaitStarted(2);  // the first is done: the second fits now
    h.gate->Open();
    EXPECT_TRUE(r1.get_future().get().status.ok());
    EXPECT_TRUE(r2.get_future().get().status.ok());
    EXPECT_EQ(h.gate->max_running(), 1);
  }
  // Room for both: they run together.
  Harness h(Options(8, 120), /*estimate=*/60, /*lanes=*/2);
  std::promise<JobResult> r1, r2;
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r1)).ok());
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r2)).ok());
  h.gate->WaitStarted(2);
  h.gate->Open();
  EXPECT_TRUE(r1.get_future().get().status.ok());
  EXPECT_TRUE(r2.get_future().get().status.ok());
}

TEST(SchedulerLanesTest, CancelAndShutdownWithLanes) {
  Harness h(Options(8), /*estimate=*/1000, /*lanes=*/2);
  std::promise<JobResult> r1, r2, r3, r4;
  auto running1 = MakeJob(&r1);
  auto running2 = MakeJob(&r2);
  auto queued = MakeJob(&r3);
  ASSERT_TRUE(h.scheduler->Submit(running1).ok());
  ASSERT_TRUE(h.scheduler->Submit(running2).ok());
  h.gate->WaitStarted(2);
  ASSERT_TRUE(h.scheduler->Submit(queued).ok());
  queued->cancel.store(true);
  h.scheduler->Cancel(queued.get());
  EXPECT_EQ(r3.get_future().get().status.code(), absl::StatusCode::kCancelled);
  running1->cancel.store(true);  // one lane's run stops; the other lane keeps running
  h.scheduler->Cancel(running1.get());
  EXPECT_EQ(r1.get_future().get().status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r4)).ok());  // takes the freed lane
  h.gate->WaitStarted(3);
  EXPECT_EQ(h.scheduler->running(), 2u);
  std::promise<JobResult> r5;
  ASSERT_TRUE(h.scheduler->Submit(MakeJob(&r5)).ok());  // queued: both lanes busy
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    h.gate->Open();
  });
  h.scheduler->Shutdown();  // joins every lane worker once their runs end
  opener.join();
  EXPECT_EQ(r5.get_future().get().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(r2.get_future().get().status.ok());
  EXPECT_TRUE(r4.get_future().get().status.ok());
  EXPECT_EQ(h.scheduler->running(), 0u);
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

// Two gate devices of two lanes each, placed by the multi-device planner.
struct LaneHarness {
  LaneHarness() {
    std::vector<std::unique_ptr<Device>> devices;
    for (int i = 0; i < 2; ++i) {
      auto dev = std::make_unique<GateDevice>(i, 1000, /*lanes=*/2);
      gates.push_back(dev.get());
      devices.push_back(std::move(dev));
    }
    pool = *DevicePool::FromDevices(std::move(devices));
    scheduler = *Scheduler::Create(Options(64), pool.get(), nullptr, MakeMultiDevicePlanner());
  }
  std::vector<GateDevice*> gates;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<Scheduler> scheduler;
};

TEST(SchedulerLanesTest, MultiDeviceJobTakesEveryLaneAndIsNotOvertaken) {
  LaneHarness h;
  std::promise<JobResult> r1, rdp, r3, r4, r5;
  ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r1, PlacementHint::kSingle, false)).ok());
  h.gates[0]->WaitStarted(1);  // the least loaded device: cpu:0 (both idle)
  auto dp_job = MakeAttentionJob(&rdp, PlacementHint::kDataParallel, false);
  ASSERT_TRUE(h.scheduler->Submit(dp_job).ok());
  // Singles behind it: free lanes exist (one on cpu:0, two on cpu:1), but none may start before
  // the data-parallel job, which waits for every lane of both devices.
  ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r3, PlacementHint::kSingle, false)).ok());
  ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r4, PlacementHint::kSingle, false)).ok());
  Settle();
  EXPECT_EQ(h.gates[0]->started(), 1);
  EXPECT_EQ(h.gates[1]->started(), 0);
  EXPECT_EQ(h.scheduler->queue_length(), 3u);
  // The single finishes: the data-parallel job takes both devices whole (one part each).
  h.gates[0]->Release(1);
  h.gates[0]->WaitStarted(2);
  h.gates[1]->WaitStarted(1);
  Settle();
  EXPECT_EQ(h.gates[0]->started(), 2);  // the singles still wait: every lane is reserved
  EXPECT_EQ(h.gates[1]->started(), 1);
  EXPECT_EQ(h.scheduler->queue_length(), 2u);
  EXPECT_EQ(h.scheduler->running(), 2u);
  for (GateDevice* g : h.gates) g->Release(1);
  JobResult dp = rdp.get_future().get();
  ASSERT_TRUE(dp.status.ok()) << dp.status;
  EXPECT_EQ(dp.placement, Placement::kDataParallel);
  EXPECT_EQ(dp.devices, (std::vector<std::string>{"cpu:0", "cpu:1"}));
  // Then the two singles run at once, one per device (least loaded first) or on two lanes.
  EXPECT_TRUE(Eventually([&] { return h.gates[0]->started() + h.gates[1]->started() == 5; }));
  ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r5, PlacementHint::kSingle, false)).ok());
  for (GateDevice* g : h.gates) g->Open();
  for (auto* r : {&r1, &r3, &r4, &r5}) {
    JobResult result = r->get_future().get();
    EXPECT_TRUE(result.status.ok()) << result.status;
    EXPECT_EQ(result.placement, Placement::kSingle);
  }
  EXPECT_TRUE(Eventually([&] { return h.scheduler->running() == 0; }));
}

// A context split 32 + 32 rows over cpu:0 and cpu:1, attended with two query rows.
std::shared_ptr<Job> MakeShardedJob(std::promise<JobResult>* result) {
  auto job = std::make_shared<Job>();
  job->shape = AttentionShape{1, 2, 4, 2, 16, 64};
  job->dtype = DType::kF32;
  job->q = Filled({1, 2, 4, 16}, 7);
  for (size_t d = 0; d < 2; ++d) {
    KeyShard s;
    s.device = d;
    s.start = 32 * static_cast<int64_t>(d);
    s.rows = 32;
    s.k = Filled({1, 32, 2, 16}, 8 + d);
    s.v = Filled({1, 32, 2, 16}, 10 + d);
    job->key_shards.push_back(std::move(s));
  }
  job->done = [result](JobResult r) { result->set_value(std::move(r)); };
  return job;
}

// A context-parallel job holds one lane of each of its devices, so two run at once, and when one
// ends it frees exactly its own lanes: the other's stay reserved until it ends.
TEST(SchedulerLanesTest, ContextParallelJobsTakeOneLaneOfEachDevice) {
  LaneHarness h;
  std::promise<JobResult> ra, rb, rs[3];
  auto a = MakeShardedJob(&ra);
  ASSERT_TRUE(h.scheduler->Submit(a).ok());
  for (GateDevice* g : h.gates) g->WaitStarted(1);
  ASSERT_TRUE(h.scheduler->Submit(MakeShardedJob(&rb)).ok());
  for (GateDevice* g : h.gates) g->WaitStarted(2);  // beside the first: both lanes of each busy
  EXPECT_EQ(h.scheduler->running(), 4u);
  for (auto& r : rs) {
    ASSERT_TRUE(h.scheduler->Submit(MakeAttentionJob(&r, PlacementHint::kSingle, false)).ok());
  }
  Settle();
  EXPECT_EQ(h.gates[0]->started() + h.gates[1]->started(), 4);
  // The first ends (cancelled while running): its two lanes, and only those, come free, so two
  // of the three singles start while the second context-parallel job keeps its lanes.
  a->cancel.store(true);
  EXPECT_EQ(ra.get_future().get().status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(Eventually([&] { return h.gates[0]->started() + h.gates[1]->started() == 6; }));
  Settle();
  EXPECT_EQ(h.gates[0]->started() + h.gates[1]->started(), 6);
  EXPECT_EQ(h.scheduler->queue_length(), 1u);
  EXPECT_EQ(h.scheduler->running(), 4u);
  for (GateDevice* g : h.gates) g->Open();
  JobResult b = rb.get_future().get();
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(b.placement, Placement::kContextParallel);
  EXPECT_EQ(b.devices, (std::vector<std::string>{"cpu:0", "cpu:1"}));
  for (auto& r : rs) EXPECT_TRUE(r.get_future().get().status.ok());
  for (GateDevice* g : h.gates) EXPECT_LE(g->max_running(), 2);
  EXPECT_TRUE(Eventually([&] { return h.scheduler->running() == 0; }));
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
    if (hints[i % 4] != PlacementHint::kAuto) {
      EXPECT_EQ(r.placement, placements[i % 4]) << i;
    }
  }
  EXPECT_EQ(h.scheduler->queue_length(), 0u);
}

}  // namespace
}  // namespace attnserve
