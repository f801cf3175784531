// Placement planner: which devices run a request, and how it is cut — one device, data parallel
// (batch x KV-head units over devices, no communication) or ring (sequence over devices). A pure
// function of its input, so it is unit-tested without devices and the scheduler can call it
// under its lock.
//
// Rules, in order (kAuto):
//   1. single, when the request fits on one device within the headroom and is small (its dense
//      work bound is below small_request_flops): splitting it would cost more than it saves;
//   2. data parallel, when there are at least as many units (B * Hkv / unit size) as devices used
//      (>= 2) and each device's share fits;
//   3. ring, when the sequence is too long for one device (or the work is large and batch x
//      heads too few to split) and each rank's shard fits;
//   4. single, when it fits at all;
//   5. RESOURCE_EXHAUSTED naming the bytes needed and the largest free.
// A request that is not square (IsSquare: a query offset, Nq != Nkv, packed sequences) is single
// or RESOURCE_EXHAUSTED; a data_parallel or ring hint for it is UNIMPLEMENTED.
// A hint other than kAuto is honoured when feasible; otherwise INVALID_ARGUMENT (the split does not
// exist: too few devices or units) or RESOURCE_EXHAUSTED (it exists but does not fit), naming why.
#ifndef ATTNSERVE_CORE_PARALLEL_PLANNER_H_
#define ATTNSERVE_CORE_PARALLEL_PLANNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/types.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/dtype.h"
#include "core/tensor/tensor.h"

namespace attnserve {


// Bytes one device needs to run `shape` (inputs, outputs, workspaces): Device::EstimateBytes.
using DeviceEstimateFn =
    std::function<int64_t(const AttentionSpec& spec, const AttentionShape& shape, DType dtype)>;

struct PlannerInput {
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype = DType::kBF16;
  std::vector<int64_t> free_bytes;  // per device, indexed by device number
  PlacementHint hint = PlacementHint::kAuto;
  DeviceEstimateFn estimate;  // required
  // Bytes one rank of a ring over `ranks` devices holds, as the ring that would run computes it
  // (GPU rings: EstimateRingCudaBytesPerRank, the sum of the buffer table its ranks allocate).
  // Unset: RingBytesPerRank, the device-agnostic bound (CPU rings).
  std::function<int64_t(int ranks)> ring_estimate;
  // A plan uses at most this fraction of a device's free bytes (allocator slack, fragmentation,
  // other requests admitted meanwhile).
  double headroom = 0.9;
  // Requests whose dense work bound 4 * B * Hq * D * N^2 (halved when causal) is below this stay on
  // one device when they fit. 2^36 FLOPs is ~0.1 ms of an H100's bf16 peak: below that the split,
  // the copies and a ring's P steps are overhead.
  double small_request_flops = 68719476736.0;
};

struct PlacementPlan {
  Placement placement = Placement::kSingle;
  std::vector<int> devices;       // devices used, in rank order
  int64_t bytes_per_device = 0;   // the largest per-device need of the plan
  int64_t kv_heads_per_unit = 1;  // data parallel: KV heads per unit (see SplitDataParallel)
  std::string reason;             // why this placement, for logs and the response header
};

// Pure; see the file comment. INVALID_ARGUMENT also for an empty device list or a missing
// estimate function.
absl::StatusOr<PlacementPlan> PlanPlacement(const PlannerInput& input);

// Bytes one ring rank needs when the input has no ring_estimate (CPU rings), for a sequence cut `ranks` ways: the device estimate of its shard (as
// if it were a request of ceil(N / ranks) tokens: inputs, outputs, workspaces) plus the second K/V
// buffer that double buffering adds and the float32 (O, LSE) accumulator of its query rows.
int64_t RingBytesPerRank(const PlannerInput& input, int ranks);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_PLANNER_H_
