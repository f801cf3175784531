#include "core/parallel/group_run.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/parallel/communicator.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/ring.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

double RequestTokens(const AttentionShape& s) {
  return static_cast<double>(s.batch) * static_cast<double>(s.tokens);
}

// One device runs the whole request.
class SingleStrategy final : public GroupStrategy {
 public:
  explicit SingleStrategy(AttentionRequest& request) : request_(request) {}

  absl::Status RunRank(int, Device& device, WorkerComms*, RankFigures& figures) override {
    if (request_.device_io.any()) {
      // Tensors in this GPU's memory (the placement pinned the request here): read and written
      // in place; outputs named by the caller are written where it said, nothing returned.
      AttentionOutputs* into = &request_.outputs_into;
      ATTN_ASSIGN_OR_RETURN(AttentionOutputs out,
                            device.RunWithDeviceIo(request_.spec, request_.shape, request_.dtype,
                                                   request_.q, request_.k, request_.v,
                                                   request_.device_io, request_.control(), &info_,
                                                   into));
      const bool written = !request_.device_io.o.empty() || !request_.outputs_into.o.empty();
      if (!written) outputs_ = std::move(out);
    } else if (!request_.outputs_into.o.empty()) {
      // The caller named memory for the outputs: written there, nothing returned.
      ATTN_RETURN_IF_ERROR(device.RunInto(request_.spec, request_.q, request_.k, request_.v,
                                          request_.control(), &info_, request_.outputs_into));
    } else {
      ATTN_ASSIGN_OR_RETURN(outputs_, device.Run(request_.spec, request_.q, request_.k,
                                                 request_.v, request_.control(), &info_));
    }
    figures.tokens = RequestTokens(request_.shape);
    figures.flops = info_.flops;
    return absl::OkStatus();
  }

  absl::Status Collect(GroupResult& result) override {
    result.outputs = std::move(outputs_);
    result.info = info_;
    result.placement = Placement::kSingle;
    result.ranks_used = {0};
    return absl::OkStatus();
  }

 private:
  AttentionRequest& request_;
  AttentionOutputs outputs_;
  RunInfo info_;
};

// Batch x KV-head units over the devices: each rank gathers its share into its device's host
// memory (page-locked on a GPU), runs it on its device and scatters O/LSE into the request's
// outputs (disjoint regions, so no lock). O/LSE come from the host memory of the first rank to
// arrive (SetUp sees no device; every device of a group has the same kind, so any rank's is the
// group's), allocated once before any rank scatters.
class DataParallelStrategy final : public GroupStrategy {
 public:
  DataParallelStrategy(AttentionRequest& request, int ranks)
      : request_(request), ranks_(ranks), infos_(ranks) {}

  absl::Status SetUp() override {
    split_ = SplitDataParallel(request_.spec, request_.shape, ranks_);
    return absl::OkStatus();
  }

  absl::Status RunRank(int rank, Device& device, WorkerComms*, RankFigures& figures) override {
    HostMemory* memory = &device.host_memory();
    std::call_once(outputs_once_, [&] {
      const AttentionShape& s = request_.shape;
      absl::StatusOr<HostTensor> o =
          HostTensor::Create(request_.q.dtype(), request_.q.dims(), nullptr, memory);
      absl::StatusOr<HostTensor> lse =
          HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens}, nullptr, memory);
      outputs_status_ = !o.ok() ? o.status() : lse.status();
      if (outputs_status_.ok()) {
        o_ = *std::move(o);
        lse_ = *std::move(lse);
      }
    });
    ATTN_RETURN_IF_ERROR(outputs_status_);
    const TokenRange units = split_.per_device[rank];
    if (units.size() == 0) return absl::OkStatus();
    ATTN_ASSIGN_OR_RETURN(
        DataParallelShare share,
        GatherShare(split_, units, request_.q, request_.k, request_.v, nullptr, memory));
    ATTN_ASSIGN_OR_RETURN(
        AttentionOutputs part,
        device.Run(request_.spec, share.q, share.k, share.v, request_.control(), &infos_[rank]));
    ATTN_RETURN_IF_ERROR(ScatterShare(units, part, o_, lse_));
    figures.tokens = static_cast<double>(units.size()) * static_cast<double>(request_.shape.tokens);
    figures.flops = infos_[rank].flops;
    return absl::OkStatus();
  }

  absl::Status Collect(GroupResult& result) override {
    result.outputs = AttentionOutputs{std::move(o_), std::move(lse_)};
    result.placement = Placement::kDataParallel;
    for (int r = 0; r < ranks_; ++r) result.ranks_used.push_back(r);
    for (int r = 0; r < ranks_; ++r) {
      if (split_.per_device[r].size() > 0) {
        result.info.sparsity = infos_[r].sparsity;
        result.info.engine = infos_[r].engine;
        result.info.kernel = infos_[r].kernel;
        break;
      }
    }
    return absl::OkStatus();
  }

 private:
  AttentionRequest& request_;
  const int ranks_;
  DataParallelSplit split_;
  std::once_flag outputs_once_;
  absl::Status outputs_status_;  // written once under outputs_once_
  HostTensor o_, lse_;
  std::vector<RunInfo> infos_;
};

