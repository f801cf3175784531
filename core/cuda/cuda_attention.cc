#include "core/cuda/cuda_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <mutex>
#include <numeric>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_attention_rect.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/flash_decode/flash_decode.h"
#include "core/cuda/device_upload.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/cuda/flash_fwd/flash_fwd_head_dims.h"
#include "core/cuda/flash_fwd/flash_fwd_launch.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

constexpr int64_t kMaxGridYZ = 65535;

bool Aligned8(int64_t x) { return x % 8 == 0; }

template <int kHeadDim, typename Elem>
cudaError_t DispatchBlock(const FlashFwdParams& p, cudaStream_t stream) {
  return p.block_size == 64 ? RunFlashFwd<kHeadDim, 64, Elem>(p, stream)
                            : RunFlashFwd<kHeadDim, 128, Elem>(p, stream);
}

// Query blocks sorted by kept blocks, heaviest first (stable), so the longest CTAs start first and
// the tail of the grid is short ones.
std::vector<int32_t> HeavyFirstOrder(const std::vector<int64_t>& row_ptr) {
  const int64_t nb = static_cast<int64_t>(row_ptr.size()) - 1;
  std::vector<int32_t> order(nb);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return row_ptr[a + 1] - row_ptr[a] > row_ptr[b + 1] - row_ptr[b];
  });
  return order;
}

int64_t DensePairs(int64_t n, bool causal) { return causal ? n * (n + 1) / 2 : n * n; }

// Device bytes of an uploaded block layout of `num_blocks` query blocks and `kept` CSR entries
// (row_ptr int64, col_idx int32, mask uint8, heavy-first row order int32): what Create uploads
// and what EstimateBytes bounds.
int64_t CsrBytes(int64_t num_blocks, int64_t kept) {
  return (num_blocks + 1) * 8 + kept * 5 + num_blocks * 4;
}

// The block size EstimateBytes assumes (the smallest: the most blocks).
constexpr int64_t kEstimateBlockSize = 64;

}  // namespace

bool CudaSupportsHeadDim(int64_t head_dim) { return FlashFwdHasHeadDim(head_dim); }

absl::Status CudaCheckHeadDim(int64_t head_dim) {
  if (CudaSupportsHeadDim(head_dim)) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("shape.head_dim: the CUDA backend supports head dims ",
                   absl::StrJoin(kFlashFwdHeadDims, ", "), ", got ", head_dim));
}

CudaWorkspaceSizes CudaWorkspaceSizesFor(const AttentionSpec& spec, const AttentionShape& shape,
                                         DType dtype) {
  const int64_t nq = shape.batch * shape.tokens * shape.q_heads * shape.head_dim;
  const int64_t nkv = shape.batch * shape.kv_len() * shape.kv_heads * shape.head_dim;
  const bool dilated = std::holds_alternative<DilatedSpec>(spec.pattern);
  CudaWorkspaceSizes w;
  if (dtype == DType::kF32) {
    w.q_bf16 = nq * 2;
    w.k_bf16 = nkv * 2;
    w.v_bf16 = nkv * 2;
    if (!dilated) w.o_bf16 = nq * 2;
  } else if (dilated) {
    w.o_acc_f32 = nq * 4;
  }
  if (!IsSquare(spec, shape) && std::holds_alternative<DenseSpec>(spec.pattern) && spec.causal) {
    w.o_acc_f32 = nq * 4;  // the rect path's accumulator (cuda_attention_rect.cc)
  }
  return w;
}

