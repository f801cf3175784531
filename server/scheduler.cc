#include "server/scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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

int64_t SatAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

}  // namespace

std::unique_ptr<PlacementPlanner> MakeSingleDevicePlanner() {
  return std::make_unique<SingleDevicePlanner>();
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
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-inflight-bytes: must be > 0 (0 / unset: device free memory), got ",
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
      workers_(pool->size()) {}

Scheduler::~Scheduler() { Shutdown(); }

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
    return absl::ResourceExhaustedError(absl::StrCat("queue: ", queue_.size(),
                                                     " requests waiting (limit --max-queue=",
                                                     options_.max_queue, ")"));
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
    const size_t leader = decision->devices.front();
    for (size_t i : decision->devices) workers_[i].busy = true;
    Worker& w = workers_[leader];
    w.job = head.job;
    w.group = decision->devices;
    w.placement = decision->placement;
    w.submitted = head.submitted;
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
  for (;;) {
    std::shared_ptr<Job> job;
    std::vector<size_t> group;
    v1::Placement placement;
    absl::Time submitted;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return workers_[index].job != nullptr || stopping_; });
      if (workers_[index].job == nullptr) return;  // stopping, nothing assigned
      job = workers_[index].job;
      group = workers_[index].group;
      placement = workers_[index].placement;
      submitted = workers_[index].submitted;
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
          metrics_->RecordRun(index,
                              static_cast<double>(job->shape.batch) *
                                  static_cast<double>(job->shape.tokens),
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
