#include "server/scheduler.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/dist/communicator.h"
#include "core/dist/planner.h"
#include "core/dist/ring.h"
#include "spdlog/spdlog.h"
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
#include "absl/strings/str_join.h"
#include "core/cuda/cuda_device.h"
#include "core/dist/nccl_communicator.h"
#include "core/dist/dilated_ring.h"
#include "core/dist/dilated_ring_cuda.h"
#include "core/dist/ring_cuda.h"
#include "core/util/status_macros.h"
#endif

namespace attnserve {
namespace {

class SingleDevicePlanner final : public PlacementPlanner {
 public:
  std::optional<PlacementDecision> Place(const Job& job,
                                         absl::Span<const DeviceLoad> loads) override {
    const DeviceLoad* best = nullptr;
    for (const DeviceLoad& l : loads) {
      if (l.busy || l.estimate_bytes > l.budget_bytes) continue;
      if (best == nullptr || l.used_bytes < best->used_bytes) best = &l;
    }
    if (best == nullptr) return std::nullopt;
    return PlacementDecision{v1::PLACEMENT_SINGLE, {best->index}};
  }

  absl::Status Feasible(const Job& job, absl::Span<const DeviceLoad> loads) override {
    int64_t best_budget = 0;
    for (const DeviceLoad& l : loads) {
      if (l.estimate_bytes <= l.idle_budget_bytes) return absl::OkStatus();
      best_budget = std::max(best_budget, l.idle_budget_bytes);
    }
    const int64_t need = loads.empty() ? 0 : loads.front().estimate_bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "device memory: the request needs about ", need, " bytes on one device (inputs, outputs ",
        "and workspaces), more than any device can give it (largest budget ", best_budget,
        " bytes; see --max-inflight-bytes)"));
  }
};


PlacementHint HintFromProto(v1::Placement p) {
  switch (p) {
    case v1::PLACEMENT_SINGLE:
      return PlacementHint::kSingle;
    case v1::PLACEMENT_DATA_PARALLEL:
      return PlacementHint::kDataParallel;
    case v1::PLACEMENT_RING:
      return PlacementHint::kRing;
    default:
      return PlacementHint::kAuto;
  }
}

v1::Placement PlacementToProto(Placement p) {
  switch (p) {
    case Placement::kDataParallel:
      return v1::PLACEMENT_DATA_PARALLEL;
    case Placement::kRing:
      return v1::PLACEMENT_RING;
    case Placement::kSingle:
      break;
  }
  return v1::PLACEMENT_SINGLE;
}

class MultiDevicePlanner final : public PlacementPlanner {
 public:
  std::optional<PlacementDecision> Place(const Job& job,
                                         absl::Span<const DeviceLoad> loads) override {
    if (loads.size() <= 1) return single_.Place(job, loads);
    absl::StatusOr<PlacementPlan> plan = Plan(job, loads);
    // A plan that fails now (free memory changed since Submit) or is single: one device.
    if (!plan.ok() || plan->placement == Placement::kSingle || plan->devices.size() < 2) {
      return single_.Place(job, loads);
    }
    PlacementDecision d;
    d.placement = PlacementToProto(plan->placement);
    for (int i : plan->devices) {
      const DeviceLoad& l = loads[static_cast<size_t>(i)];
      if (l.busy || plan->bytes_per_device > l.budget_bytes) return std::nullopt;  // wait
      d.devices.push_back(static_cast<size_t>(i));
    }
    return d;
  }

  absl::Status Feasible(const Job& job, absl::Span<const DeviceLoad> loads) override {
    if (loads.size() <= 1) return single_.Feasible(job, loads);
    absl::StatusOr<PlacementPlan> plan = Plan(job, loads);
    if (plan.ok()) return absl::OkStatus();
    if (absl::IsResourceExhausted(plan.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device memory: ", plan.status().message(), " (see --max-inflight-bytes)"));
    }
    return plan.status();
  }

 private:
  static absl::StatusOr<PlacementPlan> Plan(const Job& job, absl::Span<const DeviceLoad> loads) {
    PlannerInput in;
    in.spec = job.spec;
    in.shape = job.shape;
    in.dtype = job.dtype;
    in.hint = HintFromProto(job.placement_hint);
    in.headroom = 1.0;
    for (const DeviceLoad& l : loads) in.free_bytes.push_back(l.idle_budget_bytes);
    const Device* device = loads.front().device;
    in.estimate = [device](const AttentionSpec& spec, const AttentionShape& shape, DType dtype) {
      return device->EstimateBytes(spec, shape, dtype);
    };
    return PlanPlacement(in);
  }

  SingleDevicePlanner single_;
};

// Bound of a GPU ring rank's NCCL communicator creation (further bounded by the request's
// deadline): all of a ring's workers start together, so peers join within milliseconds.
[[maybe_unused]] constexpr absl::Duration kRingCommInitTimeout = absl::Seconds(60);

int64_t SatAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

}  // namespace


