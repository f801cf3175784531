#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <mutex>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda/flash_fwd/flash_fwd_head_dims.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_launch.cuh"

namespace attnserve {
namespace {

// Per device: 0 unknown, 1 compute capability 9.x, 2 other.
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_is_sm90{};
// Per device: multiprocessor count (0 unknown), for the persistent grid.
std::array<std::atomic<int>, kMaxDevices> g_num_sms{};
// Per device: L2 bytes (0 unknown), for the persistent schedule's head groups.
std::array<std::atomic<int>, kMaxDevices> g_l2_bytes{};

int NumSmsOfCurrentDevice() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  if (dev >= 0 && dev < kMaxDevices) {
    const int cached = g_num_sms[dev].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0;
  if (dev < 0 || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0) {
    sms = 132;  // H100 SXM / H200; only a grid size (any value is correct)
  }
  if (dev >= 0 && dev < kMaxDevices) g_num_sms[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

int L2BytesOfCurrentDevice() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  if (dev >= 0 && dev < kMaxDevices) {
    const int cached = g_l2_bytes[dev].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int bytes = 0;
  if (dev < 0 || cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess ||
      bytes <= 0) {
    bytes = 50 << 20;  // H100 / H200; only a grouping heuristic (any value is correct)
  }
  if (dev >= 0 && dev < kMaxDevices) g_l2_bytes[dev].store(bytes, std::memory_order_relaxed);
  return bytes;
}

// The dynamic deal's counter pair of `stream` on the current device (RunFlashFwdSm90PersistentImpl:
// two int32, 0 between launches): allocated and zeroed on the stream at its first launch, kept
// for the process's life (8 bytes a stream). Launches on one stream run one after another, so a
// pair is never used by two at once; streams are told apart by their ID (cudaStreamGetId), which
// is not reused when a stream is destroyed and another created, as its handle may be. Null where
// any of it fails: the launch then deals its items statically.
int* DealCounterOf(cudaStream_t stream) {
  int dev = 0;
  unsigned long long id = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaStreamGetId(stream, &id) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  static std::mutex mu;
  static auto* counters = new std::vector<std::tuple<int, unsigned long long, int*>>();
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, i, c] : *counters) {
    if (d == dev && i == id) return c;
  }
  int* c = nullptr;
  if (cudaMalloc(&c, 2 * sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaMemsetAsync(c, 0, 2 * sizeof(int), stream) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(c);
    return nullptr;
  }
  counters->emplace_back(dev, id, c);
  return c;
}

// Whether the D = 128 persistent kernel takes K/V tiles of 176 keys (Sm90KeyTile): the implicit
// dense and causal layouts only (a CSR tile is one layout block). kAuto: from 16384 keys on.
// Measured on an H200 (bench/results/h200x2-2026-11-27-kernel4/ab-keytile, three interleaved
// reps, 176 against 128): N = 4096 +4% (causal +9%: a 176-key tile holds 23.3 of them, and the
// second stage less), N = 16384 level (-1%), N = 65536 -4% (causal -6%). Since the softmax
// halves around the P V wait (h200x2-2026-11-28-kernel7: ab-ew, ab-hy, ab-keytile): N = 16384
// causal 2.2-2.6% faster in three calls, dense 1-6.5% (its power-capped spread); N = 4096
// causal still 4.4% slower. So from 16384 on.
bool Sm90WideKeyTiles(const FlashFwdParams& p, Sm90KeyTile tile) {
  if (p.col_idx != nullptr) return false;
  switch (tile) {
    case Sm90KeyTile::k176:
      return true;
    case Sm90KeyTile::k128:
      return false;
    case Sm90KeyTile::kAuto:
      return (p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen) >= 16384;
  }
  return false;
}

template <int kHeadDim, typename Elem>
cudaError_t Launch(const FlashFwdParams& p, FlashKernel kernel, const FlashKernelOptions& options,
                   cudaStream_t stream) {
  switch (kernel) {
    case FlashKernel::kSm90Persistent: {
      int ctas = NumSmsOfCurrentDevice();
      // A cap below the SM count (tests: many work items per CTA); 0 means none.
      if (options.persistent_max_ctas > 0 && options.persistent_max_ctas < ctas) {
        ctas = options.persistent_max_ctas;
      }
      int group = Sm90HeadGroup(p, ctas, L2BytesOfCurrentDevice(), options.item_order);
      // The dynamic deal (CSR layouts): the stream's counter pair, or null for the static one.
      int* const deal = p.col_idx != nullptr && options.sm90_item_deal != Sm90ItemDeal::kStatic
                            ? DealCounterOf(stream)
                            : nullptr;
      if (options.persistent_head_group > 0) {
        group = std::min(options.persistent_head_group,
                         std::max(1, p.num_heads * p.batch * p.num_segs));
      }
      // Layout block 64: 64-row items, 64-key tiles, one consumer warpgroup, two CTAs per SM
      // (the launcher's grid is two per SM of `ctas`).
      if (p.block_size == 64) {
        return RunFlashFwdSm90PersistentImpl<kHeadDim, Elem, 1, 64>(p, ctas, group,
                                                                   options.sm90_tma, stream, deal);
      }
      // D = 64, implicit layouts: items of 192 query rows (three consumer warpgroups) unless
      // asked for 128; the launcher refuses where they do not apply (no TMA).
      if constexpr (kHeadDim == 64) {
        if (options.sm90_query_tile != Sm90QueryTile::k128 && p.col_idx == nullptr) {
          const cudaError_t err = RunFlashFwdSm90PersistentImpl<kHeadDim, Elem, 3>(
              p, ctas, group, options.sm90_tma, stream);
          if (err != cudaErrorNotSupported) return err;
        }
      } else {
        // D = 128, implicit layouts: 176-key tiles where chosen; the launcher refuses without TMA.
        if (Sm90WideKeyTiles(p, options.sm90_key_tile)) {
          // Clusters of two (dense and causal layouts); the launcher refuses CSR, no TMA.
          if (options.sm90_cluster != Sm90Cluster::k1) {
            const cudaError_t err = RunFlashFwdSm90PersistentImpl<kHeadDim, Elem, 2, 176, 2>(
                p, ctas, group, options.sm90_tma, stream);
            if (err != cudaErrorNotSupported) return err;
          }
          const cudaError_t err = RunFlashFwdSm90PersistentImpl<kHeadDim, Elem, 2, 176>(
              p, ctas, group, options.sm90_tma, stream);
          if (err != cudaErrorNotSupported) return err;
        }
      }
      // Layouts of whole full blocks (a CSR of kFull entries, the dense non-causal layout, key
      // length a multiple of the block): the tile loop without a mask path (the launcher
      // refuses other layouts, and loads without TMA).
      if (Sm90FullTiles(p)) {
        const cudaError_t err = RunFlashFwdSm90PersistentImpl<kHeadDim, Elem, 2, 128, 1, true>(
            p, ctas, group, options.sm90_tma, stream, deal);
        if (err != cudaErrorNotSupported) return err;
      }
      return RunFlashFwdSm90PersistentImpl<kHeadDim, Elem>(p, ctas, group, options.sm90_tma,
                                                           stream, deal);
    }
    case FlashKernel::kSm80:
    case FlashKernel::kSplitKvDecode:
    case FlashKernel::kSplitKvDecodeSm90:
      break;
  }
  return cudaErrorInvalidValue;  // not an sm90 kernel: a caller bug
}

// cuTensorMapEncodeTiled from the driver the runtime loaded (no link against libcuda), or null.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// One Q, K or V map: dims (innermost first) head dim, row, head, segment, batch.
cudaError_t EncodeMap(const void* base, DType dtype, const FlashFwdParams& p, int64_t rows,
                        int64_t kv_heads, int64_t row_stride, int64_t head_stride,
                        int64_t seg_stride, int64_t batch_stride, int box_rows, void* out) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr int64_t kEs = 2;  // bf16 / f16
  const int64_t extents[5] = {p.head_dim, rows, kv_heads, p.num_segs, p.batch};
  const int64_t strides[4] = {row_stride * kEs, head_stride * kEs, seg_stride * kEs,
                              batch_stride * kEs};
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return cudaErrorNotSupported;
  cuuint64_t dims[5];
  cuuint64_t byte_strides[4];
  for (int i = 0; i < 5; ++i) {
    if (extents[i] < 1 || extents[i] > (int64_t{1} << 31) - 1) return cudaErrorNotSupported;
    dims[i] = static_cast<cuuint64_t>(extents[i]);
  }
  for (int i = 0; i < 4; ++i) {
    int64_t st = strides[i];
    // A dimension of extent 1 is only ever at coordinate 0: any legal stride describes it.
    if (extents[i + 1] == 1) st = std::max<int64_t>(16, st - st % 16);
    if (st <= 0 || st % 16 != 0 || st >= (int64_t{1} << 40)) return cudaErrorNotSupported;
    byte_strides[i] = static_cast<cuuint64_t>(st);
  }
  const cuuint32_t box[5] = {64, static_cast<cuuint32_t>(box_rows), 1, 1, 1};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode(
      &map, dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      5, const_cast<void*>(base), dims, byte_strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorNotSupported;
  std::memcpy(out, &map, sizeof(map));
  return cudaSuccess;
}

}  // namespace

bool Sm90FullTiles(const FlashFwdParams& p) {
  return p.block_size == 128 && FlashFwdTilesAllFull(p);
}

int Sm90HeadGroup(const FlashFwdParams& p, int ctas, int64_t l2_bytes, Sm90ItemOrder order) {
  const int64_t hz = std::max<int64_t>(1, int64_t{p.num_heads} * p.batch * p.num_segs);
  if (order == Sm90ItemOrder::kPosition) return static_cast<int>(hz);
  if (order == Sm90ItemOrder::kHead) return 1;
  // K and V of one (head, batch, segment); the group's share of L2 is half of it, the rest is
  // Q, O and whatever else runs.
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  const int64_t kv_bytes = std::max<int64_t>(1, 2 * nk * p.head_dim * 2);
  const int64_t group = std::max<int64_t>(1, (l2_bytes / 2) / kv_bytes);
  // The implicit causal layout walks its rows heaviest first, which balances the CTAs only over
  // many items: small groups leave each group's light end unbalanced (H200, N = 16384, 16 heads:
  // groups of 3 -10%, of 1 -29% against one group). It goes head-major only when a single
  // head's K/V already fills the L2 share (N = 65536: +9% over one group).
  if (p.col_idx == nullptr && p.dense_causal) return group == 1 ? 1 : static_cast<int>(hz);
  (void)ctas;
  return static_cast<int>(std::min(group, hz));
}

cudaError_t MakeSm90TmaMaps(const FlashFwdParams& p, int box_rows, Sm90TmaMaps* maps,
                            int q_box_rows) {
  if (q_box_rows <= 0) q_box_rows = box_rows;
  static_assert(sizeof(CUtensorMap) == sizeof(maps->k), "an opaque 128-byte map");
  if (p.head_dim != 64 && p.head_dim != 128) return cudaErrorNotSupported;
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) return cudaErrorNotSupported;
  const int64_t k_rows = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  const int64_t q_heads = p.head_start + int64_t{p.num_heads - 1} * p.head_step + 1;
  const int64_t kv_heads = (q_heads - 1) / p.kv_group + 1;
  cudaError_t err = EncodeMap(p.q, p.dtype, p, p.seqlen, q_heads, p.q_row_stride, p.q_head_stride,
                              p.q_seg_stride, p.q_batch_stride, q_box_rows, maps->q);
  if (err != cudaSuccess) return err;
  err = EncodeMap(p.k, p.dtype, p, k_rows, kv_heads, p.k_row_stride, p.k_head_stride,
                  p.k_seg_stride, p.k_batch_stride, box_rows, maps->k);
  if (err != cudaSuccess) return err;
  return EncodeMap(p.v, p.dtype, p, k_rows, kv_heads, p.v_row_stride, p.v_head_stride,
                   p.v_seg_stride, p.v_batch_stride, box_rows, maps->v);
}

std::string_view FlashKernelName(FlashKernel kernel) {
  switch (kernel) {
    case FlashKernel::kSm80:
      return "sm80";
    case FlashKernel::kSm90Persistent:
      return "sm90v3";
    case FlashKernel::kSplitKvDecode:
      return "decode";
    case FlashKernel::kSplitKvDecodeSm90:
      return "decode_sm90";
  }
  return "sm80";
}

bool FlashFwdSm90Built() {
#if defined(ATTNSERVE_FLASH_SM90_BUILT) && ATTNSERVE_FLASH_SM90_BUILT
  return true;
#else
  return false;
#endif
}

bool FlashFwdSm90Supports(const FlashFwdParams& p, std::string* why) {
  auto no = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (!FlashFwdSm90Built()) {
    return no("this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES lacks 90a)");
  }
  // The sm90 kernels are instantiated for the same head dims as the sm80 ones.
  if (!FlashFwdHasHeadDim(p.head_dim)) {
    return no(absl::StrCat("head_dim ", p.head_dim,
                           " (sm90 kernel: ", absl::StrJoin(kFlashFwdHeadDims, ", "), ")"));
  }
  if (p.block_size != 64 && p.block_size != 128) {
    return no(absl::StrCat("block_size ", p.block_size, " (sm90 kernel: 64, 128)"));
  }
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) {
    return no("dtype (sm90 kernel: bf16, f16)");
  }
  return true;
}

