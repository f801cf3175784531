// The GPU ring strategy (CUDA + NCCL builds): every rank of a RingCudaRun on its own device's
// worker, over that worker's cached NCCL communicator for the ring's device set. When the ring
// cannot split a dilated spec it becomes the dilated composition (dilated_ring_cuda.h); when it
// cannot split the spec at all and the caller did not ask for a ring, rank 0 runs it alone.
#include "core/parallel/gpu_ring.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/parallel/dilated_ring.h"
#include "core/parallel/dilated_ring_cuda.h"
#include "core/parallel/group_run.h"
#include "core/parallel/nccl_communicator.h"
#include "core/parallel/nccl_groups.h"
#include "core/parallel/ring_cuda.h"
#include "core/util/status_macros.h"

namespace attnserve {

void NcclGroupsDeleter::operator()(NcclGroups* groups) const { delete groups; }
void WorkerCommsDeleter::operator()(WorkerComms* comms) const { delete comms; }
std::unique_ptr<NcclGroups, NcclGroupsDeleter> MakeNcclGroups() {
  return std::unique_ptr<NcclGroups, NcclGroupsDeleter>(new NcclGroups());
}
std::unique_ptr<WorkerComms, WorkerCommsDeleter> MakeWorkerComms() {
  return std::unique_ptr<WorkerComms, WorkerCommsDeleter>(new WorkerComms());
}

namespace {

// Bound of a GPU ring rank's NCCL communicator creation (further bounded by the request's
// deadline): all of a ring's workers start together, so peers join within milliseconds.
constexpr absl::Duration kRingCommInitTimeout = absl::Seconds(60);

// The GPU ordinal of a device named "cuda:3" (the pool's names carry the ordinal).
int OrdinalOf(const Device& d) {
  const std::string name = d.name();
  int ordinal = 0;
  const size_t colon = name.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(name.substr(colon + 1), &ordinal)) return 0;
  return ordinal;
}

// A dilated spec whose segments are longer than a shard: rank 0's worker runs the composition
// (local parts per GPU, rings over gathered positions) over the group's reserved GPUs. Deviation
// from one-thread-per-GPU, documented in docs/DESIGN.md: the composition starts its own rank
// threads on those (reserved, idle) GPUs and its own NCCL groups.
class DilatedCompositionStrategy final : public GroupStrategy {
 public:
  DilatedCompositionStrategy(AttentionRequest& request, std::vector<int> ordinals,
                             const CudaOptions& cuda)
      : request_(request), ordinals_(std::move(ordinals)), cuda_(cuda) {}

  absl::Status RunRank(int rank, Device&, WorkerComms*, RankFigures&) override {
    if (rank != 0) return absl::OkStatus();  // held by the reservation; rank 0 drives them
    RingCudaOptions options;
    options.cancel = &request_.cancel;
    options.cuda = cuda_;
    DilatedRingStats stats;
    ATTN_ASSIGN_OR_RETURN(
        outputs_, DilatedRingAttentionCuda(request_.spec, request_.q, request_.k, request_.v,
                                           ordinals_, options, &stats));
    nccl_bytes_ = stats.ring_bytes_moved;
    return absl::OkStatus();
  }

  absl::Status Collect(GroupResult& result) override {
    result.outputs = std::move(outputs_);
    result.placement = Placement::kRing;
    const int ranks = static_cast<int>(ordinals_.size());
    const double tokens = static_cast<double>(request_.shape.batch) *
                          static_cast<double>(request_.shape.tokens) / ranks;
    for (int r = 0; r < ranks; ++r) {
      result.ranks_used.push_back(r);
      result.ranks[r].tokens = tokens;
      // Every rank of a ring sends and receives the same amount: the rings' NCCL bytes, spread.
      result.ranks[r].bytes_sent = result.ranks[r].bytes_received = nccl_bytes_ / ranks;
    }
    return absl::OkStatus();
  }

 private:
  AttentionRequest& request_;
  const std::vector<int> ordinals_;
  const CudaOptions cuda_;
  AttentionOutputs outputs_;
  int64_t nccl_bytes_ = 0;
};

// The ring itself, or one of the two forms above chosen at set-up.
class GpuRingStrategy final : public GroupStrategy {
 public:
  GpuRingStrategy(AttentionRequest& request, std::vector<Device*> devices, const GroupEnv& env)
      : request_(request), devices_(std::move(devices)), env_(env) {}

  absl::Status SetUp() override;

