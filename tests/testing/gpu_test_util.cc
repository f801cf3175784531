#include "tests/testing/gpu_test_util.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve::testing {

absl::StatusOr<DeviceBuffer> UploadBytes(CachingAllocator& alloc, const void* host, size_t bytes) {
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Create(alloc, std::max<size_t>(1, bytes)));
  if (bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.get(), host, bytes, cudaMemcpyHostToDevice));
  }
  return buf;
}

absl::StatusOr<DeviceBuffer> UploadTensor(CachingAllocator& alloc, const HostTensor& tensor) {
  return UploadBytes(alloc, tensor.data(), tensor.nbytes());
}

absl::StatusOr<DeviceBuffer> PoisonedDeviceBuffer(CachingAllocator& alloc, size_t bytes) {
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Create(alloc, std::max<size_t>(1, bytes)));
  CUDA_RETURN_IF_ERROR(cudaMemset(buf.get(), kPoisonByte, bytes));
  return buf;
}

absl::Status DownloadTensor(const void* device, HostTensor& tensor) {
  CUDA_RETURN_IF_ERROR(cudaMemcpy(tensor.data(), device, tensor.nbytes(), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

namespace {

// The body of RunPlanOnGpu on an existing allocator and stream; buffers are freed on return.
absl::Status RunPlan(const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
                     const HostTensor& v, const CudaAttentionPlan::Options& options,
                     CachingAllocator& alloc, cudaStream_t stream, PlanRunResult& result) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  const DType dtype = q.dtype();
  ATTN_ASSIGN_OR_RETURN(result.o, HostTensor::Create(dtype, {shape.batch, shape.tokens,
                                                             shape.q_heads, shape.head_dim}));
  ATTN_ASSIGN_OR_RETURN(
      result.lse, HostTensor::Create(DType::kF32, {shape.batch, shape.q_heads, shape.tokens}));
  ATTN_ASSIGN_OR_RETURN(
      auto plan, CudaAttentionPlan::Create(spec, shape, dtype, alloc, stream, nullptr, options));
  result.all_full_blocks = plan->all_full_blocks();
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer dq, UploadTensor(alloc, q));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer dk, UploadTensor(alloc, k));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer dv, UploadTensor(alloc, v));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer dout, PoisonedDeviceBuffer(alloc, result.o.nbytes()));
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer dlse, PoisonedDeviceBuffer(alloc, result.lse.nbytes()));
  ATTN_RETURN_IF_ERROR(plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream,
                                 nullptr, &result.kernel));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  ATTN_RETURN_IF_ERROR(DownloadTensor(dout.get(), result.o));
  return DownloadTensor(dlse.get(), result.lse);
}

}  // namespace

absl::StatusOr<PlanRunResult> RunPlanOnGpu(const AttentionSpec& spec, const HostTensor& q,
                                           const HostTensor& k, const HostTensor& v,
                                           const CudaAttentionPlan::Options& options, int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CachingAllocator alloc(device);
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  PlanRunResult result;
  const absl::Status st = RunPlan(spec, q, k, v, options, alloc, stream, result);
  cudaStreamDestroy(stream);
  ATTN_RETURN_IF_ERROR(st);
  result.in_use_after = alloc.Stats().in_use_bytes;
  return result;
}

}  // namespace attnserve::testing
