// Data parallel: batch x KV-head units split over devices, no communication. The one split, and
// the one gather (a device's share of Q/K/V) and scatter (its O/LSE back into the request's
// outputs), used both by the in-process DataParallelAttention and by the server's group runs.
#ifndef ATTNSERVE_CORE_PARALLEL_DATA_PARALLEL_H_
#define ATTNSERVE_CORE_PARALLEL_DATA_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/types.h"
#include "core/parallel/ring_schedule.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// Work is cut into units of (batch item, block of `kv_heads_per_unit` consecutive KV heads with
// their g query heads). One unit is one KV head, except for dilated specs, where the head offset
// h mod r must survive renumbering: a unit is the smallest block of KV heads whose query-head
// count is a multiple of every dilation rate (all of Hkv when none is).
struct DataParallelSplit {
  int64_t kv_heads_per_unit = 1;
  int64_t units = 0;                   // B * Hkv / kv_heads_per_unit
  std::vector<TokenRange> per_device;  // unit ranges, contiguous, first units % P one longer
};
DataParallelSplit SplitDataParallel(const AttentionSpec& spec, const AttentionShape& shape,
                                    int devices);

// One device's share of a request: q [U, N, c*g, D], k/v [U, N, c, D] for its U units.
struct DataParallelShare {
  HostTensor q, k, v;
};
// Copies the units `units` of (q, k, v) out of the request's tensors into tensors allocated from
// `memory` (the device's Device::host_memory(), page-locked on a GPU, so the device copies the
// share asynchronously; null: plain memory). `tracker` may be null.
absl::StatusOr<DataParallelShare> GatherShare(const DataParallelSplit& split, TokenRange units,
                                              const HostTensor& q, const HostTensor& k,
                                              const HostTensor& v, MemoryTracker* tracker,
                                              HostMemory* memory);
// Writes a share's outputs (O [U, N, c*g, D], LSE [U, c*g, N]) into the request's O [B, N, Hq, D]
// and LSE [B, Hq, N]. INTERNAL when the share's outputs do not have the share's shape.
absl::Status ScatterShare(TokenRange units, const AttentionOutputs& part, HostTensor& o,
                          HostTensor& lse);

// The attention a device runs on its share.
using DeviceAttentionFn = std::function<absl::StatusOr<AttentionOutputs>(
    int device, const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
    const HostTensor& v)>;

// Splits, runs `fn` for every device with work on its own thread, and scatters the shares back
// into O [B, N, Hq, D] and LSE [B, Hq, N]. INVALID_ARGUMENT when devices < 1.
absl::StatusOr<AttentionOutputs> DataParallelAttention(const AttentionSpec& spec,
                                                       const HostTensor& q, const HostTensor& k,
                                                       const HostTensor& v, int devices,
                                                       const DeviceAttentionFn& fn,
                                                       MemoryTracker* tracker = nullptr);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_DATA_PARALLEL_H_
