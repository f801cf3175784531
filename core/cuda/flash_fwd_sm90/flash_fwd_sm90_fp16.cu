// Instantiations of the sm90 kernel: fp16, head dims 64/128, layout blocks 64/128.
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_launch.cuh"

namespace attnserve {
template cudaError_t RunFlashFwdSm90Impl<64, 64, __half>(const FlashFwdParams&, cudaStream_t);
template cudaError_t RunFlashFwdSm90Impl<64, 128, __half>(const FlashFwdParams&, cudaStream_t);
template cudaError_t RunFlashFwdSm90Impl<128, 64, __half>(const FlashFwdParams&, cudaStream_t);
template cudaError_t RunFlashFwdSm90Impl<128, 128, __half>(const FlashFwdParams&, cudaStream_t);
}  // namespace attnserve