// GPU rings' NCCL groups, shared by the scheduler's workers: one per ordered set of CUDA ordinals
// (rank i = the i-th device), each with a generation. The first ring over a set makes its group
// (ncclGetUniqueId); later rings over the same set get the same group (and generation) while it
// is healthy, so every worker reuses the communicator it cached for that generation; once a run
// aborted it (failure, cancel, timeout, a peer that never joined), the next ring over the set
// gets a fresh group with a new generation, and each worker drops its old communicator and joins
// the new one. A run takes its group once, at set-up, so all its ranks use the same generation.
class RingGroupRegistry {
 public:
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  struct Lease {
    std::shared_ptr<NcclGroup> group;
    uint64_t generation = 0;
    bool created = false;  // this call made the group
  };
  absl::StatusOr<Lease> Acquire(const std::vector<int>& ordinals) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = groups_[ordinals];
    Lease lease;
    if (e.group == nullptr || e.group->aborted()) {
      absl::StatusOr<std::shared_ptr<NcclGroup>> group =
          NcclGroup::Create(static_cast<int>(ordinals.size()));
      if (!group.ok()) {
        groups_.erase(ordinals);
        return group.status();
      }
      e.group = *std::move(group);
      e.generation = ++next_generation_;
      lease.created = true;
    }
    lease.group = e.group;
    lease.generation = e.generation;
    return lease;
  }

 private:
  struct Entry {
    std::shared_ptr<NcclGroup> group;
    uint64_t generation = 0;
  };
  std::mutex mu_;
  std::map<std::vector<int>, Entry> groups_;  // guarded by mu_; one per device set in use
  uint64_t next_generation_ = 0;              // guarded by mu_
#endif
};

// One worker's NCCL communicators, by ordered device set: created on the worker's thread (bound to
// its GPU, on its stream), reused by later rings over the same set and generation, destroyed on the
// same thread (a stale one when its set's group is rebuilt, all of them when the worker exits).
// Only that worker touches it: it lives on the worker's stack (WorkerLoop).
struct WorkerComms {
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  struct Entry {
    std::shared_ptr<NcclGroup> group;
    uint64_t generation = 0;
    std::unique_ptr<NcclCommunicator> comm;
  };

  WorkerComms() = default;
  WorkerComms(const WorkerComms&) = delete;
  WorkerComms& operator=(const WorkerComms&) = delete;
  // At worker exit. Every worker walks its map in the same (key) order and all of them exit
  // together at shutdown, so communicators of one set are destroyed at about the same time.
  ~WorkerComms() {
    for (auto& [devices, e] : by_devices) Retire(e);
  }

  // The communicator of `rank` for `devices` in `group` (generation `generation`): the cached one
  // when it belongs to that generation, else a new one (collective with the set's other workers,
  // bounded by init_timeout). `created` tells which. A failed creation has aborted the group.
  absl::StatusOr<NcclCommunicator*> Get(const std::vector<int>& devices,
                                        const std::shared_ptr<NcclGroup>& group,
                                        uint64_t generation, int rank, const CudaTaskContext& ctx,
                                        absl::Duration init_timeout, bool* created) {
    *created = false;
    // A peer of this run failed already (the cached communicator is then retired below at the
    // next ring over the set).
    if (group->aborted()) return group->abort_status();
    Entry& e = by_devices[devices];
    if (e.comm != nullptr && (e.generation != generation || e.group->aborted())) Retire(e);
    if (e.comm == nullptr) {
      NcclCommunicator::Options options;
      options.group = group;
      options.rank = rank;
      options.cuda_device = ctx.ordinal;
      options.compute_stream = ctx.stream;
      options.init_timeout = init_timeout;
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(options);
      if (!comm.ok()) {
        group->Abort(comm.status());  // peers still waiting in their init stop at once
        by_devices.erase(devices);
        return comm.status();
      }
      e.group = group;
      e.generation = generation;
      e.comm = *std::move(comm);
      *created = true;
    }
    e.comm->set_compute_stream(ctx.stream);
    return e.comm.get();
  }

  // Destroys a cached communicator on this (its owning) thread. One whose group was aborted by a
  // peer is aborted on this side first (its next NCCL entry point does that), so destroying it
  // never waits for peers that have gone.
  static void Retire(Entry& e) {
    if (e.comm != nullptr && e.group != nullptr && e.group->aborted()) {
      (void)e.comm->StartSendRecv(nullptr, 0, kNoPeer, nullptr, 0, kNoPeer);
    }
    e.comm.reset();
    e.group.reset();
    e.generation = 0;
  }

  std::map<std::vector<int>, Entry> by_devices;
#endif
};

// A multi-device run: one object shared by the workers of the group. Set up once (by whichever
// worker gets there first), then every worker runs its rank (ring) or its share (data parallel) on
// its own device; the last worker to finish assembles the outputs and reports.
struct GroupRun {
  std::shared_ptr<Job> job;
  std::vector<size_t> group;  // pool indices, in rank order
  v1::Placement placement = v1::PLACEMENT_SINGLE;
  BackendKind backend = BackendKind::kCpu;
  absl::Time submitted;
  std::atomic<int> remaining{0};

  std::once_flag setup_once;
  absl::Status setup_status;
  // Ring on CPU devices: the ring and its in-process communicators (one per rank).
  std::unique_ptr<RingRun> ring;
  std::unique_ptr<InProcessCommGroup> comms;
  // Data parallel: the split and the outputs every share is scattered into (disjoint regions).
  DataParallelSplit split;
  HostTensor o, lse;
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  // Ring on GPUs: each worker runs its own rank of `cuda_ring` on its device with its cached
  // communicator of `nccl_group` (generation `nccl_generation`), the one of `ordinals`.
  std::unique_ptr<RingCudaRun> cuda_ring;
  std::vector<int> ordinals;  // CUDA ordinals in rank order: the communicator cache key
  std::shared_ptr<NcclGroup> nccl_group;
  uint64_t nccl_generation = 0;
#endif
  // The GPU ring could not run this spec (RingCudaRun: UNIMPLEMENTED, e.g. dilated with fewer
  // segment units than GPUs) and the hint was not ring: rank 0 ran it alone instead, into
  // cuda_outputs.
  bool fell_back_single = false;
  // A dilated spec whose segments are longer than a shard: rank 0's worker runs the composition
  // of core/dist/dilated_ring_cuda (local parts per GPU, rings over gathered positions) over the
  // group's reserved GPUs; the result lands in cuda_outputs like a single-device fallback.
  bool dilated_composed = false;
  int64_t dilated_nccl_bytes = 0;
  AttentionOutputs cuda_outputs;

