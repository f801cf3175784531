#include "core/cuda/flash_decode/flash_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/flash_decode/flash_decode_launch.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

constexpr int64_t kTileKeys = 64;  // FlashDecodeTraits::kBlockN
// A split walks at least this many key tiles: its prologue (Q, the first stages) and epilogue
// (the slice merge, the partial store) are amortised over them.
constexpr int64_t kMinSplitTiles = 4;
// At most this many CTAs (splits x KV heads x batch) per launch, which bounds the workspace.
constexpr int64_t kMaxCtas = 1024;
constexpr int kMaxGridYZ = 65535;

// Admitted key rows [lo, hi] (inclusive) of query row i; empty when lo > hi.
void RowKeys(const FlashDecodeParams& p, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t qk = p.q_pos_offset + i - p.k_pos_offset;
  *lo = 0;
  *hi = p.kv_len - 1;
  if (p.window >= 0) *lo = std::max(*lo, qk - p.window);
  if (p.causal) {
    *hi = std::min(*hi, qk);
  } else if (p.window >= 0) {
    *hi = std::min(*hi, qk + p.window);
  }
}

int HeadDimIndex(int64_t d) { return d == 64 ? 0 : 1; }
int RowTileIndex(int64_t rows) { return rows <= 16 ? 0 : rows <= 32 ? 1 : 2; }

cudaError_t CtasPerSm(const FlashDecodeParams& p, int* ctas) {
  const int rows = p.q_len * p.kv_group;
  const bool bf16 = p.dtype == DType::kBF16;
  if (p.head_dim == 64) {
    return bf16 ? FlashDecodeCtasPerSm<64, __nv_bfloat16>(rows, p.wgmma, ctas)
                : FlashDecodeCtasPerSm<64, __half>(rows, p.wgmma, ctas);
  }
  return bf16 ? FlashDecodeCtasPerSm<128, __nv_bfloat16>(rows, p.wgmma, ctas)
              : FlashDecodeCtasPerSm<128, __half>(rows, p.wgmma, ctas);
}

// (split, batch, KV head, packed row) slots of the partial results.
int64_t PartialSlots(const FlashDecodeParams& p) {
  return int64_t{p.num_splits} * p.batch * p.kv_heads * p.q_len * p.kv_group;
}

}  // namespace

bool FlashDecodeSupports(int64_t head_dim, DType dtype, int64_t q_len, int64_t kv_group) {
  return (head_dim == 64 || head_dim == 128) && (dtype == DType::kBF16 || dtype == DType::kF16) &&
         q_len >= 1 && kv_group >= 1 && q_len * kv_group <= kFlashDecodeMaxRows;
}

