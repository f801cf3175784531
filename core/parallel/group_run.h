// GroupRun: one request run by the workers of one or more devices. The scheduler (server/) reserves
// the devices a placement names, then each of their worker threads calls RunPart for its own rank
// on its own device; the last one to finish calls Finish, which assembles the result. What each
// rank does is a GroupStrategy:
//
//   single          one device runs the whole request (Device::Run)
//   data parallel   batch x KV-head units split over the devices (data_parallel.h), no traffic
//   CPU ring        the sequence split over CPU devices, in-process communicators (ring.h)
//   GPU ring        the sequence split over GPUs, NCCL (gpu_ring.h; only in CUDA + NCCL builds),
//                   which may turn into the dilated composition (dilated_ring_cuda.h) or, when
//                   the ring cannot split the spec and the caller did not insist, a single-device
//                   fallback on rank 0
//   context parallel  the keys split by sequence over the devices that hold them (a sharded
//                   context): each attends Q to its rows, the partials merge by LSE
//                   (context_parallel.h)
//
// Only a device's worker thread touches that device: every rank runs through Device::Run or
// Device::RunTask on its own worker, with that device's memory accounting and stream.
#ifndef ATTNSERVE_CORE_PARALLEL_GROUP_RUN_H_
#define ATTNSERVE_CORE_PARALLEL_GROUP_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/cuda/cuda_options.h"
#include "core/engine/device.h"
#include "core/engine/types.h"

namespace attnserve {

class WorkerComms;  // gpu_ring.h: one worker's cached NCCL communicators
class NcclGroups;   // gpu_ring.h: the NCCL group of each GPU device set, shared by the workers

// Per-rank figures of a run, for the metrics of that rank's device.
struct RankFigures {
  double busy_seconds = 0;
  double tokens = 0;  // B * tokens this rank processed (0 when the run failed)
  double flops = 0;
  int64_t bytes_sent = 0;  // communicator bytes
  int64_t bytes_received = 0;
};

struct GroupResult {
  absl::Status status;
  AttentionOutputs outputs;  // valid when status is OK
  RunInfo info;
  Placement placement = Placement::kSingle;  // what actually ran (a fallback says single)
  std::vector<int> ranks_used;               // ranks whose devices ran it, in rank order
  std::vector<RankFigures> ranks;            // one per rank of the group
};

// What a group run needs from its surroundings (the scheduler).
struct GroupEnv {
  // What device `rank` may use now that it is reserved for this request (admission of a GPU
  // ring's ranks, whose schedule is chosen to fit).
  std::function<int64_t(int rank)> budget_bytes;
  // The CUDA engine and kernel choices GPU rings run with (the devices' own).
  CudaOptions cuda;
  // The NCCL groups of GPU device sets (null without the GPU ring).
  NcclGroups* nccl_groups = nullptr;
  // Events for the metrics; may be empty.
  std::function<void()> on_nccl_group_created;
  std::function<void(int rank)> on_nccl_comm_created;
};

// What one rank does; see the file comment for the kinds.
class GroupStrategy {
 public:
  virtual ~GroupStrategy() = default;
  // Once per run, by the first worker to arrive, before any rank runs.
  virtual absl::Status SetUp() { return absl::OkStatus(); }
  // Rank `rank`'s part on the calling thread (the worker of `device`). `comms` is that worker's.
  virtual absl::Status RunRank(int rank, Device& device, WorkerComms* comms,
                               RankFigures& figures) = 0;
  // A rank failed: release the peers waiting on it (communicators, NCCL groups).
  virtual void Abort(const absl::Status& status) { (void)status; }
  // After every rank returned OK: the outputs and the run's figures into `result`.
  virtual absl::Status Collect(GroupResult& result) = 0;
};

class GroupRun {
 public:
  // The run shares ownership of `request`; `devices` are the group's devices in rank order (pool
  // order). The strategy is chosen from `placement` and the devices' backend.
  GroupRun(Placement placement, std::shared_ptr<AttentionRequest> request,
           std::vector<Device*> devices, GroupEnv env);
  ~GroupRun();
  GroupRun(const GroupRun&) = delete;
  GroupRun& operator=(const GroupRun&) = delete;

  int ranks() const { return static_cast<int>(devices_.size()); }
  Placement placement() const { return placement_; }

  // Rank `rank`'s part, on the worker thread of devices[rank]. Returns true for the last part to
  // finish: that caller then calls Finish.
  bool RunPart(int rank, WorkerComms* comms);
  // The result, once every part has returned. Releases everything the run held (buffers,
  // communicators' groups, the request's inputs) before returning.
  GroupResult Finish();

  // When rank 0 started (InfiniteFuture when it did not); read after the last part returned.
  absl::Time start() const { return start_; }

 private:
  const Placement placement_;
  std::shared_ptr<AttentionRequest> request_;
  const std::vector<Device*> devices_;
  const GroupEnv env_;
  std::unique_ptr<GroupStrategy> strategy_;

  std::once_flag setup_once_;
  absl::Status setup_status_;
  std::atomic<int> remaining_;
  absl::Time start_ = absl::InfiniteFuture();  // written by rank 0's worker
  std::vector<absl::Status> status_;           // per rank, each written by its own worker
  std::vector<RankFigures> figures_;
};

// A ring's figures from its ranks' admitted (query, key) pairs (summed over batch and query heads):
// each rank's FLOPs into `ranks`; returns the fraction of token pairs skipped.
double RingFigures(const AttentionShape& shape, const std::vector<int64_t>& admitted,
                   std::vector<RankFigures>& ranks);

// The status a request gets when it is found cancelled or past its deadline before it starts.
absl::Status StartStatus(const AttentionRequest& request, absl::Time now);

// The strategies: single, data parallel and CPU ring in group_run.cc; the GPU ring in gpu_ring.cc
// (gpu_ring_unavailable.cc without CUDA and NCCL).
std::unique_ptr<GroupStrategy> MakeSingleStrategy(AttentionRequest& request);
std::unique_ptr<GroupStrategy> MakeDataParallelStrategy(AttentionRequest& request, int ranks);
std::unique_ptr<GroupStrategy> MakeCpuRingStrategy(AttentionRequest& request, int ranks);
// In builds without CUDA and NCCL this returns a strategy whose SetUp is UNIMPLEMENTED.
std::unique_ptr<GroupStrategy> MakeGpuRingStrategy(AttentionRequest& request,
                                                   std::vector<Device*> devices,
                                                   const GroupEnv& env);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_GROUP_RUN_H_
