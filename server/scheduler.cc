#include "server/scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/parallel/group_run.h"
#include "spdlog/spdlog.h"

namespace attnserve {
namespace {

int64_t SatAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

// Where each device's lane workers start in the flat worker list, then the total.
std::vector<size_t> FirstWorkers(const DevicePool& pool) {
  std::vector<size_t> first{0};
  for (size_t d = 0; d < pool.size(); ++d) {
    first.push_back(first.back() + static_cast<size_t>(std::max(1, pool.device(d).lanes())));
  }
  return first;
}

}  // namespace

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
      nccl_groups_(MakeNcclGroups()),
      first_worker_(FirstWorkers(*pool)),
      workers_(first_worker_.back()) {
  for (size_t d = 0; d < pool->size(); ++d) {
    for (size_t w = FirstWorker(d); w < EndWorker(d); ++w) {
      workers_[w].device = d;
      workers_[w].lane = static_cast<int>(w - FirstWorker(d));
    }
  }
}

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

size_t Scheduler::FreeLanesLocked(size_t d) const {
  size_t n = 0;
  for (size_t w = FirstWorker(d); w < EndWorker(d); ++w) n += workers_[w].busy() ? 0 : 1;
  return n;
}

int64_t Scheduler::ReservedBytesLocked(size_t d) const {
  int64_t n = 0;
  for (size_t w = FirstWorker(d); w < EndWorker(d); ++w) n = SatAdd(n, workers_[w].reserved_bytes);
  return n;
}

std::vector<DeviceLoad> Scheduler::LoadsLocked(const Job& job) const {
  std::vector<DeviceLoad> loads(pool_->size());
  for (size_t i = 0; i < loads.size(); ++i) {
    const Device& d = pool_->device(i);
    const DeviceStats stats = d.Stats();
    // The estimates of the single-device jobs running there (0 on an idle device): a job that
    // has not allocated yet may still take that much, one that has shows in used bytes.
    const int64_t running = ReservedBytesLocked(i);
    DeviceLoad& l = loads[i];
    l.index = i;
    l.device = &d;
    l.busy = FreeLanesLocked(i) == 0;  // a multi-device job waits for every lane (DispatchLocked)
    l.estimate_bytes = d.EstimateBytes(job.spec, job.shape, job.dtype);
    // Orders the devices a single job may take: least loaded first.
    l.used_bytes = std::max(stats.memory_used_bytes, running);
    if (options_.max_inflight_bytes) {
      l.budget_bytes = std::max<int64_t>(0, *options_.max_inflight_bytes - running);
      l.idle_budget_bytes = *options_.max_inflight_bytes;
    } else {
      // Free memory, less what the running jobs may still allocate (their estimates beyond what
      // they hold now): conservative, as the estimates are upper bounds. Idle: the free memory.
      const int64_t left = SatAdd(stats.memory_free_bytes, stats.memory_used_bytes) - running;
      l.budget_bytes = std::max<int64_t>(0, std::min(stats.memory_free_bytes, left));
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
    std::vector<size_t> group = decision->devices;
    std::sort(group.begin(), group.end());
    // A multi-device job other than a context-parallel one takes every lane of its devices (its
    // parts run on the lane-0 workers, which own the NCCL communicators): it waits for them all.
    // FIFO keeps anything behind it from starting meanwhile, so the lanes running now drain and
    // no single job overtakes it. A context-parallel job takes one lane of each device.
    const bool every_lane =
        group.size() > 1 && decision->placement != Placement::kContextParallel;
    for (size_t d : group) {
      const size_t free = FreeLanesLocked(d);
      if (free == 0 || (every_lane && free != EndWorker(d) - FirstWorker(d))) return;
    }
    const int64_t estimate = group.size() == 1 ? loads[group.front()].estimate_bytes : 0;
    std::vector<Device*> devices;
    for (size_t i : group) devices.push_back(&pool_->device(i));
    GroupEnv env;
    env.budget_bytes = [this, group](int rank) { return IdleBudget(group[rank]); };
    env.nccl_groups = nccl_groups_.get();
    env.cuda = options_.cuda;
    env.on_nccl_group_created = [this, names = devices] {
      std::vector<std::string> n;
      for (const Device* d : names) n.push_back(d->name());
      if (metrics_ != nullptr) metrics_->AddNcclGroupCreated();
      spdlog::info("GPU ring over {}: new NCCL group; its communicators are created by the "
                   "devices' workers and cached for later rings over the same devices",
                   absl::StrJoin(n, ","));
    };
    env.on_nccl_comm_created = [this, group](int rank) {
      if (metrics_ != nullptr) metrics_->AddNcclCommCreated(group[rank]);
      spdlog::info("{}: NCCL communicator rank {} of {} created", pool_->device(group[rank]).name(),
                   rank, group.size());
    };
    auto run = std::make_shared<GroupRun>(decision->placement, head.job, std::move(devices),
                                          std::move(env));
    ReserveLocked(run, head.job, group, every_lane, estimate, head.submitted);
    queue_.pop_front();
    if (metrics_ != nullptr) metrics_->SetQueueLength(static_cast<int64_t>(queue_.size()));
    cv_.notify_all();
  }
}

void Scheduler::ReserveLocked(const std::shared_ptr<GroupRun>& run,
                              const std::shared_ptr<Job>& job, const std::vector<size_t>& group,
                              bool every_lane, int64_t estimate, absl::Time submitted) {
  const uint64_t id = ++last_reservation_;
  for (size_t r = 0; r < group.size(); ++r) {
    const size_t d = group[r];
    size_t part = EndWorker(d);  // the lane that runs this rank's part
    for (size_t w = FirstWorker(d); w < EndWorker(d); ++w) {
      if (workers_[w].busy()) continue;  // never with every_lane: those devices are all free
      if (part == EndWorker(d)) part = w;
      if (!every_lane) break;
      workers_[w].reservation = id;
    }
    Worker& w = workers_[part];
    w.reservation = id;
    w.reserved_bytes = estimate;
    w.run = run;
    w.job = job;
    w.group = group;
    w.rank = static_cast<int>(r);
    w.submitted = submitted;
  }
}

void Scheduler::ReleaseLocked(uint64_t id, const std::vector<size_t>& group) {
  for (size_t d : group) {
    for (size_t w = FirstWorker(d); w < EndWorker(d); ++w) {
      Worker& worker = workers_[w];
      if (worker.reservation != id) continue;
      worker.reservation = 0;
      worker.reserved_bytes = 0;
      worker.group.clear();
    }
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
  // This worker's NCCL communicators (GPU rings, whose parts only lane 0 runs): destroyed here, on
  // this thread, when it exits.
  std::unique_ptr<WorkerComms, WorkerCommsDeleter> comms;
  if (workers_[index].lane == 0) comms = MakeWorkerComms();
  for (;;) {
    std::shared_ptr<GroupRun> run;
    std::shared_ptr<Job> job;
    std::vector<size_t> group;
    int rank = 0;
    uint64_t reservation = 0;
    absl::Time submitted;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return workers_[index].run != nullptr || stopping_; });
      if (workers_[index].run == nullptr) return;  // stopping, nothing assigned
      const Worker& w = workers_[index];
      run = w.run;
      job = w.job;
      group = w.group;
      rank = w.rank;
      reservation = w.reservation;
      submitted = w.submitted;
    }
    const bool last = run->RunPart(rank, comms.get());
    {
      // This worker's part is over; its lanes stay reserved (busy) until the whole group has
      // finished. A peer that finished last may already have released the group and handed this
      // worker its next part (this worker counted its part done inside RunPart, before taking
      // the lock): clear only the part just run, never the next one.
      std::lock_guard<std::mutex> lock(mu_);
      if (workers_[index].run == run) {
        workers_[index].run.reset();
        workers_[index].job.reset();
      }
    }
    if (!last) continue;
    Finish(*run, std::move(job), group, submitted);
    run.reset();
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked(reservation, group);
    DispatchLocked();
  }
}

void Scheduler::Finish(GroupRun& run, std::shared_ptr<Job> job, const std::vector<size_t>& group,
                       absl::Time submitted) {
  GroupResult g = run.Finish();
  JobResult result;
  result.status = std::move(g.status);
  result.outputs = std::move(g.outputs);
  result.info = std::move(g.info);
  result.placement = g.placement;
  for (int r : g.ranks_used) result.devices.push_back(pool_->device(group[r]).name());
  result.queue_seconds = run.start() == absl::InfiniteFuture()
                             ? 0
                             : absl::ToDoubleSeconds(run.start() - submitted);
  if (metrics_ != nullptr) {
    metrics_->ObserveQueueWait(result.queue_seconds);
    for (size_t r = 0; r < group.size(); ++r) {
      const RankFigures& f = g.ranks[r];
      metrics_->RecordRun(group[r], f.tokens, f.flops, f.busy_seconds);
      if (group.size() > 1) metrics_->RecordCommBytes(group[r], f.bytes_sent, f.bytes_received);
    }
  }
  auto done = std::move(job->done);
  job.reset();
  done(std::move(result));
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
  for (const Worker& w : workers_) n += w.run != nullptr ? 1 : 0;
  return n;
}

}  // namespace attnserve