  // Per rank.
  std::vector<absl::Status> status;
  std::vector<double> busy_seconds;
  std::vector<double> tokens;
  std::vector<double> flops;
  std::vector<int64_t> bytes_sent;
  std::vector<int64_t> bytes_received;
  std::vector<RunInfo> infos;
  absl::Time start = absl::InfiniteFuture();  // rank 0's start
};

namespace {

// Byte address of row (b, n, head h) of a [B, N, H, D] tensor.
const std::byte* Row(const HostTensor& t, int64_t b, int64_t n, int64_t h) {
  const int64_t N = t.dim(1), H = t.dim(2), D = t.dim(3);
  return t.data() + static_cast<size_t>(((b * N + n) * H + h) * D) * DTypeSize(t.dtype());
}

// The GPU ordinal of a device named "cuda:3" (the pool's names carry the ordinal).
[[maybe_unused]] int OrdinalOf(const Device& d) {
  const std::string name = d.name();
  int ordinal = 0;
  const size_t colon = name.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(name.substr(colon + 1), &ordinal)) return 0;
  return ordinal;
}

absl::Status StartStatus(const Job& job, absl::Time now) {
  if (job.cancel.load()) {
    return now >= job.deadline ? absl::DeadlineExceededError("deadline passed while queued")
                               : absl::CancelledError("cancelled while queued");
  }
  if (now >= job.deadline) return absl::DeadlineExceededError("deadline passed while queued");
  return absl::OkStatus();
}

// Set-up of a group run (first worker to arrive; the inputs stay untouched until all finished).
absl::Status SetUpGroup(GroupRun& run) {
  Job& job = *run.job;
  if (absl::Status st = StartStatus(job, absl::Now()); !st.ok()) return st;
  const int ranks = static_cast<int>(run.group.size());
  if (run.placement == v1::PLACEMENT_RING) {
    if (run.backend != BackendKind::kCpu) return absl::OkStatus();  // GPU ring: SetUpCudaRing
    RingOptions options;
    options.cancel = &job.cancel;
    options.deadline = job.deadline;
    absl::StatusOr<std::unique_ptr<RingRun>> ring =
        RingRun::Create(job.spec, job.q, job.k, job.v, ranks, options);
    if (!ring.ok()) return ring.status();
    absl::StatusOr<std::unique_ptr<InProcessCommGroup>> comms = InProcessCommGroup::Create(ranks);
    if (!comms.ok()) return comms.status();
    run.ring = *std::move(ring);
    run.comms = *std::move(comms);
    return absl::OkStatus();
  }
  // Data parallel.
  run.split = SplitDataParallel(job.spec, job.shape, ranks);
  const AttentionShape& s = job.shape;
  absl::StatusOr<HostTensor> o =
      HostTensor::Create(job.q.dtype(), {s.batch, s.tokens, s.q_heads, s.head_dim}, nullptr);
  if (!o.ok()) return o.status();
  absl::StatusOr<HostTensor> lse =
      HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens}, nullptr);
  if (!lse.ok()) return lse.status();
  run.o = *std::move(o);
  run.lse = *std::move(lse);
  return absl::OkStatus();
}

// One data-parallel share on `device`: gather the units' Q/K/V, run, scatter O/LSE back.
absl::Status RunDataParallelShare(GroupRun& run, int rank, Device& device) {
  Job& job = *run.job;
  const TokenRange units = run.split.per_device[rank];
  if (units.size() == 0) return absl::OkStatus();
  const AttentionShape& s = job.shape;
  const int64_t c = run.split.kv_heads_per_unit;
  const int64_t g = s.q_heads / s.kv_heads;
  const int64_t blocks = s.kv_heads / c;  // units per batch item
  const int64_t N = s.tokens, D = s.head_dim, U = units.size();
  const DType dtype = job.q.dtype();
  const size_t esize = DTypeSize(dtype);
  const size_t q_row = static_cast<size_t>(c * g * D) * esize;
  const size_t kv_row = static_cast<size_t>(c * D) * esize;
  absl::StatusOr<HostTensor> qs = HostTensor::Create(dtype, {U, N, c * g, D}, nullptr);
  if (!qs.ok()) return qs.status();
  absl::StatusOr<HostTensor> ks = HostTensor::Create(dtype, {U, N, c, D}, nullptr);
  if (!ks.ok()) return ks.status();
  absl::StatusOr<HostTensor> vs = HostTensor::Create(dtype, {U, N, c, D}, nullptr);
  if (!vs.ok()) return vs.status();
  for (int64_t u = 0; u < U; ++u) {
    const int64_t b = (units.begin + u) / blocks;
    const int64_t kv0 = (units.begin + u) % blocks * c;
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(qs->data() + (u * N + n) * q_row, Row(job.q, b, n, kv0 * g), q_row);
      std::memcpy(ks->data() + (u * N + n) * kv_row, Row(job.k, b, n, kv0), kv_row);
      std::memcpy(vs->data() + (u * N + n) * kv_row, Row(job.v, b, n, kv0), kv_row);
    }
  }
  RunControl control;
  control.cancel = &job.cancel;
  control.deadline = job.deadline;
  absl::StatusOr<AttentionOutputs> part =
      device.Run(job.spec, *qs, *ks, *vs, control, &run.infos[rank]);
  if (!part.ok()) return part.status();
  if (part->o.dims() != qs->dims() || part->o.dtype() != dtype ||
      part->lse.dims() != std::vector<int64_t>{U, c * g, N}) {
    return absl::InternalError(absl::StrCat("data parallel: ", device.name(), " returned O ",
                                            part->o.DebugString(), " and LSE ",
                                            part->lse.DebugString()));
  }
  for (int64_t u = 0; u < U; ++u) {
    const int64_t b = (units.begin + u) / blocks;
    const int64_t h0 = (units.begin + u) % blocks * c * g;
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(const_cast<std::byte*>(Row(run.o, b, n, h0)), part->o.data() + (u * N + n) * q_row,
                  q_row);
    }
    for (int64_t h = 0; h < c * g; ++h) {
      std::memcpy(run.lse.data_as<float>() + (b * s.q_heads + h0 + h) * N,
                  part->lse.data_as<float>() + (u * c * g + h) * N, N * sizeof(float));
    }
  }
  run.tokens[rank] = static_cast<double>(U) * static_cast<double>(N);
  run.flops[rank] = run.infos[rank].flops;
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<PlacementPlanner> MakeSingleDevicePlanner() {
  return std::make_unique<SingleDevicePlanner>();
}