absl::Status RunAttentionForward(const FlashFwdParams& p, const FlashKernelOptions& options,
                                 cudaStream_t stream, FlashKernel* ran) {
  ATTN_RETURN_IF_ERROR(CudaCheckHeadDim(p.head_dim));
  if (p.block_size != 64 && p.block_size != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: must be 64 or 128, got ", p.block_size));
  }
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) {
    return absl::InvalidArgumentError("dtype: the flash_fwd kernel takes bf16 or f16");
  }
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.o == nullptr || p.lse == nullptr) {
    return absl::InvalidArgumentError("flash_fwd: null tensor pointer");
  }
  if (p.col_idx != nullptr && (p.row_ptr == nullptr || p.block_mask == nullptr)) {
    return absl::InvalidArgumentError("flash_fwd: col_idx without row_ptr/block_mask");
  }
  if (p.num_heads > kMaxGridYZ || int64_t{p.batch} * p.num_segs > kMaxGridYZ ||
      p.num_q_blocks > std::numeric_limits<int32_t>::max() || p.kv_group < 1 ||
      p.num_segs < 1 || p.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flash_fwd: grid out of range (heads ", p.num_heads, ", batch*segments ",
        int64_t{p.batch} * p.num_segs, ", query blocks ", p.num_q_blocks, ")"));
  }
  if (p.num_q_blocks != (p.seqlen + p.block_size - 1) / p.block_size) {
    return absl::InvalidArgumentError("flash_fwd: num_q_blocks does not cover seqlen");
  }
  const int64_t seqlen_k = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  if (p.col_idx == nullptr) {
    // The implicit dense row walks [0, num_k_blocks): it must cover the keys exactly.
    if (p.num_k_blocks != (seqlen_k + p.block_size - 1) / p.block_size) {
      return absl::InvalidArgumentError("flash_fwd: num_k_blocks does not cover seqlen_k");
    }
    // Implicit causal keeps blocks [0, row] of a square, aligned layout.
    if (p.dense_causal && (seqlen_k != p.seqlen || p.q_pos_offset != p.k_pos_offset)) {
      return absl::InvalidArgumentError(
          "flash_fwd: implicit dense causal needs seqlen_k == seqlen and equal position offsets");
    }
  }
  // cp.async moves 16-byte chunks: every row start must be 16-byte aligned.
  for (int64_t s : {p.q_batch_stride, p.q_seg_stride, p.q_row_stride, p.q_head_stride,
                    p.k_batch_stride, p.k_seg_stride, p.k_row_stride, p.k_head_stride,
                    p.v_batch_stride, p.v_seg_stride, p.v_row_stride, p.v_head_stride}) {
    if (!Aligned8(s)) {
      return absl::InvalidArgumentError("flash_fwd: strides must be multiples of 8");
    }
  }
  for (const void* ptr : {p.q, p.k, p.v}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return absl::InvalidArgumentError("flash_fwd: q/k/v must be 16-byte aligned");
    }
  }
  ATTN_ASSIGN_OR_RETURN(const FlashKernel kernel, FlashKernelFor(p, options));
  cudaError_t err = cudaSuccess;
  if (kernel != FlashKernel::kSm80) {
    err = RunFlashFwdSm90(p, kernel, options, stream);
  } else if (p.dtype == DType::kBF16) {
    err = p.head_dim == 64 ? DispatchBlock<64, __nv_bfloat16>(p, stream)
                           : DispatchBlock<128, __nv_bfloat16>(p, stream);
  } else {
    err = p.head_dim == 64 ? DispatchBlock<64, __half>(p, stream)
                           : DispatchBlock<128, __half>(p, stream);
  }
  CUDA_RETURN_IF_ERROR(err);
  if (ran != nullptr) *ran = kernel;
  return absl::OkStatus();
}

// ---- plan ------------------------------------------------------------------------------------

struct CudaAttentionPlan::Layout {
  int32_t block_size = 128;
  int64_t num_blocks = 0;
  bool implicit_dense = false;
  bool dense_causal = false;
  TokenRule rule;
  DeviceBuffer row_ptr;    // int64 [nb + 1]
  DeviceBuffer col_idx;    // int32 [kept]
  DeviceBuffer mask;       // uint8 [kept]
  DeviceBuffer row_order;  // int32 [nb], heavy rows first (may be empty)
  int64_t kept_blocks = 0;  // CSR entries
  bool all_full = false;    // every entry kFull and N a multiple of the block (no tile masks)
};

// A dilated branch needs no gather: the positions of group o in segment t are the arithmetic
// progression t*w + o + m*r, so the kernel reads them in place with a row stride of r tokens and
// a segment stride of w tokens, and merges its result into the f32 accumulators in its epilogue.
struct CudaAttentionPlan::Dilated {
  struct Run {             // consecutive segments of one length
    int64_t first = 0;     // global position of the first segment's first query
    int64_t length = 0;    // tokens per segment
    int64_t count = 0;     // segments
    int64_t pitch = 0;     // positions between consecutive segments' starts (w)
  };
  struct Group {
    int64_t offset = 0;      // head offset o: heads o, o + rate, ...
    int32_t num_heads = 0;
    std::vector<Run> runs;
  };
  struct Branch {
    int64_t rate = 1;
    std::vector<Group> groups;
  };
  std::vector<Branch> branches;
  int32_t block_size = 128;
};

