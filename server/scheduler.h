// Scheduler: a bounded FIFO of complete requests, admitted to devices by their memory estimate,
// run by one worker thread per device. The placement decision is the PlacementPlanner's: a single
// device (MakeSingleDevicePlanner), or core/dist's PlanPlacement (MakeMultiDevicePlanner), which
// may name several devices (data parallel, ring): the scheduler reserves them together and each
// of their workers runs its own rank or share of the job on its own device (see GroupRun in
// scheduler.cc and server/README.md "Placement").
//
// GPU rings: every rank of a RingCudaRun runs on the worker of its own GPU (RunCudaDeviceTask:
// that device's allocator and stream, so its memory, tokens and busy seconds are its own), over
// the NCCL communicator that worker cached for the ring's ordered device set. The set's NcclGroup
// (unique id + generation) is the scheduler's (RingGroupRegistry); the communicators are the
// workers' (WorkerComms, on each worker's stack: created, reused and destroyed on its thread). A
// run that fails, is cancelled or times out aborts the group; the next ring over the set gets a
// new generation and every worker rebuilds its communicator.
#ifndef ATTNSERVE_SERVER_SCHEDULER_H_
#define ATTNSERVE_SERVER_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attnserve/v1/attnserve.pb.h"
#include "core/engine/device.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"
#include "server/device_pool.h"
#include "server/metrics.h"

namespace attnserve {

struct GroupRun;           // scheduler.cc
struct WorkerComms;        // scheduler.cc: one worker's cached NCCL communicators
class RingGroupRegistry;   // scheduler.cc: the shared NCCL group of each GPU device set

// What the scheduler reports back for one job.
struct JobResult {
  absl::Status status;
  AttentionOutputs outputs;  // valid when status is OK
  RunInfo info;
  double queue_seconds = 0;  // from Submit to the start on a device
  v1::Placement placement = v1::PLACEMENT_SINGLE;
  std::vector<std::string> devices;  // names of the devices that ran it
};

// One complete request. Built by the RPC side, shared with the scheduler until `done` has run.
struct Job {
  std::string id;
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype = DType::kF32;
  v1::Placement placement_hint = v1::PLACEMENT_AUTO;
  HostTensor q, k, v;  // released by the worker as soon as the run ends
  absl::Time deadline = absl::InfiniteFuture();
  // Set by the RPC side (client cancel, deadline); polled by the run.
  std::atomic<bool> cancel{false};
  // Called exactly once, on a scheduler or worker thread (never under a scheduler lock), unless
  // Submit returned an error. Must not block for long.
  std::function<void(JobResult)> done;
};

// A device as the planner sees it at one moment.
struct DeviceLoad {
  size_t index = 0;
  const Device* device = nullptr;
  bool busy = false;
  int64_t estimate_bytes = 0;     // the job's Device::EstimateBytes on this device
  int64_t budget_bytes = 0;       // what the job may use there now
  int64_t idle_budget_bytes = 0;  // what it could use once the device is idle
  int64_t used_bytes = 0;         // DeviceStats::memory_used_bytes
};

struct PlacementDecision {
  v1::Placement placement = v1::PLACEMENT_SINGLE;
  std::vector<size_t> devices;  // indices into the pool
};

class PlacementPlanner {
 public:
  virtual ~PlacementPlanner() = default;
  // A placement for `job` on devices that are free now, or nullopt to wait.
  virtual std::optional<PlacementDecision> Place(const Job& job,
                                                 absl::Span<const DeviceLoad> loads) = 0;
  // OK when some placement could run `job` once the devices are idle; otherwise the error to
  // fail it with right away (RESOURCE_EXHAUSTED "device memory: ...").
  virtual absl::Status Feasible(const Job& job, absl::Span<const DeviceLoad> loads) = 0;
};

// One device: the idle device whose estimate fits its budget, least used memory first.
std::unique_ptr<PlacementPlanner> MakeSingleDevicePlanner();

// core/dist PlanPlacement (planner.h) over the pool, with the header's hint: single (then run on
// the idle device that fits, as MakeSingleDevicePlanner), data parallel or ring over the plan's
// devices, which are started together once all of them are idle and their budgets fit the plan's
// per-device bytes. Plans as if every device were idle (idle budgets, headroom 1: the budgets are
// already what a request may use). With one device every request is single, whatever the hint.
std::unique_ptr<PlacementPlanner> MakeMultiDevicePlanner();

struct SchedulerOptions {
  int max_queue = 64;  // requests waiting for a device; more -> RESOURCE_EXHAUSTED
  // Bytes one device may hold for a running request; nullopt: the device's free memory.
  std::optional<int64_t> max_inflight_bytes;
};

class Scheduler {
 public:
  // `pool` and `metrics` (may be null) must outlive the scheduler. Starts one worker per device.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerOptions& options, DevicePool* pool, Metrics* metrics,
      std::unique_ptr<PlacementPlanner> planner = MakeSingleDevicePlanner());
  ~Scheduler();  // Shutdown()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a complete job. UNAVAILABLE after Shutdown; RESOURCE_EXHAUSTED when the queue is full
  // or no device could ever hold it. On OK, job->done will be called exactly once.
  absl::Status Submit(std::shared_ptr<Job> job);
  // Drops a queued job (done is called with CANCELLED, or DEADLINE_EXCEEDED past its deadline);
  // a running job stops at its next cancel poll because the caller has set job->cancel.
  void Cancel(const Job* job);
  // Fails queued jobs with UNAVAILABLE, lets running ones finish, joins the workers. Idempotent.
  void Shutdown();