std::unique_ptr<PlacementPlanner> MakeMultiDevicePlanner() {
  return std::make_unique<MultiDevicePlanner>();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    const SchedulerOptions& options, DevicePool* pool, Metrics* metrics,
    std::unique_ptr<PlacementPlanner> planner) {
  if (pool == nullptr || pool->size() == 0) {
    return absl::InvalidArgumentError("scheduler: no devices");
  }
  if (options.max_queue < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-queue: must be >= 0, got ", options.max_queue));
  }
  if (options.max_inflight_bytes && *options.max_inflight_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-inflight-bytes: must be > 0 (0 / unset: device free memory), got ",
                     *options.max_inflight_bytes));
  }
  if (planner == nullptr) return absl::InvalidArgumentError("scheduler: no planner");
  std::unique_ptr<Scheduler> s(new Scheduler(options, pool, metrics, std::move(planner)));
  // Threads start only once the worker vector has its final size: they index into it.
  for (size_t i = 0; i < s->workers_.size(); ++i) {
    s->workers_[i].thread = std::thread([p = s.get(), i] { p->WorkerLoop(i); });
  }
  return s;
}

Scheduler::Scheduler(const SchedulerOptions& options, DevicePool* pool, Metrics* metrics,
                     std::unique_ptr<PlacementPlanner> planner)
    : options_(options),
      pool_(pool),
      metrics_(metrics),
      planner_(std::move(planner)),
      workers_(pool->size()),
      ring_groups_(std::make_shared<RingGroupRegistry>()) {}

Scheduler::~Scheduler() { Shutdown(); }

int64_t Scheduler::IdleBudget(size_t index) const {
  if (options_.max_inflight_bytes) return *options_.max_inflight_bytes;
  // Free memory plus what the device's caching allocator holds (in use or cached for reuse): the
  // device is reserved for the caller, so all of it is the request's. Never less than
  // LoadsLocked's idle budget (free + used), so it does not refuse what the planner admitted.
  const DeviceStats stats = pool_->device(index).Stats();
  return SatAdd(stats.memory_free_bytes,
                std::max(stats.memory_reserved_bytes, stats.memory_used_bytes));
}

std::vector<DeviceLoad> Scheduler::LoadsLocked(const Job& job) const {
  std::vector<DeviceLoad> loads(workers_.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Device& d = pool_->device(i);
    const DeviceStats stats = d.Stats();
    DeviceLoad& l = loads[i];
    l.index = i;
    l.device = &d;
    l.busy = workers_[i].busy;
    l.estimate_bytes = d.EstimateBytes(job.spec, job.shape, job.dtype);
    l.used_bytes = stats.memory_used_bytes;
    if (options_.max_inflight_bytes) {
      l.budget_bytes = *options_.max_inflight_bytes;
      l.idle_budget_bytes = *options_.max_inflight_bytes;
    } else {
      l.budget_bytes = stats.memory_free_bytes;
      l.idle_budget_bytes = SatAdd(stats.memory_free_bytes, stats.memory_used_bytes);
    }
  }
  return loads;
}

absl::Status Scheduler::Submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("server is draining");
  if (queue_.size() >= static_cast<size_t>(options_.max_queue)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue: ", queue_.size(),
                     " requests waiting (limit --max-queue=", options_.max_queue, ")"));
  }
  const std::vector<DeviceLoad> loads = LoadsLocked(*job);
  if (absl::Status s = planner_->Feasible(*job, loads); !s.ok()) return s;
  queue_.push_back(Queued{std::move(job), absl::Now()});
  if (metrics_ != nullptr) metrics_->SetQueueLength(static_cast<int64_t>(queue_.size()));
  DispatchLocked();
  return absl::OkStatus();
}