struct CudaAttentionPlan::Scratch {
  std::mutex mu;
  DeviceBuffer slots[static_cast<int>(WorkspaceSlot::kCount)];
  std::vector<DeviceBuffer> outgrown;  // replaced by larger ones, kept for queued work
};

CudaAttentionPlan::~CudaAttentionPlan() = default;

absl::StatusOr<void*> CudaAttentionPlan::Workspace(WorkspaceSlot slot, int64_t bytes) const {
  if (bytes <= 0) return nullptr;
  std::lock_guard<std::mutex> lock(scratch_->mu);
  DeviceBuffer& b = scratch_->slots[static_cast<int>(slot)];
  if (b.get() != nullptr && b.size() >= static_cast<size_t>(bytes)) return b.get();
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer fresh,
                        DeviceBuffer::Create(*alloc_, static_cast<size_t>(bytes)));
  if (b.get() != nullptr) scratch_->outgrown.push_back(std::move(b));
  b = std::move(fresh);
  return b.get();
}

absl::StatusOr<std::unique_ptr<CudaAttentionPlan>> CudaAttentionPlan::Create(
    const AttentionSpec& spec, const AttentionShape& shape, DType dtype, CachingAllocator& alloc,
    cudaStream_t stream, const CompiledPattern* compiled, const Options& options) {
  ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered
  ATTN_RETURN_IF_ERROR(CudaCheckHeadDim(shape.head_dim));
  if (shape.q_heads > kMaxGridYZ || shape.batch > kMaxGridYZ) {
    return absl::InvalidArgumentError("shape: q_heads and batch must be <= 65535 on CUDA");
  }
  auto plan = std::unique_ptr<CudaAttentionPlan>(new CudaAttentionPlan());
  plan->shape_ = shape;
  plan->dtype_ = dtype;
  plan->compute_dtype_ = dtype == DType::kF16 ? DType::kF16 : DType::kBF16;
  plan->scale_ = EffectiveScale(spec, shape.head_dim);
  plan->causal_ = spec.causal;
  plan->kernel_options_ = options.kernel;
  plan->alloc_ = &alloc;
  plan->workspace_ = CudaWorkspaceSizesFor(spec, shape, dtype);
  plan->scratch_ = std::make_unique<Scratch>();
  if (!IsSquare(spec, shape)) {
    if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
      return absl::UnimplementedError(
          "spec.dilated: with kv_tokens != tokens, a query offset or packed sequences, dilated "
          "attention runs on the CPU backend only for now");
    }
    ATTN_RETURN_IF_ERROR(plan->BuildRect(spec, options.compile, stream));
  } else if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    CompiledPattern local;
    if (compiled == nullptr) {
      ATTN_ASSIGN_OR_RETURN(local,
                            CompileValidatedPattern(spec, shape.tokens, shape.q_heads, options.compile));
      compiled = &local;
    }
    ATTN_RETURN_IF_ERROR(plan->BuildDilated(spec, *compiled, options.compile.block_size));
  } else {
    ATTN_RETURN_IF_ERROR(plan->BuildLayout(spec, compiled, options.compile, stream));
  }
  return plan;
}

