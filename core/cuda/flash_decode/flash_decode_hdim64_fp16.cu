// Instantiation: head dim 64, fp16, every row tile count.
#include "core/cuda/flash_decode/flash_decode_launch.h"

namespace attnserve {
template cudaError_t RunFlashDecodeKernels<64, __half>(const FlashDecodeParams&, cudaStream_t);
template cudaError_t FlashDecodeCtasPerSm<64, __half>(int, bool, int*);
}  // namespace attnserve