void Scheduler::DispatchLocked() {
  // FIFO: only the head may start, so a large request is not starved by small ones behind it.
  while (!queue_.empty() && !stopping_) {
    const Queued& head = queue_.front();
    const std::vector<DeviceLoad> loads = LoadsLocked(*head.job);
    std::optional<PlacementDecision> decision = planner_->Place(*head.job, loads);
    if (!decision || decision->devices.empty()) return;
    // Ranks in device order, whatever order the planner ranked them in: a GPU ring over the same
    // devices then always has the same key, so its cached NCCL communicators are reused.
    std::sort(decision->devices.begin(), decision->devices.end());
    const size_t leader = decision->devices.front();
    for (size_t i : decision->devices) workers_[i].busy = true;
    if (decision->devices.size() == 1) {
      Worker& w = workers_[leader];
      w.job = head.job;
      w.group = decision->devices;
      w.placement = decision->placement;
      w.submitted = head.submitted;
      w.group_run = nullptr;
    } else {
      auto run = std::make_shared<GroupRun>();
      const size_t p = decision->devices.size();
      run->job = head.job;
      run->group = decision->devices;
      run->placement = decision->placement;
      run->backend = pool_->backend();
      run->submitted = head.submitted;
      run->remaining.store(static_cast<int>(p));
      run->status.assign(p, absl::OkStatus());
      run->busy_seconds.assign(p, 0);
      run->tokens.assign(p, 0);
      run->flops.assign(p, 0);
      run->bytes_sent.assign(p, 0);
      run->bytes_received.assign(p, 0);
      run->infos.assign(p, RunInfo());
      for (size_t i : decision->devices) {
        Worker& w = workers_[i];
        w.job = head.job;
        w.group = decision->devices;
        w.placement = decision->placement;
        w.submitted = head.submitted;
        w.group_run = run;
      }
    }
    queue_.pop_front();
    if (metrics_ != nullptr) metrics_->SetQueueLength(static_cast<int64_t>(queue_.size()));
    cv_.notify_all();
  }
}

void Scheduler::Cancel(const Job* job) {
  std::shared_ptr<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->job.get() == job) {
        dropped = std::move(it->job);
        queue_.erase(it);
        break;
      }
    }
    if (dropped == nullptr) return;
    if (metrics_ != nullptr) metrics_->SetQueueLength(static_cast<int64_t>(queue_.size()));
    // The head may have changed.
    DispatchLocked();
  }
  JobResult result;
  result.status = absl::Now() >= dropped->deadline
                      ? absl::DeadlineExceededError("deadline passed while queued")
                      : absl::CancelledError("cancelled while queued");
  dropped->done(std::move(result));
}

void Scheduler::WorkerLoop(size_t index) {
  Device& device = pool_->device(index);
  // This worker's NCCL communicators (GPU rings): destroyed here, on this thread, when it exits.
  WorkerComms comms;
  for (;;) {
    std::shared_ptr<Job> job;
    std::vector<size_t> group;
    v1::Placement placement;
    absl::Time submitted;
    std::shared_ptr<GroupRun> group_run;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return workers_[index].job != nullptr || stopping_; });
      if (workers_[index].job == nullptr) return;  // stopping, nothing assigned
      job = workers_[index].job;
      group = workers_[index].group;
      placement = workers_[index].placement;
      submitted = workers_[index].submitted;
      group_run = workers_[index].group_run;
    }
    if (group_run != nullptr) {
      job.reset();
      RunGroupPart(index, group_run, comms);
      continue;
    }

    JobResult result;
    const absl::Time start = absl::Now();
    result.queue_seconds = absl::ToDoubleSeconds(start - submitted);
    result.placement = placement;
    for (size_t i : group) result.devices.push_back(pool_->device(i).name());
    if (metrics_ != nullptr) metrics_->ObserveQueueWait(result.queue_seconds);
    if (job->cancel.load()) {
      result.status = start >= job->deadline
                          ? absl::DeadlineExceededError("deadline passed while queued")
                          : absl::CancelledError("cancelled while queued");
    } else if (start >= job->deadline) {
      result.status = absl::DeadlineExceededError("deadline passed while queued");
    } else {
      RunControl control;
      control.cancel = &job->cancel;
      control.deadline = job->deadline;
      absl::StatusOr<AttentionOutputs> out =
          device.Run(job->spec, job->q, job->k, job->v, control, &result.info);
      const double busy = absl::ToDoubleSeconds(absl::Now() - start);
      if (out.ok()) {
        result.outputs = *std::move(out);
        if (metrics_ != nullptr) {
          metrics_->RecordRun(
              index, static_cast<double>(job->shape.batch) * static_cast<double>(job->shape.tokens),
              result.info.flops, busy);
        }
      } else {
        result.status = out.status();
        if (metrics_ != nullptr) metrics_->RecordRun(index, 0, 0, busy);
      }
    }
    // The inputs are not needed any more; the outputs travel to the RPC side with the result.
    job->q = HostTensor();
    job->k = HostTensor();
    job->v = HostTensor();
    auto done = std::move(job->done);
    job.reset();
    done(std::move(result));

    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i : group) workers_[i].busy = false;
    workers_[index].job.reset();
    workers_[index].group.clear();
    DispatchLocked();
  }
}