absl::Status CudaAttentionPlan::BuildDilated(const AttentionSpec& spec,
                                             const CompiledPattern& compiled,
                                             int32_t block_size) {
  if (!compiled.dilated) return absl::InvalidArgumentError("dilated spec without a plan");
  const int64_t b = shape_.batch, hq = shape_.q_heads, d = shape_.head_dim;
  auto dil = std::make_unique<Dilated>();
  dil->block_size = block_size;
  double pairs_heads = 0;  // sum over (branch, head) of admitted pairs
  for (const DilatedBranch& br : compiled.dilated->branches) {
    Dilated::Branch branch;
    branch.rate = br.rate;
    for (const DilatedGroup& gr : br.groups) {
      Dilated::Group group;
      group.offset = gr.offset;
      group.num_heads = static_cast<int32_t>(DilatedGroupHeads(hq, br.rate, gr.offset).size());
      if (group.num_heads <= 0 || gr.positions.empty()) continue;
      int64_t group_pairs = 0;
      for (size_t t = 0; t + 1 < gr.seg_start.size(); ++t) {
        const int64_t s0 = gr.seg_start[t];
        const int64_t len = gr.seg_start[t + 1] - s0;
        if (len == 0) continue;
        const int64_t first = gr.positions[s0];
        // The strided reads rely on each segment being an arithmetic progression of step r.
        if (gr.positions[s0 + len - 1] != first + (len - 1) * br.rate) {
          return absl::InternalError(absl::StrCat(
              "dilated plan: segment ", t, " of rate ", br.rate, " offset ", gr.offset,
              " is not an arithmetic progression of step ", br.rate));
        }
        group_pairs += DensePairs(len, spec.causal);
        Dilated::Run* last = group.runs.empty() ? nullptr : &group.runs.back();
        // (Compared as a quotient: count * segment_length may pass int64 for a huge segment.)
        if (last != nullptr && last->length == len &&
            (first - last->first) % br.segment_length == 0 &&
            (first - last->first) / br.segment_length == last->count &&
            (last->count + 1) * b <= kMaxGridYZ) {
          ++last->count;
        } else {
          group.runs.push_back({first, len, 1, br.segment_length});
        }
      }
      pairs_heads += static_cast<double>(group_pairs) * group.num_heads;
      branch.groups.push_back(std::move(group));
    }
    dil->branches.push_back(std::move(branch));
  }
  flops_ = 4.0 * b * d * pairs_heads;
  sparsity_ = compiled.layout.sparsity();
  dilated_ = std::move(dil);
  return absl::OkStatus();
}

absl::Status CudaAttentionPlan::BuildLayout(const AttentionSpec& spec,
                                            const CompiledPattern* compiled,
                                            const CompileOptions& options, cudaStream_t stream) {
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads, d = shape_.head_dim;
  CachingAllocator& alloc = *alloc_;
  auto layout = std::make_unique<Layout>();
  const bool dense = std::holds_alternative<DenseSpec>(spec.pattern);
  if (dense && compiled == nullptr) {
    // Dense needs no CSR: the kernel walks [0, nb) (or [0, i] when causal) itself, so dense
    // requests of any length hold O(nb) plan memory (the heavy-first row order) only.
    layout->block_size = options.block_size;
    layout->num_blocks = NumBlocks(n, layout->block_size);
    layout->implicit_dense = true;
    layout->dense_causal = spec.causal;
    if (spec.causal) {
      std::vector<int32_t> order(layout->num_blocks);
      for (int64_t i = 0; i < layout->num_blocks; ++i) {
        order[i] = static_cast<int32_t>(layout->num_blocks - 1 - i);
      }
      ATTN_ASSIGN_OR_RETURN(layout->row_order, UploadVector(alloc, order, stream));
      plan_bytes_ += layout->num_blocks * 4;
    }
    flops_ = 4.0 * b * hq * d * static_cast<double>(DensePairs(n, spec.causal));
    const double nb = static_cast<double>(layout->num_blocks);
    sparsity_ = spec.causal ? 1.0 - (nb * (nb + 1) / 2) / (nb * nb) : 0.0;
    layout_ = std::move(layout);
    return absl::OkStatus();
  }
  BlockLayout local;
  const BlockLayout* bl = nullptr;
  if (compiled != nullptr) {
    bl = &compiled->layout;
  } else {
    ATTN_ASSIGN_OR_RETURN(local, CompileValidatedBlockLayout(spec, n, options));
    bl = &local;
  }
  if (bl->seq_len != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("compiled layout has ", bl->seq_len, " tokens, shape has ", n));
  }
  layout->block_size = bl->block_size;
  layout->num_blocks = bl->num_blocks;
  layout->rule = bl->rule;
  std::vector<int32_t> order = HeavyFirstOrder(bl->row_ptr);
  std::vector<uint8_t> mask(bl->mask.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint8_t>(bl->mask[i]);
  layout->all_full = n % bl->block_size == 0 &&
                     std::all_of(bl->mask.begin(), bl->mask.end(),
                                 [](BlockMask m) { return m == BlockMask::kFull; });
  layout->kept_blocks = bl->kept_blocks();
  ATTN_ASSIGN_OR_RETURN(layout->row_ptr, UploadVector(alloc, bl->row_ptr, stream));
  ATTN_ASSIGN_OR_RETURN(layout->col_idx, UploadVector(alloc, bl->col_idx, stream));
  ATTN_ASSIGN_OR_RETURN(layout->mask, UploadVector(alloc, mask, stream));
  ATTN_ASSIGN_OR_RETURN(layout->row_order, UploadVector(alloc, order, stream));
  plan_bytes_ = CsrBytes(bl->num_blocks, bl->kept_blocks());
  flops_ = 4.0 * b * hq * d * static_cast<double>(bl->AdmittedPairs());
  sparsity_ = bl->sparsity();
  layout_ = std::move(layout);
  return absl::OkStatus();
}