FlashDecodeParams BuildFlashDecodeParams(const FlashDecodeProblem& problem) {
  const FlashFwdTensors& t = problem.tensors;
  const int64_t hq = t.shape.q_heads, hkv = t.shape.kv_heads, d = t.shape.head_dim;
  const int64_t q_tokens = t.shape.tokens;
  const int64_t kv_tokens = t.kv_tokens > 0 ? t.kv_tokens : q_tokens;
  const int64_t o_tokens = t.o_tokens > 0 ? t.o_tokens : q_tokens;
  FlashDecodeParams p;
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.lse = t.lse;
  p.o_f32 = problem.o_f32;
  p.q_batch_stride = q_tokens * hq * d;
  p.q_row_stride = hq * d;
  p.q_head_stride = d;
  p.k_batch_stride = p.v_batch_stride = kv_tokens * hkv * d;
  p.k_row_stride = p.v_row_stride = hkv * d;
  p.k_head_stride = p.v_head_stride = d;
  p.o_batch_stride = o_tokens * hq * d;
  p.o_row_stride = hq * d;
  p.o_head_stride = d;
  p.lse_batch_stride = hq * q_tokens;
  p.lse_head_stride = q_tokens;
  p.lse_row_stride = 1;
  p.batch = static_cast<int32_t>(t.shape.batch);
  p.kv_heads = static_cast<int32_t>(hkv);
  p.kv_group = static_cast<int32_t>(hq / hkv);
  p.head_dim = static_cast<int32_t>(d);
  p.q_len = static_cast<int32_t>(problem.q_len);
  p.kv_len = problem.kv_len;
  p.q_pos_offset = problem.q_pos;
  p.k_pos_offset = problem.k_pos;
  p.causal = problem.causal;
  p.window = problem.window;
  if (p.window >= 0) {
    // A window of at least the largest |query - key| distance of the problem admits every pair:
    // none, so that no bound (here or in the kernels) adds a position to a caller's "unlimited"
    // window near INT64_MAX. Otherwise the window is below that distance, and position plus
    // window stays in int64 (positions are below 2^61: ValidateSpec).
    const int64_t first = problem.q_pos - problem.k_pos;  // query row 0, counted from key row 0
    const int64_t reach = std::max(first + problem.q_len - 1, problem.kv_len - 1 - first);
    if (p.window >= reach) p.window = -1;
  }
  p.dtype = t.dtype;
  p.scale = problem.scale;
  p.scale_log2 = static_cast<float>(problem.scale * M_LOG2E);

  // The union and the intersection of the rows' admitted key ranges.
  bool any = false, all = true;
  int64_t begin = 0, end = 0, full_begin = 0, full_end = 0;
  for (int64_t i = 0; i < problem.q_len; ++i) {
    int64_t lo, hi;
    RowKeys(p, i, &lo, &hi);
    if (lo > hi) {
      all = false;
      continue;
    }
    begin = any ? std::min(begin, lo) : lo;
    end = any ? std::max(end, hi + 1) : hi + 1;
    full_begin = any ? std::max(full_begin, lo) : lo;
    full_end = any ? std::min(full_end, hi + 1) : hi + 1;
    any = true;
  }
  p.key_begin = any ? begin : 0;
  p.key_end = any ? end : 0;
  // Some row admitting nothing: every tile is masked (an empty intersection).
  p.full_begin = all && any ? full_begin : 0;
  p.full_end = all && any ? std::max(full_begin, full_end) : 0;
  p.num_splits = 1;
  p.split_keys =
      std::max<int64_t>(kTileKeys, NumBlocks(p.key_end - p.key_begin, kTileKeys) * kTileKeys);
  return p;
}

int64_t FlashDecodeAdmittedPairs(const FlashDecodeParams& p) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < p.q_len; ++i) {
    int64_t lo, hi;
    RowKeys(p, i, &lo, &hi);
    pairs += std::max<int64_t>(0, hi - lo + 1);
  }
  return pairs;
}

absl::Status ChooseFlashDecodeKernel(FlashDecodeParams* p, FlashKernelArch arch) {
  const bool can_wgmma = FlashFwdSm90Built() && CurrentDeviceIsSm90();
  switch (arch) {
    case FlashKernelArch::kSm80:
      p->wgmma = false;
      break;
    case FlashKernelArch::kSm90:
      if (!can_wgmma) {
        return absl::UnimplementedError(absl::StrCat(
            "flash_decode: the sm90 (wgmma) decode kernel needs ",
            FlashFwdSm90Built() ? "a compute capability 9.x device"
                                : "a build with sm_90a (CMAKE_CUDA_ARCHITECTURES lacks 90a)"));
      }
      p->wgmma = true;
      break;
    case FlashKernelArch::kAuto:
      p->wgmma = can_wgmma && int64_t{p->q_len} * p->kv_group > kFlashDecodeWgmmaMinRows;
      break;
  }
  return absl::OkStatus();
}

