// The parts of the cuDNN SDPA engine that need no cuDNN: which cases it is meant for (from the
// shapes alone), and the free-function and timing helpers over a CudnnSdpa.
#include <cuda_runtime.h>

#include <variant>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#include "core/cuda/cudnn_sdpa/cudnn_sdpa_internal.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {

absl::StatusOr<bool> CudnnSdpaSupports(const AttentionSpec& spec, const AttentionShape& shape,
                                       DType dtype) {
  ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered
  const bool pattern_ok = std::holds_alternative<DenseSpec>(spec.pattern) ||
                          std::holds_alternative<WindowSpec>(spec.pattern);
  const bool dtype_ok = dtype == DType::kBF16 || dtype == DType::kF16;
  const bool dim_ok = shape.head_dim % 8 == 0 && shape.head_dim >= 8 && shape.head_dim <= 256;
  const bool tokens_ok = shape.tokens >= 2 && shape.tokens <= kCudnnMaxTokens;
  const bool heads_ok = shape.kv_heads >= 1 && shape.q_heads % shape.kv_heads == 0;
  return pattern_ok && dtype_ok && dim_ok && tokens_ok && heads_ok;
}

absl::Status CheckCudnnPieceCovered(const CudnnSdpaPiece& piece) {
  const bool dtype_ok = piece.dtype == DType::kBF16 || piece.dtype == DType::kF16;
  const bool dim_ok = piece.head_dim % 8 == 0 && piece.head_dim >= 8 && piece.head_dim <= 256;
  const bool heads_ok =
      piece.q_heads >= 1 && piece.kv_heads >= 1 && piece.q_heads % piece.kv_heads == 0;
  const bool tokens_ok = piece.batch >= 1 && piece.q_tokens >= 1 && piece.kv_tokens >= 1 &&
                         piece.q_tokens <= kCudnnMaxTokens && piece.kv_tokens <= kCudnnMaxTokens &&
                         piece.q_tokens * piece.kv_tokens >= 2;
  const bool strides_ok =
      piece.q_batch_stride >= piece.q_tokens * piece.q_heads * piece.head_dim &&
      piece.kv_batch_stride >= piece.kv_tokens * piece.kv_heads * piece.head_dim &&
      piece.q_batch_stride % 8 == 0 && piece.kv_batch_stride % 8 == 0;
  if (!dtype_ok || !dim_ok || !heads_ok || !tokens_ok || !strides_ok ||
      (piece.causal && piece.q_tokens > piece.kv_tokens) || !(piece.scale > 0.f)) {
    return absl::UnimplementedError(absl::StrCat(
        "cudnn_sdpa: piece [B=", piece.batch, ", N_q=", piece.q_tokens, ", N_kv=", piece.kv_tokens,
        ", Hq=", piece.q_heads, ", Hkv=", piece.kv_heads, ", D=", piece.head_dim, "] ",
        std::string(DTypeName(piece.dtype)), piece.causal ? " causal" : "",
        " is not covered (bf16/f16, D % 8 == 0 and <= 256, Hq % Hkv == 0, batch strides >= one"
        " batch and multiples of 8, causal needs N_q <= N_kv, scale > 0)"));
  }
  return absl::OkStatus();
}

absl::Status CudnnSdpaForward(CudnnSdpa& sdpa, const AttentionSpec& spec,
                              const AttentionShape& shape, DType dtype, const void* q,
                              const void* k, const void* v, void* o, float* lse,
                              cudaStream_t stream) {
  return sdpa.Forward(spec, shape, dtype, q, k, v, o, lse, stream);
}

absl::StatusOr<double> TimeCudnnSdpaMs(CudnnSdpa& sdpa, const AttentionSpec& spec,
                                       const AttentionShape& shape, DType dtype, const void* q,
                                       const void* k, const void* v, void* o, float* lse,
                                       cudaStream_t stream, int warmup, int iters) {
  if (iters < 1) return absl::InvalidArgumentError("TimeCudnnSdpaMs: iters: expected >= 1");
  for (int i = 0; i < warmup; ++i) {
    ATTN_RETURN_IF_ERROR(sdpa.Forward(spec, shape, dtype, q, k, v, o, lse, stream));
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  const cudaError_t err = cudaEventCreate(&stop);
  if (err != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaErrorToStatus(err, "cudaEventCreate(&stop)", __FILE__, __LINE__);
  }
  absl::StatusOr<double> result = [&]() -> absl::StatusOr<double> {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) {
      ATTN_RETURN_IF_ERROR(sdpa.Forward(spec, shape, dtype, q, k, v, o, lse, stream));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / iters;
  }();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return result;
}

}  // namespace attnserve