absl::Status CudaAttentionPlan::Run(const void* q, const void* k, const void* v, void* o,
                                    float* lse, cudaStream_t stream,
                                    const std::atomic<bool>* cancel, FlashKernel* kernel) const {
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads, hkv = shape_.kv_heads,
                d = shape_.head_dim;
  // f32 inputs: bf16 copies on the device, sized by the workspace table.
  const void* qx = q;
  const void* kx = k;
  const void* vx = v;
  void* ox = o;
  if (dtype_ == DType::kF32) {
    const int64_t nq = b * n * hq * d, nkv = b * shape_.kv_len() * hkv * d;
    ATTN_ASSIGN_OR_RETURN(void* qc, Workspace(WorkspaceSlot::kQBf16, workspace_.q_bf16));
    ATTN_ASSIGN_OR_RETURN(void* kc, Workspace(WorkspaceSlot::kKBf16, workspace_.k_bf16));
    ATTN_ASSIGN_OR_RETURN(void* vc, Workspace(WorkspaceSlot::kVBf16, workspace_.v_bf16));
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, q, DType::kBF16, qc, nq, stream));
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, k, DType::kBF16, kc, nkv, stream));
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, v, DType::kBF16, vc, nkv, stream));
    qx = qc;
    kx = kc;
    vx = vc;
    if (workspace_.o_bf16 > 0) {
      ATTN_ASSIGN_OR_RETURN(ox, Workspace(WorkspaceSlot::kOBf16, workspace_.o_bf16));
    }
  }
  if (cancel != nullptr && cancel->load()) return absl::CancelledError("cancelled");
  if (dilated_) return RunDilated(qx, kx, vx, o, lse, stream, cancel, kernel);
  if (rect_) {
    ATTN_RETURN_IF_ERROR(RunRect(qx, kx, vx, ox, lse, stream, cancel, kernel));
  } else {
    ATTN_RETURN_IF_ERROR(RunLayout(qx, kx, vx, ox, lse, stream, kernel));
  }
  if (dtype_ == DType::kF32) {
    CUDA_RETURN_IF_ERROR(
        LaunchConvert(DType::kBF16, ox, DType::kF32, o, b * n * hq * d, stream));
  }
  return absl::OkStatus();
}

bool CudaAttentionPlan::all_full_blocks() const { return layout_ != nullptr && layout_->all_full; }

absl::Status CudaAttentionPlan::RunLayout(const void* q, const void* k, const void* v, void* o,
                                          float* lse, cudaStream_t stream,
                                          FlashKernel* kernel) const {
  FlashFwdTensors tensors{q, k, v, o, lse, shape_};
  tensors.dtype = compute_dtype_;
  FlashFwdRange range;
  range.q_len = shape_.tokens;
  FlashFwdLayoutView view;
  view.block_size = layout_->block_size;
  view.row_order = layout_->row_order.as<int32_t>();
  if (layout_->implicit_dense) {
    view.kind = layout_->dense_causal ? FlashFwdLayoutView::Kind::kDenseCausal
                                      : FlashFwdLayoutView::Kind::kDense;
  } else {
    view.kind = FlashFwdLayoutView::Kind::kCsr;
    view.row_ptr = layout_->row_ptr.as<int64_t>();
    view.col_idx = layout_->col_idx.as<int32_t>();
    view.block_mask = layout_->mask.as<uint8_t>();
    view.rule_causal = layout_->rule.causal;
    view.rule_window = layout_->rule.window ? *layout_->rule.window : -1;
    view.all_full = layout_->all_full;
  }
  return RunAttentionForward(BuildFlashFwdParams(tensors, range, view, scale_), kernel_options_,
                             stream, kernel);
}