void Scheduler::RunGroupPart(size_t index, const std::shared_ptr<GroupRun>& run_ptr,
                             WorkerComms& comms) {
  GroupRun& run = *run_ptr;
  const int rank = static_cast<int>(
      std::find(run.group.begin(), run.group.end(), index) - run.group.begin());
  const int ranks = static_cast<int>(run.group.size());
  Device& device = pool_->device(index);
  Job& job = *run.job;
  const absl::Time start = absl::Now();
  if (rank == 0) run.start = start;
  std::call_once(run.setup_once, [&] {
    run.setup_status = SetUpGroup(run);
    if (run.setup_status.ok() && run.placement == v1::PLACEMENT_RING &&
        run.backend != BackendKind::kCpu) {
      run.setup_status = SetUpCudaRing(run);
    }
  });

  absl::Status st = run.setup_status;
  if (st.ok()) st = StartStatus(job, start);
  if (st.ok()) {
    const AttentionShape& s = job.shape;
    if (run.placement == v1::PLACEMENT_RING && run.backend == BackendKind::kCpu) {
      // This rank's share of the memory, charged to this device while its rank runs.
      AttentionShape shard = s;
      shard.tokens = (s.tokens + ranks - 1) / ranks;
      const int64_t bytes = device.EstimateBytes(job.spec, shard, job.dtype);
      Communicator& comm = *run.comms->comm(rank);
      RingRun& ring = *run.ring;
      st = device.RunHostTask(bytes, [&](ThreadPool* pool) { return ring.RunRank(comm, pool); });
    } else if (run.placement == v1::PLACEMENT_RING) {
      st = RunCudaRingRank(run, rank, index, comms);
    } else {
      st = RunDataParallelShare(run, rank, device);
    }
  }
  if (!st.ok() && job.cancel.load() && absl::Now() >= job.deadline &&
      (absl::IsCancelled(st) || absl::IsAborted(st))) {
    st = absl::DeadlineExceededError("deadline passed while running");
  }
  // A rank that failed (or never started) releases its peers at once (GPU ring: those in NCCL
  // init or a transfer see the group aborted at their next poll; the group is rebuilt for the
  // next ring over these devices).
  if (!st.ok() && run.comms != nullptr) run.comms->Abort(st);
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  if (!st.ok() && run.nccl_group != nullptr) run.nccl_group->Abort(st);
#endif
  run.status[rank] = st;
  run.busy_seconds[rank] = absl::ToDoubleSeconds(absl::Now() - start);

  {
    // This worker's part is over; its device stays reserved (busy) until the whole group has
    // finished. Cleared before counting down, so the last worker's dispatch, which may give this
    // worker its next job, always comes after.
    std::lock_guard<std::mutex> lock(mu_);
    workers_[index].job.reset();
    workers_[index].group_run.reset();
  }
  if (run.remaining.fetch_sub(1) != 1) return;  // not the last
  FinishGroup(run);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i : run.group) {
    workers_[i].busy = false;
    workers_[i].group.clear();
  }
  DispatchLocked();
}

void Scheduler::FinishGroup(GroupRun& run) {
  std::shared_ptr<Job> job = run.job;
  const AttentionShape& s = job->shape;
  const int ranks = static_cast<int>(run.group.size());
  JobResult result;
  result.placement = run.placement;
  for (size_t i : run.group) result.devices.push_back(pool_->device(i).name());
  result.queue_seconds =
      run.start == absl::InfiniteFuture() ? 0 : absl::ToDoubleSeconds(run.start - run.submitted);
  if (metrics_ != nullptr) metrics_->ObserveQueueWait(result.queue_seconds);
  // The root cause: a failed rank aborts its peers with its own status, so the first error in
  // rank order that is not a consequence (CANCELLED/ABORTED) wins, else the first error.
  absl::Status status;
  for (const absl::Status& st : run.status) {
    if (st.ok()) continue;
    if (status.ok()) status = st;
    if (!absl::IsCancelled(st) && !absl::IsAborted(st)) {
      status = st;
      break;
    }
  }
  if (status.ok()) {
    // A ring's figures from its ranks' admitted (query, key) pairs (summed over batch and query
    // heads): FLOPs per rank, and the fraction of token pairs skipped.
    auto ring_figures = [&](const std::vector<int64_t>& admitted) {
      const double d = static_cast<double>(s.head_dim);
      double pairs = 0;
      for (int r = 0; r < ranks && r < static_cast<int>(admitted.size()); ++r) {
        run.flops[r] = 4.0 * d * static_cast<double>(admitted[r]);
        pairs += static_cast<double>(admitted[r]);
      }
      const double full = static_cast<double>(s.batch) * static_cast<double>(s.q_heads) *
                          static_cast<double>(s.tokens) * static_cast<double>(s.tokens);
      result.info.sparsity = full > 0 ? std::clamp(1.0 - pairs / full, 0.0, 1.0) : 0.0;
    };
    if (run.placement == v1::PLACEMENT_RING && run.ring != nullptr) {
      absl::StatusOr<AttentionOutputs> out = run.ring->TakeOutputs();
      if (out.ok()) {
        result.outputs = *std::move(out);
        std::vector<int64_t> admitted;
        for (const RingRankStats& st : run.ring->stats()) admitted.push_back(st.admitted_pairs);
        ring_figures(admitted);
      } else {
        status = out.status();
      }
    } else if (run.placement == v1::PLACEMENT_RING && run.dilated_composed) {
      result.outputs = std::move(run.cuda_outputs);
      for (size_t i : run.group) result.devices.push_back(pool_->device(i).name());
    } else if (run.placement == v1::PLACEMENT_RING && run.fell_back_single) {
      result.outputs = std::move(run.cuda_outputs);
      result.placement = v1::PLACEMENT_SINGLE;
      result.devices = {pool_->device(run.group.front()).name()};
      result.info.sparsity = run.infos[0].sparsity;
    } else if (run.placement == v1::PLACEMENT_RING) {
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
      absl::StatusOr<AttentionOutputs> out =
          run.cuda_ring != nullptr ? run.cuda_ring->TakeOutputs()
                                   : absl::InternalError("GPU ring: no ring run");
      if (out.ok()) {
        result.outputs = *std::move(out);
        std::vector<int64_t> admitted;
        for (const RingCudaRankStats& st : run.cuda_ring->stats()) {
          admitted.push_back(st.admitted_pairs);
        }
        ring_figures(admitted);
      } else {
        status = out.status();
      }
#else
      status = absl::InternalError("GPU ring: this build has no GPU ring");
#endif
    } else {
      result.outputs = AttentionOutputs{std::move(run.o), std::move(run.lse)};
      for (int r = 0; r < ranks; ++r) {
        if (run.split.per_device[r].size() > 0) {
          result.info.sparsity = run.infos[r].sparsity;
          break;
        }
      }
    }
  }
  if (run.placement == v1::PLACEMENT_RING) {
    // Ring ranks hold equal shares of the sequence: tokens split evenly.
    for (int r = 0; r < ranks; ++r) {
      run.tokens[r] =
          run.fell_back_single
              ? (r == 0 ? static_cast<double>(s.batch) * static_cast<double>(s.tokens) : 0.0)
              : static_cast<double>(s.batch) * static_cast<double>(s.tokens) /
                    static_cast<double>(ranks);
    }
    if (run.ring != nullptr) {
      const std::vector<RingRankStats>& stats = run.ring->stats();
      for (int r = 0; r < ranks && r < static_cast<int>(stats.size()); ++r) {
        run.bytes_sent[r] = stats[r].bytes_sent;
        run.bytes_received[r] = stats[r].bytes_received;
      }
    }
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
    if (run.cuda_ring != nullptr) {
      // Each rank's own NCCL bytes (what its communicator moved during this run).
      const std::vector<RingCudaRankStats> stats = run.cuda_ring->stats();
      for (int r = 0; r < ranks && r < static_cast<int>(stats.size()); ++r) {
        run.bytes_sent[r] = stats[r].bytes_sent;
        run.bytes_received[r] = stats[r].bytes_received;
      }
    }
    if (run.dilated_composed && ranks > 0) {
      // The composition's rings: their NCCL bytes in total, spread evenly over the ranks (every
      // rank sends and receives the same amount in a ring).
      for (int r = 0; r < ranks; ++r) {
        run.bytes_sent[r] = run.bytes_received[r] = run.dilated_nccl_bytes / ranks;
      }
    }
#endif
  }
  result.status = status;
  for (int r = 0; r < ranks; ++r) {
    result.info.compute_seconds = std::max(result.info.compute_seconds, run.busy_seconds[r]);
    if (status.ok()) result.info.flops += run.flops[r];
    if (metrics_ != nullptr) {
      metrics_->RecordRun(run.group[r], status.ok() ? run.tokens[r] : 0,
                          status.ok() ? run.flops[r] : 0, run.busy_seconds[r]);
      metrics_->RecordCommBytes(run.group[r], run.bytes_sent[r], run.bytes_received[r]);
    }
  }
  // Release everything the run held before reporting: the ring (its accumulators), the
  // communicators, the inputs.
  run.ring.reset();
  run.comms.reset();
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  run.cuda_ring.reset();
  run.nccl_group.reset();
#endif
  run.o = HostTensor();
  run.lse = HostTensor();
  job->q = HostTensor();
  job->k = HostTensor();
  job->v = HostTensor();
  auto done = std::move(job->done);
  run.job.reset();
  job.reset();
  done(std::move(result));
}

