// Instantiation: head dim 64, bf16, both layout block sizes (64, 128).
#include "core/cuda/flash_fwd/flash_fwd_launch.h"

namespace attnserve {
template cudaError_t RunFlashFwd<64, 64, __nv_bfloat16>(const FlashFwdParams&, cudaStream_t);
template cudaError_t RunFlashFwd<64, 128, __nv_bfloat16>(const FlashFwdParams&, cudaStream_t);
}  // namespace attnserve
