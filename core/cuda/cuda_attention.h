// The CUDA attention engine below the Device interface: the one runtime -> template dispatch of
// the flash_fwd kernels (RunAttentionForward), the head-dim table, the workspace sizes, and a
// device-pointer API (CudaAttentionPlan) that the CudaDevice, the benches and the ring driver
// call. Launch parameters come from BuildFlashFwdParams (flash_fwd/flash_fwd_params_builder.h).
// Nothing here is O(N^2): dense layouts are implicit in the kernel, others are CSR; dilated
// branches are read in place through strides and merged into one f32 accumulator
// (O(N * Hq * D)), with no gather buffers.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_H_
#define ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "core/spec/attention_spec.h"
#include "core/spec/pattern_compiler.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// Checks params against what the kernels support (head dims of CudaSupportsHeadDim, block 64/128,
// bf16/f16, grid limits, 16-byte aligned rows), picks the kernel (FlashKernelFor: `options` and
// the current device) and launches it. INVALID_ARGUMENT / UNIMPLEMENTED for unsupported params,
// the CUDA error (with file:line) for a failed launch. `ran` (if given) is set to the kernel that
// was launched. The one runtime -> template dispatch of the flash_fwd family.
absl::Status RunAttentionForward(const FlashFwdParams& params, const FlashKernelOptions& options,
                                 cudaStream_t stream, FlashKernel* ran = nullptr);

// Head dims the CUDA kernels implement (the table is kFlashFwdHeadDims). Every head-dim check of
// the CUDA backend (CudaDevice::HeadDimSupported, plans, rings) asks this.
bool CudaSupportsHeadDim(int64_t head_dim);
// OK, or UNIMPLEMENTED naming the head dims the CUDA backend supports.
absl::Status CudaCheckHeadDim(int64_t head_dim);

// Device bytes of one run's workspaces, buffer by buffer: CudaAttentionPlan::Run allocates exactly
// these (and CudaDevice's cuDNN path the bf16 copies), and EstimateBytes adds them up, so the
// admission estimate and the allocations cannot drift apart.
struct CudaWorkspaceSizes {
  // f32 inputs: the bf16 copies the kernels read, and the bf16 output they write (not for
  // dilated specs, which accumulate in f32).
  int64_t q_bf16 = 0;
  int64_t k_bf16 = 0;
  int64_t v_bf16 = 0;
  int64_t o_bf16 = 0;
  // Dilated specs with a bf16/f16 output: the f32 O accumulator (an f32 output is its own).
  int64_t o_acc_f32 = 0;
  int64_t total() const { return q_bf16 + k_bf16 + v_bf16 + o_bf16 + o_acc_f32; }
};
CudaWorkspaceSizes CudaWorkspaceSizesFor(const AttentionSpec& spec, const AttentionShape& shape,
                                         DType dtype);

// One spec compiled for one shape and dtype, with its block layout (or dilated branch plan, or
// for a request that is not square -- Nq != Nkv, a query offset, packed sequences -- the
// RectLayouts of its pieces, dense, window and block_sparse only) uploaded to the device. Run() may be called many times (benches) on the stream it was made for.
// Inputs/outputs are contiguous device tensors: q [B, N, Hq, D], k/v [B, N, Hkv, D] and
// o [B, N, Hq, D] in `dtype` (f32 allowed: computed in bf16, see below), lse [B, Hq, N] f32.
//
// f32 inputs are converted to bf16 on the device (one elementwise kernel per tensor) and the
// bf16 kernel runs; bf16 keeps f32's range, so no input can overflow, at bf16 accuracy (~1e-2).
class CudaAttentionPlan {
 public:
  struct Options {
    CompileOptions compile;     // block size of dense/window/dilated layouts (64 or 128)
    FlashKernelOptions kernel;  // which flash kernel (and sm90 schedule) the launches run
  };
  // `compiled` may be null: the spec is then compiled here (dense needs no layout at all).
  // The allocator must outlive the plan; all of a plan's work runs on one stream.
  static absl::StatusOr<std::unique_ptr<CudaAttentionPlan>> Create(
      const AttentionSpec& spec, const AttentionShape& shape, DType dtype,
      CachingAllocator& alloc, cudaStream_t stream, const CompiledPattern* compiled = nullptr,
      const Options& options = {});
  ~CudaAttentionPlan();