absl::Status Scheduler::SetUpCudaRing(GroupRun& run) {
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  Job& job = *run.job;
  const size_t ranks = run.group.size();
  std::string names;
  run.ordinals.clear();
  std::vector<int64_t> budgets;
  int64_t min_budget = std::numeric_limits<int64_t>::max();
  for (size_t i : run.group) {
    const Device& d = pool_->device(i);
    run.ordinals.push_back(OrdinalOf(d));
    absl::StrAppend(&names, names.empty() ? "" : ",", d.name());
    // Every device of the group is reserved for this request: what it may use there now.
    budgets.push_back(IdleBudget(i));
    min_budget = std::min(min_budget, budgets.back());
  }
  RingCudaOptions options;
  options.cancel = &job.cancel;
  // The ring's schedule is chosen to fit the smallest budget of its devices (0 would mean
  // unlimited to the planner: a device with nothing to give gets 1 byte, so no schedule fits).
  options.plan.device_memory_budget = std::max<int64_t>(min_budget, 1);
  absl::StatusOr<std::unique_ptr<RingCudaRun>> ring =
      RingCudaRun::Create(job.spec, job.q, job.k, job.v, run.ordinals, options);
  if (!ring.ok()) {
    if (absl::IsUnimplemented(ring.status()) &&
        std::holds_alternative<DilatedSpec>(job.spec.pattern)) {
      // Segments longer than a shard: the dilated composition, when it can split this spec
      // (checked now, before any GPU work).
      absl::StatusOr<std::vector<DilatedRingJob>> jobs =
          PlanDilatedRing(job.spec, job.shape, static_cast<int>(ranks), options.plan.block_size);
      if (jobs.ok()) {
        const int64_t need = pool_->device(run.group.front()).EstimateBytes(job.spec, job.shape,
                                                                            job.dtype);
        if (need > min_budget) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "device memory: dilated ring over ", names, " needs about ", need,
              " bytes per device, more than the smallest budget (", min_budget,
              " bytes; see --max-inflight-bytes)"));
        }
        run.dilated_composed = true;
        return absl::OkStatus();
      }
      if (job.placement_hint == v1::PLACEMENT_RING) {
        return absl::Status(jobs.status().code(),
                            absl::StrCat("placement ring: ", jobs.status().message()));
      }
    }
    if (absl::IsUnimplemented(ring.status()) && job.placement_hint != v1::PLACEMENT_RING) {
      // The GPU ring cannot split this spec (e.g. dilated segments longer than a shard) and the
      // client did not ask for a ring: rank 0's device runs it alone, if it fits there.
      const Device& d = pool_->device(run.group.front());
      const int64_t need = d.EstimateBytes(job.spec, job.shape, job.dtype);
      if (need > budgets.front()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "device memory: the GPU ring cannot split this request (", ring.status().message(),
            ") and it needs about ", need, " bytes on one device, more than ", d.name(),
            " can give it (", budgets.front(), " bytes; see --max-inflight-bytes)"));
      }
      run.fell_back_single = true;
      return absl::OkStatus();
    }
    if (absl::IsResourceExhausted(ring.status())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device memory: GPU ring over ", names, ": ", ring.status().message(),
          " (see --max-inflight-bytes)"));
    }
    return ring.status();
  }
  // Admission per device with the ring's own per-rank figure (its chosen schedule), before any
  // GPU memory is touched.
  for (size_t r = 0; r < ranks; ++r) {
    const int64_t need = (*ring)->EstimateRankBytes(static_cast<int>(r));
    if (need > budgets[r]) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device memory: ring rank ", r, " needs about ", need, " bytes on ",
          pool_->device(run.group[r]).name(), ", more than it can give (", budgets[r],
          " bytes; see --max-inflight-bytes)"));
    }
  }
  ATTN_ASSIGN_OR_RETURN(RingGroupRegistry::Lease lease, ring_groups_->Acquire(run.ordinals));
  if (lease.created) {
    if (metrics_ != nullptr) metrics_->AddNcclGroupCreated();
    spdlog::info("GPU ring over {}: new NCCL group (generation {}); its communicators are created "
                 "by the devices' workers and cached for later rings over the same devices",
                 names, lease.generation);
  }
  run.nccl_group = std::move(lease.group);
  run.nccl_generation = lease.generation;
  run.cuda_ring = *std::move(ring);
  return absl::OkStatus();
