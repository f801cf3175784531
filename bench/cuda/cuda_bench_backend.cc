// attnbench's `--backend cuda`: one GPU behind the BenchBackend interface (see cuda_bench.h).
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/bench_backend.h"
#include "bench/cuda/case_runner.h"
#include "bench/cuda/cublas_gemm.h"
#include "bench/cuda/cuda_bench.h"
#include "bench/cuda/plan_launch.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

class CudaBenchBackend final : public BenchBackend {
 public:
  CudaBenchBackend(int device, const CudaOptions& options)
      : device_(device), options_(options), alloc_(device) {}
  ~CudaBenchBackend() override {
    plan_.reset();
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  absl::Status Init() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }

  std::string device() const override {
    return absl::StrCat("cuda:", device_, ": ", CudaDeviceName(device_));
  }

  absl::Status Prepare(const AttentionSpec& spec, const CompiledPattern& compiled,
                       const HostTensor& q, const HostTensor& k, const HostTensor& v) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    shape_ = AttentionShape{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    dtype_ = q.dtype();
    plan_.reset();
    ATTN_ASSIGN_OR_RETURN(
        plan_, MakeBenchPlan(spec, shape_, dtype_, alloc_, stream_, options_, &compiled));
    ATTN_ASSIGN_OR_RETURN(q_, DeviceBuffer::Create(alloc_, q.nbytes()));
    ATTN_ASSIGN_OR_RETURN(k_, DeviceBuffer::Create(alloc_, k.nbytes()));
    ATTN_ASSIGN_OR_RETURN(v_, DeviceBuffer::Create(alloc_, v.nbytes()));
    ATTN_ASSIGN_OR_RETURN(out_.o, HostTensor::Create(dtype_, {shape_.batch, shape_.tokens,
                                                              shape_.q_heads, shape_.head_dim}));
    ATTN_ASSIGN_OR_RETURN(out_.lse, HostTensor::Create(DType::kF32, {shape_.batch, shape_.q_heads,
                                                                     shape_.tokens}));
    ATTN_ASSIGN_OR_RETURN(o_, DeviceBuffer::Create(alloc_, out_.o.nbytes()));
    ATTN_ASSIGN_OR_RETURN(lse_, DeviceBuffer::Create(alloc_, out_.lse.nbytes()));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(q_.get(), q.data(), q.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(k_.get(), k.data(), k.nbytes(), cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(v_.get(), v.data(), v.nbytes(), cudaMemcpyHostToDevice));
    // Poisoned, so an element the kernels skip shows up in attnbench's check.
    CUDA_RETURN_IF_ERROR(cudaMemset(o_.get(), 0xFF, out_.o.nbytes()));
    CUDA_RETURN_IF_ERROR(cudaMemset(lse_.get(), 0xFF, out_.lse.nbytes()));
    return absl::OkStatus();
  }

  absl::Status Run() override {
    if (plan_ == nullptr) return absl::FailedPreconditionError("Run before Prepare");
    ATTN_RETURN_IF_ERROR(RunBenchPlan(*plan_, q_.get(), k_.get(), v_.get(), o_.get(),
                                      lse_.as<float>(), stream_, &kernel_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<const AttentionOutputs*> Outputs() override {
    if (plan_ == nullptr) return absl::FailedPreconditionError("Outputs before Prepare");
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out_.o.data(), o_.get(), out_.o.nbytes(), cudaMemcpyDeviceToHost));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out_.lse.data(), lse_.get(), out_.lse.nbytes(), cudaMemcpyDeviceToHost));
    return &out_;
  }

  absl::StatusOr<double> MeasureGemmGflops() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return MeasureBf16GemmGflops(alloc_, stream_);
  }

  std::string kernel() const override { return kernel_; }

 private:
  const int device_;
  const CudaOptions options_;
  cudaStream_t stream_ = nullptr;
  CachingAllocator alloc_;
  std::unique_ptr<CudaAttentionPlan> plan_;
  AttentionShape shape_;
  DType dtype_ = DType::kBF16;
  DeviceBuffer q_, k_, v_, o_, lse_;
  AttentionOutputs out_;
  std::string kernel_;  // of the last Run
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchBackend>> MakeCudaBenchBackend(int device,
                                                                    const CudaOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError("--backend cuda: no CUDA device");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: ", device, " out of range [0, ", count, ")"));
  }
  auto backend = std::make_unique<CudaBenchBackend>(device, options);
  ATTN_RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace attnserve::bench