absl::Status PlanFlashDecodeSplits(FlashDecodeParams* p, int forced_splits, FlashKernelArch arch) {
  ATTN_RETURN_IF_ERROR(ChooseFlashDecodeKernel(p, arch));
  const int64_t tiles = NumBlocks(std::max<int64_t>(p->key_end - p->key_begin, 1), kTileKeys);
  const int64_t units = int64_t{p->batch} * p->kv_heads;
  int64_t splits;
  if (forced_splits > 0) {
    splits = std::min<int64_t>(forced_splits, tiles);
  } else {
    int device = 0, sms = 0, ctas = 0;
    CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    // Occupancy per (head dim, row tiles, dtype) of this process's GPUs (one model per host).
    // The wgmma kernel has one row tile (index 3).
    static std::atomic<int> cache[2][4][2] = {};
    std::atomic<int>& slot =
        cache[HeadDimIndex(p->head_dim)]
             [p->wgmma ? 3 : RowTileIndex(int64_t{p->q_len} * p->kv_group)]
             [p->dtype == DType::kBF16 ? 0 : 1];
    ctas = slot.load(std::memory_order_relaxed);
    if (ctas == 0) {
      CUDA_RETURN_IF_ERROR(CtasPerSm(*p, &ctas));
      ctas = std::max(ctas, 1);
      slot.store(ctas, std::memory_order_relaxed);
    }
    const int64_t target = int64_t{sms} * ctas;
    splits = (target + units - 1) / units;
    splits = std::min(splits, std::max<int64_t>(1, tiles / kMinSplitTiles));
  }
  splits = std::max<int64_t>(1, std::min(splits, std::max<int64_t>(1, kMaxCtas / units)));
  const int64_t split_tiles = (tiles + splits - 1) / splits;
  p->split_keys = split_tiles * kTileKeys;
  p->num_splits = static_cast<int32_t>((tiles + split_tiles - 1) / split_tiles);
  return absl::OkStatus();
}

int64_t FlashDecodeWorkspaceBytes(const FlashDecodeParams& p) {
  if (p.num_splits <= 1) return 0;
  return PartialSlots(p) * (int64_t{p.head_dim} * 4 + 4);
}

void SetFlashDecodeWorkspace(FlashDecodeParams* p, void* workspace) {
  // [o_partial: slots x head_dim | lse_partial: slots], float32.
  p->o_partial = static_cast<float*>(workspace);
  p->lse_partial = p->o_partial + PartialSlots(*p) * p->head_dim;
}

int64_t FlashDecodeWorkspaceBound(int64_t head_dim) {
  return kMaxCtas * kFlashDecodeMaxRows * (head_dim * 4 + 4);
}

absl::Status RunFlashDecode(const FlashDecodeParams& p, cudaStream_t stream) {
  if (!FlashDecodeSupports(p.head_dim, p.dtype, p.q_len, p.kv_group)) {
    return absl::UnimplementedError(
        absl::StrCat("flash_decode: takes bf16/f16, head dim 64 or 128 and at most ",
                     kFlashDecodeMaxRows, " query rows per KV head; got head dim ", p.head_dim,
                     ", ", p.q_len, " x ", p.kv_group, " rows"));
  }
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.o == nullptr || p.lse == nullptr) {
    return absl::InvalidArgumentError("flash_decode: null tensor pointer");
  }
  if (p.kv_heads < 1 || p.kv_heads > kMaxGridYZ || p.batch < 1 || p.batch > kMaxGridYZ ||
      p.num_splits < 1 || p.split_keys < kTileKeys || p.split_keys % kTileKeys != 0 ||
      int64_t{p.num_splits} * p.split_keys < p.key_end - p.key_begin ||
      int64_t{p.num_splits - 1} * p.split_keys >= std::max<int64_t>(p.key_end - p.key_begin, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flash_decode: grid out of range or splits not covering the keys (KV heads ",
                     p.kv_heads, ", batch ", p.batch, ", splits ", p.num_splits, " x ",
                     p.split_keys, " keys for ", p.key_end - p.key_begin, ")"));
  }
  if (p.num_splits > 1 && (p.o_partial == nullptr || p.lse_partial == nullptr)) {
    return absl::InvalidArgumentError("flash_decode: several splits need the partial buffers");
  }
  if (FlashDecodeEmpty(p)) return absl::OkStatus();
  const bool bf16 = p.dtype == DType::kBF16;
  cudaError_t err;
  if (p.head_dim == 64) {
    err = bf16 ? RunFlashDecodeKernels<64, __nv_bfloat16>(p, stream)
               : RunFlashDecodeKernels<64, __half>(p, stream);
  } else {
    err = bf16 ? RunFlashDecodeKernels<128, __nv_bfloat16>(p, stream)
               : RunFlashDecodeKernels<128, __half>(p, stream);
  }
  CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

}  // namespace attnserve
