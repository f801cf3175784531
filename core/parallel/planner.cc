#include "core/parallel/planner.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/ring.h"
#include "core/util/check.h"

namespace attnserve {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Devices ordered by free bytes, most first (ties: lower index first).
std::vector<int> ByFreeBytes(const std::vector<int64_t>& free) {
  std::vector<int> order(free.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return free[a] > free[b]; });
  return order;
}

int64_t Capacity(const PlannerInput& in, int device) {
  return static_cast<int64_t>(static_cast<double>(in.free_bytes[device]) * in.headroom);
}

double DenseWorkBound(const AttentionSpec& spec, const AttentionShape& s) {
  const double n = static_cast<double>(s.tokens);
  const double flops = 4.0 * s.batch * s.q_heads * s.head_dim * n * n;
  return spec.causal ? flops / 2 : flops;
}

// A plain flag plus value rather than std::optional<PlacementPlan>: GCC 12 warns (falsely) about
// the optional's string member being used uninitialised.
struct Attempt {
  bool ok = false;
  PlacementPlan plan;
  int64_t best_need = 0;  // smallest per-device need among the splits tried, for messages
};

Attempt TrySingle(const PlannerInput& in, const std::vector<int>& order) {
  Attempt a;
  a.best_need = in.estimate(in.spec, in.shape, in.dtype);
  if (a.best_need <= Capacity(in, order[0])) {
    a.ok = true;
    a.plan = PlacementPlan{Placement::kSingle, {order[0]}, a.best_need, 1, ""};
  }
  return a;
}

// Largest device count in [2, max_devices] whose share fits on that many of the freest devices.
template <typename NeedFn>
Attempt TrySplit(const PlannerInput& in, const std::vector<int>& order, int max_devices,
                 Placement placement, NeedFn need_for) {
  Attempt a;
  a.best_need = -1;
  for (int p = max_devices; p >= 2; --p) {
    const int64_t need = need_for(p);
    if (a.best_need < 0 || need < a.best_need) a.best_need = need;
    if (need <= Capacity(in, order[p - 1])) {
      PlacementPlan plan;
      plan.placement = placement;
      plan.devices.assign(order.begin(), order.begin() + p);
      plan.bytes_per_device = need;
      a.ok = true;
      a.plan = std::move(plan);
      return a;
    }
  }
  return a;
}

}  // namespace

int64_t RingBytesPerRank(const PlannerInput& in, int ranks) {
  const AttentionShape& s = in.shape;
  AttentionShape shard = s;
  shard.tokens = CeilDiv(s.tokens, ranks);
  // The shard is estimated as a dense request of its length: a rank runs one piece at a time,
  // and no piece's layout exceeds a dense one of the shard's length.
  AttentionSpec dense;
  dense.causal = in.spec.causal;
  dense.scale = in.spec.scale;
  const int64_t esize = static_cast<int64_t>(DTypeSize(in.dtype));
  const int64_t second_kv = 2 * s.batch * shard.tokens * s.kv_heads * s.head_dim * esize;
  const int64_t accumulator =
      s.batch * shard.tokens * s.q_heads * (s.head_dim + 1) * static_cast<int64_t>(sizeof(float));
  return in.estimate(dense, shard, in.dtype) + second_kv + accumulator;
}

