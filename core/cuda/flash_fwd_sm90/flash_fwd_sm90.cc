#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <string_view>

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
      // Work-item order: position-major keeps the implicit causal layout's heavy-first walk over
      // all heads; CSR layouts go head-major (the CTAs running together share one head's K/V in
      // L2).
      bool pos_major = p.col_idx == nullptr;
      if (options.item_order == Sm90ItemOrder::kPosition) pos_major = true;
      if (options.item_order == Sm90ItemOrder::kHead) pos_major = false;
      return RunFlashFwdSm90V3Impl<kHeadDim, Elem>(p, ctas, pos_major, options.sm90_overlap,
                                                   stream);
    }
    case FlashKernel::kSm90WarpSpecialized:
      return RunFlashFwdSm90V2Impl<kHeadDim, Elem>(p, stream);
    case FlashKernel::kSm90SingleTile:
      return p.block_size == 64 ? RunFlashFwdSm90Impl<kHeadDim, 64, Elem>(p, stream)
                                : RunFlashFwdSm90Impl<kHeadDim, 128, Elem>(p, stream);
    case FlashKernel::kSm80:
    case FlashKernel::kSplitKvDecode:
    case FlashKernel::kSplitKvDecodeSm90:
      break;
  }
  return cudaErrorInvalidValue;  // not an sm90 kernel: a caller bug
}

}  // namespace

std::string_view FlashKernelName(FlashKernel kernel) {
  switch (kernel) {
    case FlashKernel::kSm80:
      return "sm80";
    case FlashKernel::kSm90SingleTile:
      return "sm90";
    case FlashKernel::kSm90WarpSpecialized:
      return "sm90v2";
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
  // The warp-specialized schedules exist for layout block 128 only.
  if (p.block_size != 128) return FlashKernel::kSm90SingleTile;
  switch (options.sm90_schedule) {
    case Sm90Schedule::kSingleTile:
      return FlashKernel::kSm90SingleTile;
    case Sm90Schedule::kWarpSpecialized:
      return FlashKernel::kSm90WarpSpecialized;
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
