// The CPU backend: tiled online softmax over the compiled BlockLayout, float32 accumulation, tile
// GEMMs through Eigen, spread over a thread pool. Executes the same layout the GPU kernels run.
#ifndef ATTNSERVE_CORE_CPU_CPU_BACKEND_H_
#define ATTNSERVE_CORE_CPU_CPU_BACKEND_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/tensor/tensor.h"
#include "core/util/thread_pool.h"

namespace attnserve {

struct AttentionOutputs {
  HostTensor o;    // [B, N, Hq, D] in the input dtype
  HostTensor lse;  // [B, Hq, N] f32; -inf where a row has no admissible key (O = 0 there)
};

struct CpuRunOptions {
  ThreadPool* pool = nullptr;          // null: run on the calling thread
  MemoryTracker* tracker = nullptr;    // charged with outputs and workspaces
  // Polled between tiles; when it reads true the run stops and returns CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
  CompileOptions compile;              // block size for dense/window/dilated
};

// Validates, compiles and runs `spec` on q [B, N, Hq, D], k/v [B, N, Hkv, D] (same dtype).
absl::StatusOr<AttentionOutputs> CpuAttention(const AttentionSpec& spec, const HostTensor& q,
                                              const HostTensor& k, const HostTensor& v,
                                              const CpuRunOptions& options = {});

// Runs an already compiled pattern (what the ring driver calls per step). Same contract.
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

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CPU_CPU_BACKEND_H_
