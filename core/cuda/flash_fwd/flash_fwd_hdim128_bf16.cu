// Instantiation: head dim 128, bf16, both layout block sizes (64, 128).
#include "core/cuda/flash_fwd/flash_fwd_launch.h"

namespace attnserve {
template cudaError_t RunFlashFwd<128, 64, __nv_bfloat16>(const FlashFwdParams&, cudaStream_t);
template cudaError_t RunFlashFwd<128, 128, __nv_bfloat16>(const FlashFwdParams&, cudaStream_t);
}  // namespace attnserve