absl::StatusOr<PlacementPlan> PlanPlacement(const PlannerInput& in) {
  if (in.free_bytes.empty()) {
    return absl::InvalidArgumentError("placement: no devices to place the request on");
  }
  if (!in.estimate) return absl::InvalidArgumentError("placement: no estimate function");
  ATTN_DCHECK_OK(ValidateShape(in.shape));  // validated where the request entered
  const std::vector<int> order = ByFreeBytes(in.free_bytes);
  const int devices = static_cast<int>(order.size());
  const AttentionShape& s = in.shape;
  const DataParallelSplit dp_split = SplitDataParallel(in.spec, s, 1);
  const int64_t units = dp_split.units;
  const int64_t c = dp_split.kv_heads_per_unit;

  auto dp_need = [&](int p) {
    AttentionShape share = s;
    share.batch = CeilDiv(units, p);
    share.q_heads = c * (s.q_heads / s.kv_heads);
    share.kv_heads = c;
    return in.estimate(in.spec, share, in.dtype);
  };
  auto ring_need = [&](int p) {
    return in.ring_estimate ? in.ring_estimate(p) : RingBytesPerRank(in, p);
  };
  auto finish = [](Attempt a, std::string reason) {
    a.plan.reason = std::move(reason);
    return std::move(a.plan);
  };
  auto no_fit = [&](const char* what, int64_t need) {
    return absl::ResourceExhaustedError(
        absl::StrCat("placement: ", what, " needs ", need,
                     " bytes per device, the freest device has ", Capacity(in, order[0]),
                     " usable (", in.free_bytes[order[0]], " free x headroom ", in.headroom, ")"));
  };
  const int max_dp = static_cast<int>(std::min<int64_t>(devices, units));

  // Data parallel shares copy the same token rows of q, k and v, and a ring cuts one sequence
  // axis shared by queries and keys: a request that is not square runs on one device.
  if (!IsSquare(in.spec, s)) {
    if (in.hint == PlacementHint::kDataParallel || in.hint == PlacementHint::kRing) {
      return absl::UnimplementedError(absl::StrCat(
          "placement: ", in.hint == PlacementHint::kRing ? "ring" : "data_parallel",
          " is not yet for Nq != Nkv, a query offset or packed sequences (", s.tokens,
          " queries at offset ", in.spec.q_offset, " against ", s.kv_len(), " keys",
          IsPacked(in.spec) ? ", packed" : "", "); use single"));
    }
    Attempt a = TrySingle(in, order);
    if (!a.ok) return no_fit("single-device placement", a.best_need);
    return finish(std::move(a), "not square (Nq != Nkv, a query offset or packed): one device");
  }

  switch (in.hint) {
    case PlacementHint::kSingle: {
      Attempt a = TrySingle(in, order);
      if (!a.ok) return no_fit("single-device placement", a.best_need);
      return finish(std::move(a), "placement hint: single");
    }
    case PlacementHint::kDataParallel: {
      if (max_dp < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "placement: data_parallel needs >= 2 devices and >= 2 units of batch x kv heads (",
            units, " units of ", c, " kv heads), have ", devices, " devices"));
      }
      Attempt a = TrySplit(in, order, max_dp, Placement::kDataParallel, dp_need);
      if (!a.ok) return no_fit("data_parallel placement", a.best_need);
      a.plan.kv_heads_per_unit = c;
      return finish(std::move(a), "placement hint: data_parallel");
    }
    case PlacementHint::kRing: {
      if (devices < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement: ring needs >= 2 devices, have ", devices));
      }
      Attempt a = TrySplit(in, order, devices, Placement::kRing, ring_need);
      if (!a.ok) return no_fit("ring placement", a.best_need);
      return finish(std::move(a), "placement hint: ring");
    }
    case PlacementHint::kAuto:
      break;
  }

  Attempt single = TrySingle(in, order);
  const bool small = DenseWorkBound(in.spec, s) < in.small_request_flops;
  if (single.ok && small) {
    return finish(std::move(single), "fits on one device and is small");
  }
  if (devices >= 2 && units >= devices) {
    Attempt a = TrySplit(in, order, devices, Placement::kDataParallel, dp_need);
    if (a.ok && a.plan.devices.size() == static_cast<size_t>(devices)) {
      a.plan.kv_heads_per_unit = c;
      return finish(std::move(a),
                    absl::StrCat(units, " batch x kv-head units over ", devices, " devices"));
    }
  }
  if (devices >= 2) {
    Attempt a = TrySplit(in, order, devices, Placement::kRing, ring_need);
    if (a.ok) {
      return finish(std::move(a), single.ok ? "large request with too few batch x kv-head "
                                              "units to split: sequence over devices"
                                            : "sequence too long for one device");
    }
  }
  if (single.ok) return finish(std::move(single), "fits on one device; no split fits");
  return no_fit("every placement (single, data_parallel, ring)", single.best_need);
}

}  // namespace attnserve
