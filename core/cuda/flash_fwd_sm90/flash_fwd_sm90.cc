#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_launch.cuh"

namespace attnserve {
namespace {

std::atomic<const char*> g_last_kernel{"none"};
// Name of the variant the last RunFlashFwdSm90 of this thread launched.
thread_local const char* t_last_sm90 = kFlashKernelSm90;

// Per device: 0 unknown, 1 compute capability 9.x, 2 other.
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_is_sm90{};
// Per device: multiprocessor count (0 unknown), for v3's persistent grid.
std::array<std::atomic<int>, kMaxDevices> g_num_sms{};

int NumSmsOfCurrentDevice() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  if (dev >= 0 && dev < kMaxDevices) {
    const int cached = g_num_sms[dev].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0;
  if (dev < 0 ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0) {
    sms = 132;  // H100 SXM / H200; only a grid size (any value is correct)
  }
  if (dev >= 0 && dev < kMaxDevices) g_num_sms[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

template <int kHeadDim, typename Elem>
cudaError_t DispatchBlock(const FlashFwdParams& p, Sm90Variant variant, cudaStream_t stream) {
  if (p.block_size == 64) {
    t_last_sm90 = kFlashKernelSm90;  // no v2 / v3 for block 64
    return RunFlashFwdSm90Impl<kHeadDim, 64, Elem>(p, stream);
  }
  if (variant == Sm90Variant::kV3) {
    t_last_sm90 = kFlashKernelSm90V3;
    int ctas = NumSmsOfCurrentDevice();
    // Test knob: cap the persistent grid (more work items per CTA). 0 / unset / invalid: none.
    if (const char* cap = std::getenv("ATTNSERVE_SM90_V3_MAX_CTAS"); cap != nullptr) {
      const int c = std::atoi(cap);
      if (c > 0 && c < ctas) ctas = c;
    }
    // Work-item order: position-major keeps the implicit causal layout's heavy-first walk over
    // all heads; CSR layouts go head-major (the CTAs running together share one head's K/V in
    // L2). ATTNSERVE_SM90_V3_ORDER=position|head overrides it (measurements).
    bool pos_major = p.col_idx == nullptr;
    if (const char* order = std::getenv("ATTNSERVE_SM90_V3_ORDER"); order != nullptr) {
      const std::string_view o(order);
      if (o == "position") pos_major = true;
      if (o == "head") pos_major = false;
    }
    return RunFlashFwdSm90V3Impl<kHeadDim, Elem>(p, ctas, pos_major, stream);
  }
  if (variant == Sm90Variant::kV2) {
    t_last_sm90 = kFlashKernelSm90V2;
    return RunFlashFwdSm90V2Impl<kHeadDim, Elem>(p, stream);
  }
  t_last_sm90 = kFlashKernelSm90;
  return RunFlashFwdSm90Impl<kHeadDim, 128, Elem>(p, stream);
}

}  // namespace

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
  if (p.head_dim != 64 && p.head_dim != 128) {
    return no(absl::StrCat("head_dim ", p.head_dim, " (sm90 kernel: 64, 128)"));
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

bool Sm90VariantFromEnv(Sm90Variant* variant, std::string* bad_value) {
  const char* env = std::getenv("ATTNSERVE_SM90_VARIANT");
  const std::string_view v = env != nullptr ? std::string_view(env) : std::string_view();
  if (v.empty()) {
    *variant = kSm90DefaultVariant;
  } else if (v == "v1") {
    *variant = Sm90Variant::kV1;
  } else if (v == "v2") {
    *variant = Sm90Variant::kV2;
  } else if (v == "v3") {
    *variant = Sm90Variant::kV3;
  } else {
    if (bad_value != nullptr) *bad_value = std::string(v);
    *variant = kSm90DefaultVariant;
    return false;
  }
  return true;
}

absl::StatusOr<const char*> FlashKernelFor(const FlashFwdParams& p) {
  {
    Sm90Variant variant;
    std::string bad;
    if (!Sm90VariantFromEnv(&variant, &bad)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ATTNSERVE_SM90_VARIANT: expected v1, v2 or v3, got '", bad, "'"));
    }
  }
  const char* env = std::getenv("ATTNSERVE_FLASH_KERNEL");
  const std::string_view pref = env != nullptr ? std::string_view(env) : std::string_view("auto");
  if (pref == "sm80") return kFlashKernelSm80;
  if (pref != "auto" && !pref.empty() && pref != "sm90") {
    return absl::InvalidArgumentError(absl::StrCat(
        "ATTNSERVE_FLASH_KERNEL: expected auto, sm80 or sm90, got '", std::string(pref), "'"));
  }
  std::string why;
  bool ok = FlashFwdSm90Supports(p, &why);
  if (ok && !CurrentDeviceIsSm90()) {
    ok = false;
    why = "the current device is not compute capability 9.x";
  }
  if (ok) return kFlashKernelSm90;
  if (pref == "sm90") {
    return absl::UnimplementedError(
        absl::StrCat("ATTNSERVE_FLASH_KERNEL=sm90: the sm90 kernel cannot run: ", why));
  }
  return kFlashKernelSm80;
}

const char* LastFlashKernelName() { return g_last_kernel.load(std::memory_order_relaxed); }
void SetLastFlashKernelName(const char* name) {
  if (name != nullptr && std::string_view(name) == kFlashKernelSm90) name = t_last_sm90;
  g_last_kernel.store(name, std::memory_order_relaxed);
}

cudaError_t RunFlashFwdSm90(const FlashFwdParams& p, cudaStream_t stream) {
  Sm90Variant v;
  Sm90VariantFromEnv(&v);  // invalid values were refused by FlashKernelFor
  if (p.dtype == DType::kBF16) {
    return p.head_dim == 64 ? DispatchBlock<64, __nv_bfloat16>(p, v, stream)
                            : DispatchBlock<128, __nv_bfloat16>(p, v, stream);
  }
  return p.head_dim == 64 ? DispatchBlock<64, __half>(p, v, stream)
                          : DispatchBlock<128, __half>(p, v, stream);
}

}  // namespace attnserve
