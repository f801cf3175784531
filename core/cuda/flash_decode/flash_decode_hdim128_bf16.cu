// Instantiation: head dim 128, bf16, every row tile count.
#include "core/cuda/flash_decode/flash_decode_launch.h"

namespace attnserve {
template cudaError_t RunFlashDecodeKernels<128, __nv_bfloat16>(const FlashDecodeParams&,
                                                               cudaStream_t);
template cudaError_t FlashDecodeCtasPerSm<128, __nv_bfloat16>(int, bool, int*);
}  // namespace attnserve
