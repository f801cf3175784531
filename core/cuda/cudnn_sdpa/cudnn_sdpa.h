// cuDNN fused attention (the cudnn-frontend graph API) as a forward engine for the patterns it
// covers: dense, window(w) and causal on top of either, bf16/f16, GQA (Hkv < Hq), head dims that
// are multiples of 8 up to 128 (256 on Hopper). Block-sparse and dilated stay on core/cuda's own
// kernels. On Hopper cuDNN's wgmma kernels run ~1.8x faster than the FA2-style kernels (NOTES.md).
//
// Layout: q/o [B, N, Hq, D], k/v [B, N, Hkv, D] contiguous device tensors are handed to cuDNN as
// [B, H, N, D] with strides [N*H*D, D, H*D, 1] (no copy). LSE [B, Hq, N] f32 is cuDNN's softmax
// "Stats" output, the natural log of the softmax denominator of the scaled scores (cuDNN's default
// convention; stats_use_log2 is left off).
//
// Masks (top-left diagonal, i = query position, j = key position, cuDNN keeps a score when
// j <= i + right_bound and j > i - left_bound):
//   causal:           right_bound = 0
//   window(w):        left_bound = w + 1, right_bound = w        (|i - j| <= w)
//   window(w)+causal: left_bound = w + 1, right_bound = 0        (0 <= i - j <= w)
// A window reaching every key (w >= N - 1) is planned as dense (or causal). Every row keeps at
// least its diagonal, so the "no admissible key" case of the math cannot arise here.
//
// libcudnn is loaded at run time (dlopen), not linked: binaries start on machines without cuDNN,
// and CudnnSdpa::Create() answers UNAVAILABLE there, so callers fall back to their own kernels.
// Search order: $ATTNSERVE_CUDNN_LIBRARY (a path), "libcudnn.so.9" on the loader path, the library
// CMake found at configure time, then pip-installed nvidia-cudnn wheels (PyTorch's) under the usual
// site-packages folders.
//
// Only this header is visible to dependents; cudnn_frontend is included by cudnn_sdpa.cc alone.
#ifndef ATTNSERVE_CORE_CUDA_CUDNN_SDPA_CUDNN_SDPA_H_
#define ATTNSERVE_CORE_CUDA_CUDNN_SDPA_CUDNN_SDPA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// Whether (spec, shape, dtype) is in the set this engine is meant for, from the shapes alone (no
// device, no library): dense or window pattern (causal or not), bf16 or f16, head_dim a multiple
// of 8 in [8, 256], tokens >= 2 (cuDNN rejects s_q = s_kv = 1), q_heads a multiple of kv_heads.
// false for dilated, block_sparse and f32. INVALID_ARGUMENT for a shape or spec that fails
// ValidateShape/ValidateSpec. A true answer is necessary, not sufficient: whether the installed
// cuDNN has an engine for it (head dim 256 needs Hopper, non-causal windows need cuDNN >= 9.10.2)
// is known only after a graph build, which CudnnSdpa::Supports() does (and caches).
absl::StatusOr<bool> CudnnSdpaSupports(const AttentionSpec& spec, const AttentionShape& shape,
                                       DType dtype);

// One rectangular piece of a larger attention, as a ring step computes it: q_tokens query rows
// against kv_tokens key rows, either unmasked or causal with the diagonal at the top-left (query
// row i sees key rows j <= i: both ranges start at the same global position, as in a ring's
// diagonal pieces). Rows of q/k/v are heads * head_dim elements apart and batches
// q_batch_stride / kv_batch_stride elements apart, so a piece can start at any row of a larger
// [B, N, H, D] shard; O [B, q_tokens, Hq, D] and LSE [B, Hq, q_tokens] are written contiguous.
// Callers merge (O, LSE) into their accumulators with LaunchLseMergeInto (core/cuda/attention_ops.h).
struct CudnnSdpaPiece {
  int64_t batch = 1;
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t q_batch_stride = 0;   // elements, >= q_tokens * q_heads * head_dim
  int64_t kv_batch_stride = 0;  // elements, >= kv_tokens * kv_heads * head_dim (k and v alike)
  bool causal = false;
  float scale = 0.f;
  DType dtype = DType::kBF16;
};

// Where cuDNN's workspace comes from. Both empty: cudaMallocAsync / cudaFreeAsync on the stream of
// the call. `free` is called right after the launch is enqueued, so the allocator must be
// stream-ordered for that stream (core/cuda's CachingAllocator used on a device's one stream is;
// so is cudaMallocAsync). The SDPA forward usually needs no workspace at all.
struct CudnnWorkspaceAllocator {
  std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
  std::function<void(void* ptr)> free;
};