absl::Status CudaAttentionPlan::RunDilated(const void* q, const void* k, const void* v, void* o,
                                           float* lse, cudaStream_t stream,
                                           const std::atomic<bool>* cancel,
                                           FlashKernel* kernel) const {
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads, hkv = shape_.kv_heads,
                d = shape_.head_dim;
  const int64_t esize = static_cast<int64_t>(DTypeSize(compute_dtype_));
  // Accumulators: O f32 (the output itself when the output is f32), LSE = the output LSE.
  float* o_acc = nullptr;
  if (workspace_.o_acc_f32 > 0) {
    ATTN_ASSIGN_OR_RETURN(void* acc, Workspace(WorkspaceSlot::kOAccF32, workspace_.o_acc_f32));
    o_acc = static_cast<float*>(acc);
  } else {
    o_acc = static_cast<float*>(o);
  }
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o_acc, 0, b * n * hq * d * 4, stream));
  CUDA_RETURN_IF_ERROR(LaunchFillFloat(lse, -INFINITY, b * hq * n, stream));

  FlashFwdLayoutView view;
  view.kind = causal_ ? FlashFwdLayoutView::Kind::kDenseCausal : FlashFwdLayoutView::Kind::kDense;
  view.block_size = dilated_->block_size;
  for (const Dilated::Branch& branch : dilated_->branches) {
    for (const Dilated::Group& group : branch.groups) {
      if (cancel != nullptr && cancel->load()) return absl::CancelledError("cancelled");
      for (const Dilated::Run& run : group.runs) {
        // The run's first token; its rows are `rate` tokens apart, its segments `pitch` apart.
        FlashFwdTensors tensors;
        tensors.q = static_cast<const std::byte*>(q) + run.first * hq * d * esize;
        tensors.k = static_cast<const std::byte*>(k) + run.first * hkv * d * esize;
        tensors.v = static_cast<const std::byte*>(v) + run.first * hkv * d * esize;
        tensors.o = o_acc + run.first * hq * d;
        tensors.lse = lse + run.first;
        tensors.shape = shape_;
        tensors.dtype = compute_dtype_;
        FlashFwdRange range;
        range.q_len = run.length;
        range.row_step = branch.rate;
        range.num_segments = run.count;
        range.segment_pitch = run.pitch;
        range.head_start = static_cast<int32_t>(group.offset);
        range.head_step = static_cast<int32_t>(std::min(branch.rate, hq));  // one head when larger
        range.num_heads = group.num_heads;
        range.accumulate = true;
        ATTN_RETURN_IF_ERROR(RunAttentionForward(BuildFlashFwdParams(tensors, range, view, scale_),
                                                 kernel_options_, stream, kernel));
      }
    }
  }
  if (dtype_ != DType::kF32) {
    CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, o_acc, dtype_, o, b * n * hq * d, stream));
  }
  return absl::OkStatus();
}

int64_t CudaAttentionPlan::EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                                         DType dtype) {
  const int64_t b = shape.batch, n = shape.tokens, hq = shape.q_heads, hkv = shape.kv_heads,
                d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  // q, k, v, o and lse
  int64_t bytes = b * (2 * n * hq + 2 * shape.kv_len() * hkv) * d * es + b * hq * n * 4;
  bytes += CudaWorkspaceSizesFor(spec, shape, dtype).total();
  // Plan memory at the smallest block size (the most blocks): none for dilated specs (strided
  // in-place branches), the heavy-first row order for dense ones, a CSR with a generous kept
  // count for the others (the real count is known only after compiling).
  const int64_t nb = NumBlocks(std::max(n, shape.kv_len()), kEstimateBlockSize);
  if (!IsSquare(spec, shape)) {
    // Rectangular CSRs (core/spec/rect_pattern.h): the kept tiles of the query rows.
    bytes += CsrBytes(nb, NumBlocks(n, kEstimateBlockSize) * std::min<int64_t>(nb, 64));
    // The split-KV decode pieces' partial results (cuda_attention_rect.cc).
    bytes += FlashDecodeWorkspaceBound(d);
  } else if (std::holds_alternative<DenseSpec>(spec.pattern)) {
    bytes += nb * 4;
  } else if (!std::holds_alternative<DilatedSpec>(spec.pattern)) {
    bytes += CsrBytes(nb, std::min<int64_t>(nb * nb, 64 * nb));
  }
  return bytes;
}

}  // namespace attnserve
