// Scheduler: a bounded FIFO of complete requests, admitted to devices by their memory estimate and
// dispatched to the devices' lane workers: Device::lanes() worker threads per device, each running
// one job's part at a time. It queues, admits and dispatches; what runs on the devices is
// core/parallel's: a PlacementPlanner (placement_policy.h) picks the devices, a GroupRun
// (group_run.h) runs one rank per reserved device (a single device is a group of one), and the
// last worker to finish reports. A single-device job takes one lane of its device; a multi-device
// job (data parallel, ring) takes every lane of each of its devices and runs on their lane-0
// workers (which own the NCCL communicators), except a context-parallel one, which needs no NCCL
// and takes one lane of each device (Device::RunLaneTask), so decode steps against a sharded
// context overlap as single-device requests do. Admission counts the estimates of the jobs already
// running on a device. The scheduler speaks core types only; the RPC side converts at its edge
// (wire/).
#ifndef ATTNSERVE_SERVER_SCHEDULER_H_
#define ATTNSERVE_SERVER_SCHEDULER_H_

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
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/cuda/cuda_options.h"
#include "core/engine/types.h"
#include "core/parallel/gpu_ring.h"
#include "core/parallel/placement_policy.h"
#include "server/device_pool.h"
#include "server/metrics.h"

namespace attnserve {

class GroupRun;  // core/parallel/group_run.h

// What the scheduler reports back for one job.
struct JobResult {
  absl::Status status;
  AttentionOutputs outputs;  // valid when status is OK
  RunInfo info;
  double queue_seconds = 0;  // from Submit to the start on a device
  Placement placement = Placement::kSingle;
  std::vector<std::string> devices;  // names of the devices that ran it
};

// One complete request. Built by the RPC side, shared with the scheduler until `done` has run.
struct Job : AttentionRequest {
  std::string id;
  // Called exactly once, on a scheduler or worker thread (never under a scheduler lock), unless
  // Submit returned an error. Must not block for long.
  std::function<void(JobResult)> done;
};

struct SchedulerOptions {
  int max_queue = 64;  // requests waiting for a device; more -> RESOURCE_EXHAUSTED
  // Bytes one device may hold for its running requests together (a device with several lanes
  // admits a request only if the estimates of those already running there leave room for it);
  // nullopt: the device's free memory (less what the running requests may still allocate).
  std::optional<int64_t> max_inflight_bytes;
  // The CUDA choices multi-GPU runs use (the same the pool's devices were made with).
  CudaOptions cuda;
};

class Scheduler {
 public:
  // `pool` and `metrics` (may be null) must outlive the scheduler. Starts lanes() workers per
  // device.
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
  // Fails queued jobs with UNAVAILABLE, lets running ones finish, joins every lane worker.
  // Idempotent.
  void Shutdown();

  size_t queue_length() const;
  size_t running() const;  // parts of jobs running now (one per lane worker that runs one)

 private:
  // One lane worker of a device. `run` is set while it has a part of a job to run.
  struct Worker {
    std::thread thread;
    size_t device = 0;
    int lane = 0;
    // Which reservation holds it (ReserveLocked's id; 0: free): a job's, until the whole group
    // has finished.
    uint64_t reservation = 0;
    bool busy() const { return reservation != 0; }
    int64_t reserved_bytes = 0;  // the estimate of the single-device job holding it (admission)
    std::shared_ptr<GroupRun> run;
    std::shared_ptr<Job> job;
    std::vector<size_t> group;  // every device of the job's placement, in rank order
    int rank = 0;
    absl::Time submitted;
  };
  struct Queued {
    std::shared_ptr<Job> job;
    absl::Time submitted;
  };

  Scheduler(const SchedulerOptions& options, DevicePool* pool, Metrics* metrics,
            std::unique_ptr<PlacementPlanner> planner);
  std::vector<DeviceLoad> LoadsLocked(const Job& job) const;
  // Device `d`'s lane workers: workers_[first_worker_[d], first_worker_[d + 1]).
  size_t FirstWorker(size_t d) const { return first_worker_[d]; }
  size_t EndWorker(size_t d) const { return first_worker_[d + 1]; }
  size_t FreeLanesLocked(size_t d) const;
  int64_t ReservedBytesLocked(size_t d) const;
  // Reserves the lanes of a placement and hands out its parts: one free lane of each device (a
  // single device's estimate counted there), or with `every_lane` every lane of each device of
  // the group, the part to lane 0.
  void ReserveLocked(const std::shared_ptr<GroupRun>& run, const std::shared_ptr<Job>& job,
                     const std::vector<size_t>& group, bool every_lane, int64_t estimate,
                     absl::Time submitted);
  // Frees exactly the lanes that reservation `id` holds on the devices of `group`.
  void ReleaseLocked(uint64_t id, const std::vector<size_t>& group);
  // Starts queued jobs while the head fits somewhere. Caller holds mu_.
  void DispatchLocked();
  void WorkerLoop(size_t index);
  // The last part of a run has returned: report, record the metrics, release the devices.
  void Finish(GroupRun& run, std::shared_ptr<Job> job, const std::vector<size_t>& group,
              absl::Time submitted);
  // What a request holding device `index` may use there (--max-inflight-bytes, else its free
  // bytes plus what its allocator holds): a GPU ring's per-rank admission.
  int64_t IdleBudget(size_t index) const;

  const SchedulerOptions options_;
  DevicePool* const pool_;
  Metrics* const metrics_;
  const std::unique_ptr<PlacementPlanner> planner_;
  // GPU rings: the NCCL group of each device set, shared by the workers (its own lock).
  const std::unique_ptr<NcclGroups, NcclGroupsDeleter> nccl_groups_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  const std::vector<size_t> first_worker_;  // per device, then the total (see FirstWorker)
  std::vector<Worker> workers_;
  uint64_t last_reservation_ = 0;
  bool stopping_ = false;
  bool joined_ = false;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_SCHEDULER_H_