// One cuDNN handle on one device plus an LRU of built graphs keyed by (B, N, Hq, Hkv, D, dtype,
// causal, window, scale). A graph build costs ~40-70 ms (H200, cuDNN 9.14; the first in a process
// ~1 s: library and heuristics loading); a cached execute costs a variant-pack setup
// (microseconds) and the kernel. Thread-safe (one mutex: the
// handle is bound to the stream of each call), but meant for a device's one worker thread.
class CudnnSdpa {
 public:
  struct Options {
    int device = 0;
    // Built graphs kept (each holds a plan and host-side descriptors, ~100 KB); the least recently
    // used is dropped beyond this. Negative answers (no cuDNN engine) are cached the same way.
    int max_cached_graphs = 64;
    // Build dynamic-shape graphs sharing one cuDNN kernel cache (cuDNN >= 9.4), so a new
    // (B, N, H) of an already-seen structure reuses the compiled kernel; cases without a
    // dynamic-shape engine fall back to shape-specialised graphs. Off by default: on an H200 with
    // cuDNN 9.14 a shape-specialised build already costs only ~40-70 ms (the first one in a
    // process ~1 s) and both kinds of graph ran at the same speed, so the plain path is kept.
    bool share_kernels_across_shapes = false;
    CudnnWorkspaceAllocator workspace;
  };

  struct CacheStats {
    int64_t entries = 0;       // graphs (and cached "unsupported" answers) held now
    int64_t hits = 0;          // lookups served from the cache
    int64_t builds = 0;        // graph builds attempted
    int64_t evictions = 0;     // entries dropped by the LRU bound
    double build_seconds = 0;  // wall time spent building graphs
  };

  // Loads libcudnn (once per process), creates a handle on options.device. UNAVAILABLE when no
  // libcudnn could be loaded or the handle cannot be created (the message says what was tried);
  // INVALID_ARGUMENT for a bad device ordinal or cache bound.
  static absl::StatusOr<std::unique_ptr<CudnnSdpa>> Create(const Options& options);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // CudnnSdpaSupports() and then a graph build on this device (cached): false when cuDNN has no
  // engine for the case (GRAPH_NOT_SUPPORTED or no plan), an error only for other failures.
  absl::StatusOr<bool> Supports(const AttentionSpec& spec, const AttentionShape& shape,
                                DType dtype);

  // Enqueues O and LSE on `stream` (no synchronization). q/k/v/o/lse are device pointers on this
  // device, 16-byte aligned, laid out as above; lse may not be null. UNIMPLEMENTED when the case is
  // not covered (CudnnSdpaSupports false, or cuDNN has no engine for it): the caller falls back to
  // its own kernels. INVALID_ARGUMENT for bad pointers; INTERNAL / RESOURCE_EXHAUSTED otherwise,
  // with file:line and cuDNN's message. Never throws.
  absl::Status Forward(const AttentionSpec& spec, const AttentionShape& shape, DType dtype,
                       const void* q, const void* k, const void* v, void* o, float* lse,
                       cudaStream_t stream);

  // A rectangular piece (see CudnnSdpaPiece); graphs are cached like Forward's. UNIMPLEMENTED for
  // a piece outside what this engine covers (the message says which rule), so callers fall back
  // to their own kernels.
  absl::Status ForwardPiece(const CudnnSdpaPiece& piece, const void* q, const void* k,
                            const void* v, void* o, float* lse, cudaStream_t stream);

  // Workspace bytes Forward() will ask the allocator for (builds the graph if needed).
  absl::StatusOr<int64_t> WorkspaceBytes(const AttentionSpec& spec, const AttentionShape& shape,
                                         DType dtype);

  int device() const;
  // cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0.
  int64_t backend_version() const;
  // The libcudnn file that was loaded (or the name the loader resolved).
  const std::string& library() const;
  CacheStats cache_stats() const;

 private:
  struct Impl;
  explicit CudnnSdpa(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The free-function form of CudnnSdpa::Forward (dispatchers and benches call this).
absl::Status CudnnSdpaForward(CudnnSdpa& sdpa, const AttentionSpec& spec,
                              const AttentionShape& shape, DType dtype, const void* q,
                              const void* k, const void* v, void* o, float* lse,
                              cudaStream_t stream);

// Bench helper: `warmup` untimed runs (the first builds the graph), then the mean of `iters` runs
// timed with CUDA events on `stream`, in milliseconds. Synchronizes the stream.
absl::StatusOr<double> TimeCudnnSdpaMs(CudnnSdpa& sdpa, const AttentionSpec& spec,
                                       const AttentionShape& shape, DType dtype, const void* q,
                                       const void* k, const void* v, void* o, float* lse,
                                       cudaStream_t stream, int warmup = 3, int iters = 10);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDNN_SDPA_CUDNN_SDPA_H_
