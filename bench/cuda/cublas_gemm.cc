#include "bench/cuda/cublas_gemm.h"

#include <cublas_v2.h>  // types only: cuBLAS is loaded with dlopen (see CublasApi)
#include <dlfcn.h>

#include <cstdint>

#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

struct CublasApi {
  using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
  using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
  using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;

  static absl::StatusOr<CublasApi> Load() {
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                             "/usr/local/cuda/lib64/libcublas.so.13",
                             "/usr/local/cuda/lib64/libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) return absl::UnavailableError("libcublas not found (dlopen)");
    CublasApi api;
    api.create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
    api.destroy = reinterpret_cast<DestroyFn>(dlsym(lib, "cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    api.gemm_ex = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    if (!api.create || !api.destroy || !api.set_stream || !api.gemm_ex) {
      return absl::UnavailableError("libcublas lacks cublasCreate_v2/cublasGemmEx");
    }
    return api;
  }
};

}  // namespace

absl::StatusOr<double> MeasureBf16GemmGflops(CachingAllocator& alloc, cudaStream_t stream) {
  constexpr int kN = 8192;
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Create(alloc, size_t{kN} * kN * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(alloc, size_t{kN} * kN * 2));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer c, DeviceBuffer::Create(alloc, size_t{kN} * kN * 2));
  CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(DType::kBF16, a.get(), int64_t{kN} * kN, 11, -1, 1, stream));
  CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(DType::kBF16, b.get(), int64_t{kN} * kN, 12, -1, 1, stream));
  ATTN_ASSIGN_OR_RETURN(const CublasApi api, CublasApi::Load());
  cublasHandle_t h;
  if (api.create(&h) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate");
  api.set_stream(h, stream);
  const float alpha = 1.f, beta = 0.f;
  auto gemm = [&]() {
    return api.gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &alpha, a.get(), CUDA_R_16BF, kN,
                       b.get(), CUDA_R_16BF, kN, &beta, c.get(), CUDA_R_16BF, kN,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; ++i) st = gemm();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  constexpr int kIters = 10;
  cudaEventRecord(e0, stream);
  for (int i = 0; i < kIters && st == CUBLAS_STATUS_SUCCESS; ++i) st = gemm();
  cudaEventRecord(e1, stream);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  api.destroy(h);
  if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasGemmEx failed");
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return 2.0 * kN * kN * kN * kIters / (ms * 1e-3) / 1e9;
}

}  // namespace attnserve::bench
