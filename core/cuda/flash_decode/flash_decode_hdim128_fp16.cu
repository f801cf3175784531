// Instantiation: head dim 128, fp16, every row tile count.
#include "core/cuda/flash_decode/flash_decode_launch.h"

namespace attnserve {
template cudaError_t RunFlashDecodeKernels<128, __half>(const FlashDecodeParams&, cudaStream_t);
template cudaError_t FlashDecodeCtasPerSm<128, __half>(int, bool, int*);
}  // namespace attnserve
