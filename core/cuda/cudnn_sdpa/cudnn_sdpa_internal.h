// Internals shared by the cudnn_sdpa translation units (not part of the engine's API): the token
// bound of cuDNN's kernels, loading libcudnn (cudnn_library.cc) and the coverage rules of a piece
// (cudnn_sdpa_support.cc).
#ifndef ATTNSERVE_CORE_CUDA_CUDNN_SDPA_CUDNN_SDPA_INTERNAL_H_
#define ATTNSERVE_CORE_CUDA_CUDNN_SDPA_CUDNN_SDPA_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"

namespace attnserve {

// cuDNN's kernels index tokens with 32-bit integers.
inline constexpr int64_t kCudnnMaxTokens = int64_t{1} << 30;

struct CudnnLibrary {
  void* handle = nullptr;  // null: nothing could be loaded
  std::string path;        // what was loaded
  std::string error;       // why nothing was, when handle is null
};

// Finds and loads libcudnn (the search order is in cudnn_sdpa.h). Dynamic-loading builds: the
// caller hands `handle` to cudnn_frontend before any frontend call. Linked builds: a non-null
// token.
CudnnLibrary LoadCudnnLibrary();

// OK when ForwardPiece covers `piece` (bf16/f16, D % 8 == 0 and <= 256, Hq % Hkv == 0, batch
// strides at least one batch and multiples of 8, causal only with N_q <= N_kv, scale > 0);
// UNIMPLEMENTED naming the rules otherwise.
absl::Status CheckCudnnPieceCovered(const CudnnSdpaPiece& piece);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDNN_SDPA_CUDNN_SDPA_INTERNAL_H_