#else
  (void)run;
  return absl::UnimplementedError(
      "ring placement on this backend needs CUDA and NCCL (this attnserve has no GPU ring)");
#endif
}

absl::Status Scheduler::RunCudaRingRank(GroupRun& run, int rank, size_t index,
                                        WorkerComms& comms) {
  Device& device = pool_->device(index);
  Job& job = *run.job;
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  if (run.dilated_composed) {
    if (rank != 0) return absl::OkStatus();  // held by the reservation; rank 0 drives them
    // Deviation from one-thread-per-GPU, as documented in docs/DESIGN.md: the composition starts
    // its own rank threads on the group's GPUs (reserved, idle) and its own NCCL groups.
    RingCudaOptions options;
    options.cancel = &job.cancel;
    DilatedRingStats stats;
    absl::StatusOr<AttentionOutputs> out =
        DilatedRingAttentionCuda(job.spec, job.q, job.k, job.v, run.ordinals, options, &stats);
    if (!out.ok()) return out.status();
    run.cuda_outputs = *std::move(out);
    run.dilated_nccl_bytes = stats.ring_bytes_moved;
    return absl::OkStatus();
  }
#endif
  if (run.fell_back_single) {
    if (rank != 0) return absl::OkStatus();  // held by the reservation, idle
    RunControl control;
    control.cancel = &job.cancel;
    control.deadline = job.deadline;
    absl::StatusOr<AttentionOutputs> alone =
        device.Run(job.spec, job.q, job.k, job.v, control, &run.infos[0]);
    if (!alone.ok()) return alone.status();
    run.cuda_outputs = *std::move(alone);
    run.flops[0] = run.infos[0].flops;
    return absl::OkStatus();
  }
#if defined(ATTNSERVE_SERVER_HAVE_RING_CUDA)
  if (run.cuda_ring == nullptr || run.nccl_group == nullptr) {
    return absl::InternalError("GPU ring: rank started without its set-up");
  }
  RingCudaRun& ring = *run.cuda_ring;
  // Communicator creation is collective and bounded: a peer that never joins (or fails first and
  // aborts the group) fails this rank instead of holding the worker.
  absl::Duration init_timeout = kRingCommInitTimeout;
  if (const absl::Duration left = job.deadline - absl::Now(); left < init_timeout) {
    init_timeout = std::max(left, absl::Seconds(1));
  }
  bool created = false;
  const absl::Status st = RunCudaDeviceTask(device, [&](CudaTaskContext& ctx) -> absl::Status {
    const absl::Time t0 = absl::Now();
    ATTN_ASSIGN_OR_RETURN(NcclCommunicator * comm,
                          comms.Get(run.ordinals, run.nccl_group, run.nccl_generation, rank, ctx,
                                    init_timeout, &created));
    if (created) {
      spdlog::info("{}: NCCL communicator rank {} of {} over devices [{}] (generation {}) created "
                   "in {:.3f} s",
                   device.name(), rank, ring.ranks(), absl::StrJoin(run.ordinals, ","),
                   run.nccl_generation, absl::ToDoubleSeconds(absl::Now() - t0));
    }
    return ring.RunRank(rank, *comm, ctx.allocator, ctx.stream);
  });
  if (created && metrics_ != nullptr) metrics_->AddNcclCommCreated(index);
  return st;
#else
  (void)comms;
  return absl::UnimplementedError(absl::StrCat("ring placement on ", device.name(),
                                               " needs CUDA and NCCL (this attnserve has no GPU "
                                               "ring)"));
#endif
}

void Scheduler::Shutdown() {
  std::deque<Queued> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (joined_) return;
    stopping_ = true;
    dropped.swap(queue_);
    if (metrics_ != nullptr) metrics_->SetQueueLength(0);
  }
  cv_.notify_all();
  for (Queued& q : dropped) {
    JobResult result;
    result.status = absl::UnavailableError("server is shutting down");
    q.job->done(std::move(result));
  }
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  joined_ = true;
}

size_t Scheduler::queue_length() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Worker& w : workers_) n += w.job != nullptr ? 1 : 0;
  return n;
}

}  // namespace attnserve