// The sequence over CPU devices: one RingRun, in-process communicators, each rank on its device's
// thread pool with its share of the memory charged to that device while it runs.
class CpuRingStrategy final : public GroupStrategy {
 public:
  CpuRingStrategy(AttentionRequest& request, int ranks) : request_(request), ranks_(ranks) {}

  absl::Status SetUp() override {
    RingOptions options;
    options.cancel = &request_.cancel;
    options.deadline = request_.deadline;
    ATTN_ASSIGN_OR_RETURN(
        ring_, RingRun::Create(request_.spec, request_.q, request_.k, request_.v, ranks_, options));
    ATTN_ASSIGN_OR_RETURN(comms_, InProcessCommGroup::Create(ranks_));
    return absl::OkStatus();
  }

  absl::Status RunRank(int rank, Device& device, WorkerComms*, RankFigures& figures) override {
    AttentionShape shard = request_.shape;
    shard.tokens = (shard.tokens + ranks_ - 1) / ranks_;
    const int64_t bytes = device.EstimateBytes(request_.spec, shard, request_.dtype);
    Communicator& comm = *comms_->comm(rank);
    ATTN_RETURN_IF_ERROR(
        device.RunTask(bytes, [&](DeviceContext& ctx) { return ring_->RunRank(comm, ctx.pool); }));
    figures.tokens = RequestTokens(request_.shape) / ranks_;
    return absl::OkStatus();
  }

  void Abort(const absl::Status& status) override {
    if (comms_ != nullptr) comms_->Abort(status);
  }

  absl::Status Collect(GroupResult& result) override {
    ATTN_ASSIGN_OR_RETURN(result.outputs, ring_->TakeOutputs());
    std::vector<int64_t> admitted;
    for (const RingRankStats& st : ring_->stats()) admitted.push_back(st.admitted_pairs);
    result.info.sparsity = RingFigures(request_.shape, admitted, result.ranks);
    const std::vector<RingRankStats>& stats = ring_->stats();
    for (int r = 0; r < ranks_ && r < static_cast<int>(stats.size()); ++r) {
      result.ranks[r].bytes_sent = stats[r].bytes_sent;
      result.ranks[r].bytes_received = stats[r].bytes_received;
    }
    result.placement = Placement::kRing;
    for (int r = 0; r < ranks_; ++r) result.ranks_used.push_back(r);
    return absl::OkStatus();
  }

 private:
  AttentionRequest& request_;
  const int ranks_;
  std::unique_ptr<RingRun> ring_;
  std::unique_ptr<InProcessCommGroup> comms_;
};

// The root cause of a failed run: a failed rank aborts its peers with its own status, so the first
// error in rank order that is not a consequence (CANCELLED/ABORTED) wins, else the first error.
absl::Status RootCause(const std::vector<absl::Status>& status) {
  absl::Status cause;
  for (const absl::Status& st : status) {
    if (st.ok()) continue;
    if (cause.ok()) cause = st;
    if (!absl::IsCancelled(st) && !absl::IsAborted(st)) return st;
  }
  return cause;
}

}  // namespace

double RingFigures(const AttentionShape& s, const std::vector<int64_t>& admitted,
                   std::vector<RankFigures>& ranks) {
  const double d = static_cast<double>(s.head_dim);
  double pairs = 0;
  for (size_t r = 0; r < ranks.size() && r < admitted.size(); ++r) {
    ranks[r].flops = 4.0 * d * static_cast<double>(admitted[r]);
    pairs += static_cast<double>(admitted[r]);
  }
  const double full = static_cast<double>(s.batch) * static_cast<double>(s.q_heads) *
                      static_cast<double>(s.tokens) * static_cast<double>(s.tokens);
  return full > 0 ? std::clamp(1.0 - pairs / full, 0.0, 1.0) : 0.0;
}

