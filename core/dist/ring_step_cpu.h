// One ring step on a CPU worker: attention of the local query rows against the visiting key/value
// rows, over a RectLayout whose masks are evaluated on global positions, merged into the rank's
// float32 (O, LSE) accumulator with the LSE rule.
//
// This is the CPU analogue of the device-pointer entry point the CUDA backend offers for ring
// steps. It lives here (not in core/cpu) because CpuAttentionCompiled runs a square BlockLayout
// whose queries and keys share one axis from position 0; the ring needs query rows [q0, q1)
// against key rows [k0, k1). See the report accompanying core/dist for the core/cpu addition that
// would let this call the CPU backend's tile loop instead.
#ifndef ATTNSERVE_CORE_DIST_RING_STEP_CPU_H_
#define ATTNSERVE_CORE_DIST_RING_STEP_CPU_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/dist/rect_layout.h"
#include "core/util/thread_pool.h"

namespace attnserve {

// A query head and the key/value head it reads, as indices into the step's buffers.
struct HeadPair {
  int32_t q_head = 0;
  int32_t kv_head = 0;
};

// Buffers are float32, row-major [B, rows, heads, D] ("shard" layout). Nothing is owned.
struct RingStepArgs {
  const RectLayout* layout = nullptr;
  int64_t batch = 0;
  int64_t head_dim = 0;
  float scale = 0.f;  // the effective softmax scale

  const float* q = nullptr;  // [B, q_rows, q_heads, D]
  int64_t q_rows = 0;
  int64_t q_heads = 0;
  int64_t q_row0 = 0;  // buffer row of the layout's first query (q_begin)

  const float* k = nullptr;  // [B, kv_rows, kv_heads, D]
  const float* v = nullptr;  // same shape as k
  int64_t kv_rows = 0;
  int64_t kv_heads = 0;
  int64_t k_row0 = 0;  // buffer row of the layout's first key (k_begin)

  // Heads to compute; each q_head at most once (work items write disjoint rows).
  const std::vector<HeadPair>* heads = nullptr;

  float* acc_o = nullptr;    // [B, q_rows, q_heads, D]: merged into, rows of this step only
  float* acc_lse = nullptr;  // [B, q_heads, q_rows]
};

// Runs the step; work items (batch, head, query tile) are spread over `pool` (null: the calling
// thread). CANCELLED when *cancel reads true between items.
absl::Status RingStepCpu(const RingStepArgs& args, ThreadPool* pool,
                         const std::atomic<bool>* cancel);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_DIST_RING_STEP_CPU_H_
