// Placement policies: which free devices run the request at the head of the scheduler's queue,
// from each device's load at that moment. The scheduler (server/) asks; the policy answers with
// core types only. MakeMultiDevicePlanner wraps PlanPlacement (planner.h) for the device pool.
#ifndef ATTNSERVE_CORE_PARALLEL_PLACEMENT_POLICY_H_
#define ATTNSERVE_CORE_PARALLEL_PLACEMENT_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/engine/device.h"
#include "core/engine/types.h"

namespace attnserve {

// A device as the policy sees it at one moment.
struct DeviceLoad {
  size_t index = 0;
  const Device* device = nullptr;
  bool busy = false;
  int64_t estimate_bytes = 0;     // the request's Device::EstimateBytes on this device
  int64_t budget_bytes = 0;       // what the request may use there now
  int64_t idle_budget_bytes = 0;  // what it could use once the device is idle
  int64_t used_bytes = 0;         // DeviceStats::memory_used_bytes
};

struct PlacementDecision {
  Placement placement = Placement::kSingle;
  std::vector<size_t> devices;  // indices into the pool
};

class PlacementPlanner {
 public:
  virtual ~PlacementPlanner() = default;
  // A placement for `request` on devices that are free now, or nullopt to wait.
  virtual std::optional<PlacementDecision> Place(const AttentionRequest& request,
                                                 absl::Span<const DeviceLoad> loads) = 0;
  // OK when some placement could run `request` once the devices are idle; otherwise the error to
  // fail it with right away (RESOURCE_EXHAUSTED "device memory: ...").
  virtual absl::Status Feasible(const AttentionRequest& request,
                                absl::Span<const DeviceLoad> loads) = 0;
};

// One device: the idle device whose estimate fits its budget, least used memory first. A request
// with tensors in a GPU's memory (AttentionRequest::device_io) is placed on that GPU's device only
// (both policies); FAILED_PRECONDITION from Feasible when the pool has no such device. A request
// whose keys are split over devices (AttentionRequest::key_shards) runs context parallel on
// exactly those devices (both policies).
std::unique_ptr<PlacementPlanner> MakeSingleDevicePlanner();

// PlanPlacement over the pool, with the request's hint: single (then run on the idle device that
// fits, as MakeSingleDevicePlanner), data parallel or ring over the plan's devices, which start
// together once all of them are idle and their budgets fit the plan's per-device bytes. Plans as
// if every device were idle (idle budgets, headroom 1: the budgets are already what a request may
// use). With one device every request is single, whatever the hint.
std::unique_ptr<PlacementPlanner> MakeMultiDevicePlanner();

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_PLACEMENT_POLICY_H_