  // Enqueues the computation. `cancel` is polled between launches (CANCELLED when set). Does not
  // synchronize. The workspaces a run needs are taken on its first run and kept by the plan
  // (reused by later runs on the same stream) until it is destroyed, which its owner does only
  // once the stream is idle: no block goes back to the allocator, which the lanes of a device
  // share, while queued work may still use it. `kernel` (if given) is
  // set to the flash kernel the launches ran (every launch of a plan runs the same one; a plan
  // always launches at least once).
  absl::Status Run(const void* q, const void* k, const void* v, void* o, float* lse,
                   cudaStream_t stream, const std::atomic<bool>* cancel = nullptr,
                   FlashKernel* kernel = nullptr) const;

  // 4 * D * (admitted (query, key) pairs summed over batches and query heads); for dilated specs
  // the pairs of every branch count.
  double flops() const { return flops_; }
  double sparsity() const { return sparsity_; }
  // Device bytes held by the plan (CSR, positions).
  int64_t plan_bytes() const { return plan_bytes_; }
  // A CSR layout of kFull blocks only, over whole blocks (N a multiple of the block): its
  // launches may take the sm90 kernel's mask-free variant (Sm90FullTiles).
  bool all_full_blocks() const;
  // Workspace bytes Run() takes (f32 input conversion, the dilated and rect f32 accumulators; the
  // split-KV decode partials are sized at run time and not counted).
  int64_t workspace_bytes() const { return workspace_.total(); }

  // Device bytes a run of (spec, shape, dtype) needs: inputs, outputs, plan (an upper bound of the
  // CSR) and workspaces (CudaWorkspaceSizesFor). Analytic (no compile), for admission control.
  static int64_t EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                               DType dtype);

  // A request that is not square: its uploaded pieces (cuda_attention_rect.h; internal to
  // core/cuda, named here so that the rect path's helpers can take its pieces).
  struct Rect;

  // The plan's run workspaces, one buffer per use. Workspace returns a buffer of at least `bytes`
  // (nullptr for 0) that lives until the plan is destroyed; a slot that must grow keeps its old
  // buffer too, since queued work may still read it.
  enum class WorkspaceSlot { kQBf16, kKBf16, kVBf16, kOBf16, kOAccF32, kDecodeSplits, kCount };
  absl::StatusOr<void*> Workspace(WorkspaceSlot slot, int64_t bytes) const;

 private:
  struct Scratch;
  struct Layout;   // an uploaded CSR (or implicit dense)
  struct Dilated;  // per branch and head group: strided segment runs
  CudaAttentionPlan() = default;
  absl::Status BuildDilated(const AttentionSpec& spec, const CompiledPattern& compiled,
                            int32_t block_size);
  absl::Status BuildLayout(const AttentionSpec& spec, const CompiledPattern* compiled,
                           const CompileOptions& options, cudaStream_t stream);
  absl::Status RunLayout(const void* q, const void* k, const void* v, void* o, float* lse,
                         cudaStream_t stream, FlashKernel* kernel) const;
  // cuda_attention_rect.cc: the pieces of RequestSpans / SpanLayouts (core/spec/rect_pattern.h).
  absl::Status BuildRect(const AttentionSpec& spec, const CompileOptions& options,
                         cudaStream_t stream);
  absl::Status RunRect(const void* q, const void* k, const void* v, void* o, float* lse,
                       cudaStream_t stream, const std::atomic<bool>* cancel,
                       FlashKernel* kernel) const;
  absl::Status RunDilated(const void* q, const void* k, const void* v, void* o, float* lse,
                          cudaStream_t stream, const std::atomic<bool>* cancel,
                          FlashKernel* kernel) const;

  AttentionShape shape_;
  DType dtype_ = DType::kBF16;
  DType compute_dtype_ = DType::kBF16;
  float scale_ = 0.f;
  bool causal_ = false;
  FlashKernelOptions kernel_options_;
  CachingAllocator* alloc_ = nullptr;
  std::unique_ptr<Layout> layout_;
  std::unique_ptr<Dilated> dilated_;
  std::unique_ptr<Rect> rect_;
  double flops_ = 0;
  double sparsity_ = 0;
  int64_t plan_bytes_ = 0;
  CudaWorkspaceSizes workspace_;
  std::unique_ptr<Scratch> scratch_;  // set by Create
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_ATTENTION_H_
