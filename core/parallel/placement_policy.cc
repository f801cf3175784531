#include "core/parallel/placement_policy.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/parallel/planner.h"
#include "core/parallel/ring_cuda_plan.h"

namespace attnserve {
namespace {

// A request with tensors in a GPU's memory (DeviceIo) runs on that GPU only. So does one that is
// not square (IsSquare: a query offset, Nq != Nkv, packed sequences), which no split handles yet.
bool Eligible(const AttentionRequest& request, const DeviceLoad& load) {
  const int pinned = request.device_io.cuda_ordinal();
  return pinned < 0 || load.device->cuda_ordinal() == pinned;
}

// A request whose keys are split by sequence over devices (a sharded context) runs on exactly
// those devices, together, once each has a free lane (it takes one lane of each). Its memory is Q
// and the partial outputs on each device (the keys are already there), so admission waits for
// the lanes only.
std::optional<PlacementDecision> PlaceContextParallel(const AttentionRequest& request,
                                                      absl::Span<const DeviceLoad> loads) {
  PlacementDecision d;
  d.placement = Placement::kContextParallel;
  for (const KeyShard& shard : request.key_shards) {
    if (shard.device >= loads.size() || loads[shard.device].busy) return std::nullopt;
    d.devices.push_back(shard.device);
  }
  return d;
}

absl::Status ContextParallelFeasible(const AttentionRequest& request,
                                     absl::Span<const DeviceLoad> loads) {
  for (const KeyShard& shard : request.key_shards) {
    if (shard.device >= loads.size() || loads[shard.device].index != shard.device) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the request's keys are on device ", shard.device, ", which this server does not run"));
    }
  }
  return absl::OkStatus();
}

class SingleDevicePlanner final : public PlacementPlanner {
 public:
  std::optional<PlacementDecision> Place(const AttentionRequest& request,
                                         absl::Span<const DeviceLoad> loads) override {
    if (!request.key_shards.empty()) return PlaceContextParallel(request, loads);
    const DeviceLoad* best = nullptr;
    for (const DeviceLoad& l : loads) {
      if (!Eligible(request, l) || l.busy || l.estimate_bytes > l.budget_bytes) continue;
      if (best == nullptr || l.used_bytes < best->used_bytes) best = &l;
    }
    if (best == nullptr) return std::nullopt;
    return PlacementDecision{Placement::kSingle, {best->index}};
  }

  absl::Status Feasible(const AttentionRequest& request,
                        absl::Span<const DeviceLoad> loads) override {
    if (!request.key_shards.empty()) return ContextParallelFeasible(request, loads);
    int64_t best_budget = 0;
    bool any_eligible = false;
    for (const DeviceLoad& l : loads) {
      if (!Eligible(request, l)) continue;
      any_eligible = true;
      if (l.estimate_bytes <= l.idle_budget_bytes) return absl::OkStatus();
      best_budget = std::max(best_budget, l.idle_budget_bytes);
    }
    if (!any_eligible) {
      return absl::FailedPreconditionError(
          absl::StrCat("the request's tensors are on cuda:", request.device_io.cuda_ordinal(),
                       ", which this server does not run on"));
    }
    const int64_t need = loads.empty() ? 0 : loads.front().estimate_bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "device memory: the request needs about ", need, " bytes on one device (inputs, outputs ",
        "and workspaces), more than any device can give it (largest budget ", best_budget,
        " bytes; see --max-inflight-bytes)"));
  }
};

class MultiDevicePlanner final : public PlacementPlanner {
 public:
  std::optional<PlacementDecision> Place(const AttentionRequest& request,
                                         absl::Span<const DeviceLoad> loads) override {
    if (loads.size() <= 1 || request.device_io.any() || !request.key_shards.empty() ||
        !IsSquare(request.spec, request.shape)) {
      return single_.Place(request, loads);
    }
    absl::StatusOr<PlacementPlan> plan = Plan(request, loads);
    // A plan that fails now (free memory changed since Submit) or is single: one device.
    if (!plan.ok() || plan->placement == Placement::kSingle || plan->devices.size() < 2) {
      return single_.Place(request, loads);
    }
    PlacementDecision d;
    d.placement = plan->placement;
    for (int i : plan->devices) {
      const DeviceLoad& l = loads[static_cast<size_t>(i)];
      if (l.busy || plan->bytes_per_device > l.budget_bytes) return std::nullopt;  // wait
      d.devices.push_back(static_cast<size_t>(i));
    }
    return d;
  }

  absl::Status Feasible(const AttentionRequest& request,
                        absl::Span<const DeviceLoad> loads) override {
    if (loads.size() <= 1 || request.device_io.any() || !request.key_shards.empty() ||
        !IsSquare(request.spec, request.shape)) {
      return single_.Feasible(request, loads);
    }
    absl::StatusOr<PlacementPlan> plan = Plan(request, loads);
    if (plan.ok()) return absl::OkStatus();
    if (absl::IsResourceExhausted(plan.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device memory: ", plan.status().message(), " (see --max-inflight-bytes)"));
    }
    return plan.status();
  }

 private:
  static absl::StatusOr<PlacementPlan> Plan(const AttentionRequest& request,
                                            absl::Span<const DeviceLoad> loads) {
    PlannerInput in;
    in.spec = request.spec;
    in.shape = request.shape;
    in.dtype = request.dtype;
    in.hint = request.placement_hint;
    in.headroom = 1.0;
    for (const DeviceLoad& l : loads) in.free_bytes.push_back(l.idle_budget_bytes);
    const Device* device = loads.front().device;
    in.estimate = [device](const AttentionSpec& spec, const AttentionShape& shape, DType dtype) {
      return device->EstimateBytes(spec, shape, dtype);
    };
    if (device->kind() == BackendKind::kCuda) {
      // A GPU ring picks its schedule to fit the smallest budget, so it is admitted by the bytes
      // of that schedule's buffer table (the one its ranks allocate), not by a generic bound.
      int64_t budget = std::numeric_limits<int64_t>::max();
      for (const DeviceLoad& l : loads) budget = std::min(budget, l.idle_budget_bytes);
      // Called only inside PlanPlacement(in) below, while `request` and `in` are alive: captured
      // by reference, so a large CSR spec is not copied on every dispatch.
      in.ring_estimate = [&request, &in, budget](int ranks) {
        RingCudaPlanOptions options;
        options.device_memory_budget = std::max<int64_t>(budget, 1);
        options.cudnn_pieces = true;  // the larger of the two piece engines' needs
        absl::StatusOr<int64_t> bytes = EstimateRingCudaBytesPerRank(request.spec, request.shape,
                                                                     request.dtype, ranks, options);
        // Specs a GPU ring cannot split run as the dilated composition or on one device
        // (gpu_ring.cc), which the generic bound covers.
        return bytes.ok() ? *bytes : RingBytesPerRank(in, ranks);
      };
    }
    return PlanPlacement(in);
  }

  SingleDevicePlanner single_;
};

}  // namespace

std::unique_ptr<PlacementPlanner> MakeSingleDevicePlanner() {
  return std::make_unique<SingleDevicePlanner>();
}

std::unique_ptr<PlacementPlanner> MakeMultiDevicePlanner() {
  return std::make_unique<MultiDevicePlanner>();
}

}  // namespace attnserve