  absl::Status RunRank(int rank, Device& device, WorkerComms* comms,
                       RankFigures& figures) override {
    if (instead_ != nullptr) {
      if (rank != 0 && fell_back_single_) return absl::OkStatus();  // reserved, idle
      return instead_->RunRank(rank, device, comms, figures);
    }
    return RunRingRank(rank, device, comms);
  }

  void Abort(const absl::Status& status) override {
    if (nccl_group_ != nullptr) nccl_group_->Abort(status);
  }

  absl::Status Collect(GroupResult& result) override;

 private:
  absl::Status RunRingRank(int rank, Device& device, WorkerComms* comms);
  // The ring cannot run this spec: the dilated composition or a single-device fallback, if
  // either applies (then OK and instead_ is set), else the error to fail with.
  absl::Status SetUpInstead(const absl::Status& ring_status, const std::string& names,
                            int64_t min_budget, const std::vector<int64_t>& budgets,
                            int32_t block_size);

  AttentionRequest& request_;
  const std::vector<Device*> devices_;
  const GroupEnv env_;
  std::vector<int> ordinals_;  // CUDA ordinals in rank order: the communicator cache key
  std::unique_ptr<RingCudaRun> ring_;
  std::shared_ptr<NcclGroup> nccl_group_;
  uint64_t nccl_generation_ = 0;
  std::unique_ptr<GroupStrategy> instead_;
  bool fell_back_single_ = false;
};

absl::Status GpuRingStrategy::SetUp() {
  const int ranks = static_cast<int>(devices_.size());
  std::string names;
  std::vector<int64_t> budgets;
  int64_t min_budget = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < ranks; ++r) {
    ordinals_.push_back(OrdinalOf(*devices_[r]));
    absl::StrAppend(&names, names.empty() ? "" : ",", devices_[r]->name());
    // Every device of the group is reserved for this request: what it may use there now.
    budgets.push_back(env_.budget_bytes ? env_.budget_bytes(r)
                                        : std::numeric_limits<int64_t>::max());
    min_budget = std::min(min_budget, budgets.back());
  }
  RingCudaOptions options;
  options.cancel = &request_.cancel;
  options.cuda = env_.cuda;
  // The ring's schedule is chosen to fit the smallest budget of its devices (0 would mean
  // unlimited to the planner: a device with nothing to give gets 1 byte, so no schedule fits).
  options.plan.device_memory_budget = std::max<int64_t>(min_budget, 1);
  absl::StatusOr<std::unique_ptr<RingCudaRun>> ring =
      RingCudaRun::Create(request_.spec, request_.q, request_.k, request_.v, ordinals_, options);
  if (!ring.ok()) {
    return SetUpInstead(ring.status(), names, min_budget, budgets, options.plan.block_size);
  }
  // Admission per device with the ring's own per-rank figure (its chosen schedule), before any
  // GPU memory is touched.
  for (int r = 0; r < ranks; ++r) {
    const int64_t need = (*ring)->EstimateRankBytes(r);
    if (need > budgets[r]) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device memory: ring rank ", r, " needs about ", need, " bytes on ", devices_[r]->name(),
          ", more than it can give (", budgets[r], " bytes; see --max-inflight-bytes)"));
    }
  }
  if (env_.nccl_groups == nullptr) return absl::InternalError("GPU ring: no NCCL group cache");
  ATTN_ASSIGN_OR_RETURN(NcclGroups::Lease lease, env_.nccl_groups->Acquire(ordinals_));
  if (lease.created && env_.on_nccl_group_created) env_.on_nccl_group_created();
  nccl_group_ = std::move(lease.group);
  nccl_generation_ = lease.generation;
  ring_ = *std::move(ring);
  return absl::OkStatus();
}