bool CurrentDeviceIsSm90() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev >= 0 && dev < kMaxDevices) {
    const int cached = g_is_sm90[dev].load(std::memory_order_relaxed);
    if (cached != 0) return cached == 1;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    return false;
  }
  const bool is90 = major == 9;
  if (dev >= 0 && dev < kMaxDevices) g_is_sm90[dev].store(is90 ? 1 : 2, std::memory_order_relaxed);
  return is90;
}

absl::StatusOr<FlashKernel> FlashKernelFor(const FlashFwdParams& p,
                                           const FlashKernelOptions& options) {
  if (options.arch == FlashKernelArch::kSm80) return FlashKernel::kSm80;
  std::string why;
  bool ok = FlashFwdSm90Supports(p, &why);
  if (ok && !CurrentDeviceIsSm90()) {
    ok = false;
    why = "the current device is not compute capability 9.x";
  }
  if (!ok) {
    if (options.arch == FlashKernelArch::kSm90) {
      return absl::UnimplementedError(
          absl::StrCat("flash kernel sm90 was asked for, but it cannot run: ", why));
    }
    return FlashKernel::kSm80;
  }
  switch (options.sm90_schedule) {
    case Sm90Schedule::kPersistent:
      return FlashKernel::kSm90Persistent;
  }
  return FlashKernel::kSm90Persistent;
}

cudaError_t RunFlashFwdSm90(const FlashFwdParams& p, FlashKernel kernel,
                            const FlashKernelOptions& options, cudaStream_t stream) {
  if (p.dtype == DType::kBF16) {
    return p.head_dim == 64 ? Launch<64, __nv_bfloat16>(p, kernel, options, stream)
                            : Launch<128, __nv_bfloat16>(p, kernel, options, stream);
  }
  return p.head_dim == 64 ? Launch<64, __half>(p, kernel, options, stream)
                          : Launch<128, __half>(p, kernel, options, stream);
}

}  // namespace attnserve