  size_t queue_length() const;
  size_t running() const;

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<Job> job;   // assigned, not yet finished
    std::vector<size_t> group;  // every device of the job's placement (this one included)
    v1::Placement placement = v1::PLACEMENT_SINGLE;
    absl::Time submitted;
    bool busy = false;
    // Multi-device placements: the run shared by every worker of the group; each worker runs its
    // own rank / share on its own device, the last one to finish assembles and reports.
    std::shared_ptr<GroupRun> group_run;
  };
  struct Queued {
    std::shared_ptr<Job> job;
    absl::Time submitted;
  };

  Scheduler(const SchedulerOptions& options, DevicePool* pool, Metrics* metrics,
            std::unique_ptr<PlacementPlanner> planner);
  std::vector<DeviceLoad> LoadsLocked(const Job& job) const;
  // Starts queued jobs while the head fits somewhere. Caller holds mu_.
  void DispatchLocked();
  void WorkerLoop(size_t index);
  // One worker's part of a multi-device run (on that worker's thread), then, for the last part
  // to finish, the result, the metrics and the release of the group's devices. `comms`: the
  // worker's communicator cache (lives on the worker's stack, so it is destroyed on its thread).
  void RunGroupPart(size_t index, const std::shared_ptr<GroupRun>& run, WorkerComms& comms);
  void FinishGroup(GroupRun& run);
  // GPU ring: the shared set-up (RingCudaRun, per-device admission, the NCCL group of the device
  // set) and one rank on worker `index` (its device, allocator, stream and cached communicator).
  absl::Status SetUpCudaRing(GroupRun& run);
  absl::Status RunCudaRingRank(GroupRun& run, int rank, size_t index, WorkerComms& comms);
  // What a request holding device `index` may use there (--max-inflight-bytes, else its free
  // bytes plus what its allocator holds): a GPU ring's per-rank admission.
  int64_t IdleBudget(size_t index) const;

  const SchedulerOptions options_;
  DevicePool* const pool_;
  Metrics* const metrics_;
  const std::unique_ptr<PlacementPlanner> planner_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  std::vector<Worker> workers_;
  // GPU rings: one NCCL group (unique id + generation) per ordered device set, shared by the
  // workers of that set; has its own mutex (taken on worker threads, never under mu_).
  std::shared_ptr<RingGroupRegistry> ring_groups_;
  bool stopping_ = false;
  bool joined_ = false;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_SCHEDULER_H_