absl::Status GpuRingStrategy::SetUpInstead(const absl::Status& ring_status,
                                           const std::string& names, int64_t min_budget,
                                           const std::vector<int64_t>& budgets,
                                           int32_t block_size) {
  const bool asked_ring = request_.placement_hint == PlacementHint::kRing;
  const int ranks = static_cast<int>(devices_.size());
  if (absl::IsUnimplemented(ring_status) &&
      std::holds_alternative<DilatedSpec>(request_.spec.pattern)) {
    // Segments longer than a shard: the dilated composition, when it can split this spec
    // (checked now, before any GPU work).
    absl::StatusOr<std::vector<DilatedRingJob>> jobs =
        PlanDilatedRing(request_.spec, request_.shape, ranks, block_size);
    if (jobs.ok()) {
      const int64_t need =
          devices_.front()->EstimateBytes(request_.spec, request_.shape, request_.dtype);
      if (need > min_budget) {
        return absl::ResourceExhaustedError(
            absl::StrCat("device memory: dilated ring over ", names, " needs about ", need,
                         " bytes per device, more than the smallest budget (", min_budget,
                         " bytes; see --max-inflight-bytes)"));
      }
      instead_ = std::make_unique<DilatedCompositionStrategy>(request_, ordinals_, env_.cuda);
      return absl::OkStatus();
    }
    if (asked_ring) {
      return absl::Status(jobs.status().code(),
                          absl::StrCat("placement ring: ", jobs.status().message()));
    }
  }
  if (absl::IsUnimplemented(ring_status) && !asked_ring) {
    // The GPU ring cannot split this spec and the client did not ask for a ring: rank 0's
    // device runs it alone, if it fits there.
    const Device& d = *devices_.front();
    const int64_t need = d.EstimateBytes(request_.spec, request_.shape, request_.dtype);
    if (need > budgets.front()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device memory: the GPU ring cannot split this request (", ring_status.message(),
          ") and it needs about ", need, " bytes on one device, more than ", d.name(),
          " can give it (", budgets.front(), " bytes; see --max-inflight-bytes)"));
    }
    instead_ = MakeSingleStrategy(request_);
    fell_back_single_ = true;
    return absl::OkStatus();
  }
  if (absl::IsResourceExhausted(ring_status)) {
    return absl::ResourceExhaustedError(absl::StrCat("device memory: GPU ring over ", names, ": ",
                                                     ring_status.message(),
                                                     " (see --max-inflight-bytes)"));
  }
  return ring_status;
}

absl::Status GpuRingStrategy::RunRingRank(int rank, Device& device, WorkerComms* comms) {
  if (ring_ == nullptr || nccl_group_ == nullptr || comms == nullptr) {
    return absl::InternalError("GPU ring: rank started without its set-up");
  }
  // Communicator creation is collective and bounded: a peer that never joins (or fails first and
  // aborts the group) fails this rank instead of holding the worker.
  absl::Duration init_timeout = kRingCommInitTimeout;
  if (const absl::Duration left = request_.deadline - absl::Now(); left < init_timeout) {
    init_timeout = std::max(left, absl::Seconds(1));
  }
  bool created = false;
  const absl::Status st = device.RunTask(0, [&](DeviceContext& ctx) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        NcclCommunicator * comm,
        comms->Get(ordinals_, nccl_group_, nccl_generation_, rank, ctx, init_timeout, &created));
    return ring_->RunRank(rank, *comm, ctx.allocator, ctx.stream, ctx.copies);
  });
  if (created && env_.on_nccl_comm_created) env_.on_nccl_comm_created(rank);
  return st;
}

absl::Status GpuRingStrategy::Collect(GroupResult& result) {
  const int ranks = static_cast<int>(devices_.size());
  if (instead_ != nullptr) {
    ATTN_RETURN_IF_ERROR(instead_->Collect(result));
    if (fell_back_single_) {
      result.ranks[0].tokens =
          static_cast<double>(request_.shape.batch) * static_cast<double>(request_.shape.tokens);
    }
    return absl::OkStatus();
  }
  ATTN_ASSIGN_OR_RETURN(result.outputs, ring_->TakeOutputs());
  const std::vector<RingCudaRankStats> stats = ring_->stats();
  std::vector<int64_t> admitted;
  for (const RingCudaRankStats& st : stats) admitted.push_back(st.admitted_pairs);
  result.info.sparsity = RingFigures(request_.shape, admitted, result.ranks);
  const double tokens = static_cast<double>(request_.shape.batch) *
                        static_cast<double>(request_.shape.tokens) / ranks;
  for (int r = 0; r < ranks; ++r) {
    result.ranks_used.push_back(r);
    result.ranks[r].tokens = tokens;
    if (r < static_cast<int>(stats.size())) {
      // Each rank's own NCCL bytes (what its communicator moved during this run).
      result.ranks[r].bytes_sent = stats[r].bytes_sent;
      result.ranks[r].bytes_received = stats[r].bytes_received;
    }
  }
  result.placement = Placement::kRing;
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<GroupStrategy> MakeGpuRingStrategy(AttentionRequest& request,
                                                   std::vector<Device*> devices,
                                                   const GroupEnv& env) {
  return std::make_unique<GpuRingStrategy>(request, std::move(devices), env);
}

}  // namespace attnserve