absl::Status StartStatus(const AttentionRequest& request, absl::Time now) {
  if (request.cancel.load()) {
    return now >= request.deadline ? absl::DeadlineExceededError("deadline passed while queued")
                                   : absl::CancelledError("cancelled while queued");
  }
  if (now >= request.deadline) return absl::DeadlineExceededError("deadline passed while queued");
  return absl::OkStatus();
}

std::unique_ptr<GroupStrategy> MakeSingleStrategy(AttentionRequest& request) {
  return std::make_unique<SingleStrategy>(request);
}
std::unique_ptr<GroupStrategy> MakeDataParallelStrategy(AttentionRequest& request, int ranks) {
  return std::make_unique<DataParallelStrategy>(request, ranks);
}
std::unique_ptr<GroupStrategy> MakeCpuRingStrategy(AttentionRequest& request, int ranks) {
  return std::make_unique<CpuRingStrategy>(request, ranks);
}

GroupRun::GroupRun(Placement placement, std::shared_ptr<AttentionRequest> request,
                   std::vector<Device*> devices, GroupEnv env)
    : placement_(placement),
      request_(std::move(request)),
      devices_(std::move(devices)),
      env_(std::move(env)),
      remaining_(static_cast<int>(devices_.size())),
      status_(devices_.size()),
      figures_(devices_.size()) {
  const int ranks = static_cast<int>(devices_.size());
  if (placement_ == Placement::kContextParallel) {
    strategy_ = MakeContextParallelStrategy(*request_, devices_, env_);
  } else if (placement_ == Placement::kSingle || ranks == 1) {
    strategy_ = MakeSingleStrategy(*request_);
  } else if (placement_ == Placement::kDataParallel) {
    strategy_ = MakeDataParallelStrategy(*request_, ranks);
  } else if (devices_.front()->kind() == BackendKind::kCpu) {
    strategy_ = MakeCpuRingStrategy(*request_, ranks);
  } else {
    strategy_ = MakeGpuRingStrategy(*request_, devices_, env_);
  }
}

GroupRun::~GroupRun() = default;

bool GroupRun::RunPart(int rank, WorkerComms* comms) {
  AttentionRequest& request = *request_;
  const absl::Time start = absl::Now();
  if (rank == 0) start_ = start;
  std::call_once(setup_once_, [&] {
    setup_status_ = StartStatus(request, start);
    if (setup_status_.ok()) setup_status_ = strategy_->SetUp();
  });
  absl::Status st = setup_status_;
  if (st.ok()) st = StartStatus(request, start);
  if (st.ok()) st = strategy_->RunRank(rank, *devices_[rank], comms, figures_[rank]);
  if (!st.ok() && request.cancel.load() && absl::Now() >= request.deadline &&
      (absl::IsCancelled(st) || absl::IsAborted(st))) {
    st = absl::DeadlineExceededError("deadline passed while running");
  }
  // A rank that failed (or never started) releases its peers at once: those in a transfer or a
  // communicator's creation see the abort at their next poll.
  if (!st.ok()) strategy_->Abort(st);
  status_[rank] = st;
  figures_[rank].busy_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

GroupResult GroupRun::Finish() {
  GroupResult result;
  result.ranks = figures_;
  result.placement = placement_;
  result.status = RootCause(status_);
  if (result.status.ok()) result.status = strategy_->Collect(result);
  if (!result.status.ok()) {
    result.outputs = AttentionOutputs();
    result.ranks_used.clear();
    for (int r = 0; r < ranks(); ++r) result.ranks_used.push_back(r);
    for (RankFigures& f : result.ranks) f.tokens = f.flops = 0;
  }
  result.info.flops = 0;
  for (const RankFigures& f : result.ranks) {
    result.info.compute_seconds = std::max(result.info.compute_seconds, f.busy_seconds);
    result.info.flops += f.flops;
  }
  // Release everything the run held before reporting: the strategy's buffers and groups, the
  // request's inputs.
  strategy_.reset();
  request_->ReleaseInputs();
  return result;
}

}  // namespace attnserve
