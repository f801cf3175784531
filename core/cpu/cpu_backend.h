// The CPU backend: tiled online softmax over the compiled BlockLayout, float32 accumulation, tile
// GEMMs through Eigen, spread over a thread pool. Executes the same layout the GPU kernels run.
//
// Two entry points share one tile kernel (one query tile against a run of kept key tiles, masks on
// global positions, online softmax): whole computations over a square BlockLayout
// (CpuAttention*), and rectangular pieces over a RectLayout merged into float32 accumulators with
// the LSE rule (CpuAttentionPiece, what a ring step and every non-square request run).
#ifndef ATTNSERVE_CORE_CPU_CPU_BACKEND_H_
#define ATTNSERVE_CORE_CPU_CPU_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/engine/types.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/spec/rect_layout.h"
#include "core/tensor/tensor.h"
#include "core/util/thread_pool.h"

namespace attnserve {

struct CpuRunOptions {
  ThreadPool* pool = nullptr;          // null: run on the calling thread
  MemoryTracker* tracker = nullptr;    // charged with outputs and workspaces
  // Polled between tiles; when it reads true the run stops and returns CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
  CompileOptions compile;              // block size for dense/window/dilated
};

// The head dims the CPU backend runs: any from 1 to kMaxHeadDim (core/spec). The one statement of
// the CPU backend's capability; its Device and Describe read it.
constexpr bool CpuSupportsHeadDim(int64_t head_dim) {
  return head_dim >= 1 && head_dim <= kMaxHeadDim;
}

// Validates, compiles and runs `spec` on q [B, Nq, Hq, D], k/v [B, Nkv, Hkv, D] (same dtype):
// square requests over the compiled BlockLayout, the others (IsSquare false: a query offset,
// Nq != Nkv, packed sequences) as CpuAttentionRect.
absl::StatusOr<AttentionOutputs> CpuAttention(const AttentionSpec& spec, const HostTensor& q,
                                              const HostTensor& k, const HostTensor& v,
                                              const CpuRunOptions& options = {});

// Runs an already compiled pattern (what the ring driver calls per step). Same contract, for
// square requests only: the pattern is compiled for one length (INVALID_ARGUMENT otherwise).
absl::StatusOr<AttentionOutputs> CpuAttentionCompiled(const AttentionSpec& spec,
                                                      const CompiledPattern& compiled,
                                                      const HostTensor& q, const HostTensor& k,
                                                      const HostTensor& v,
                                                      const CpuRunOptions& options = {});

// CpuAttentionCompiled into caller-owned outputs: o [B, N, Hq, D] in q's dtype and lse [B, Hq, N]
// f32, every element of which is written (tests poison them first to prove it). Same contract.
absl::Status CpuAttentionInto(const AttentionSpec& spec, const CompiledPattern& compiled,
                              const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              const CpuRunOptions& options, HostTensor& o, HostTensor& lse);

// What a rectangular run computed, for FLOP counts and sparsity.
struct CpuRectFigures {
  double admitted_pairs = 0;  // (query, key) pairs computed, summed over batch and query heads
  double possible_pairs = 0;  // every query against every key of its sequence, the same way
};

// Any request (square or not: DESIGN "The math", positions, packed batches) run as the RectLayouts
// of its spans (core/spec/rect_pattern.h) through CpuAttentionPiece: o [B, Nq, Hq, D] in q's
// dtype and lse [B, Hq, Nq] f32, every element written. Validates; `figures` may be null.
absl::Status CpuAttentionRectInto(const AttentionSpec& spec, const HostTensor& q,
                                  const HostTensor& k, const HostTensor& v,
                                  const CpuRunOptions& options, HostTensor& o, HostTensor& lse,
                                  CpuRectFigures* figures = nullptr);
// The same into new outputs.
absl::StatusOr<AttentionOutputs> CpuAttentionRect(const AttentionSpec& spec, const HostTensor& q,
                                                  const HostTensor& k, const HostTensor& v,
                                                  const CpuRunOptions& options = {},
                                                  CpuRectFigures* figures = nullptr);

// A query head and the key/value head it reads, as head indices into a piece's buffers.
struct HeadPair {
  int32_t q_head = 0;
  int32_t kv_head = 0;
};

// The buffers of one piece: float32, row-major [B, rows, heads, D] (the "shard" layout a ring rank
// holds). Nothing is owned; every pointer must stay valid for the call.
struct CpuPieceArgs {
  int64_t batch = 0;
  int64_t head_dim = 0;

  const float* q = nullptr;  // [B, q_rows, q_heads, D], unscaled (the spec's scale is applied)
  int64_t q_rows = 0;
  int64_t q_heads = 0;
  int64_t q_row0 = 0;  // buffer row of the layout's first query (position layout.q_begin)

  const float* k = nullptr;  // [B, kv_rows, kv_heads, D]
  const float* v = nullptr;  // same shape as k
  int64_t kv_rows = 0;
  int64_t kv_heads = 0;
  int64_t k_row0 = 0;  // buffer row of the layout's first key (position layout.k_begin)

  // Heads to compute. Each q_head at most once: work items of different pairs write the same
  // accumulator rows otherwise.
  std::span<const HeadPair> heads;

  // Merged into with the LSE rule, only at the layout's query rows [q_row0, q_row0 + q_len).
  // Fresh accumulators start at O = 0, LSE = -inf.
  float* acc_o = nullptr;    // [B, q_rows, q_heads, D]
  float* acc_lse = nullptr;  // [B, q_heads, q_rows]
};

// Attention of the layout's query rows against its key rows, masks on the layout's GLOBAL
// positions, at EffectiveScale(spec, head_dim); the result of every (batch, head pair, query row)
// is LSE-merged into the accumulators, so calling this once per key piece (in any order) yields
// the attention over the union of the pieces. Query rows with no kept tile are left untouched.
// Uses options.pool and options.cancel (CANCELLED between tiles); INVALID_ARGUMENT when the layout
// or the buffers do not fit each other.
absl::Status CpuAttentionPiece(const AttentionSpec& spec, const RectLayout& layout,
                               const CpuPieceArgs& args, const CpuRunOptions& options = {});

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CPU_CPU_BACKEND_H_
