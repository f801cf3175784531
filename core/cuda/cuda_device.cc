#include "core/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

std::string UuidString(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    absl::StrAppendFormat(&s, "%02x", b[i]);
    if (i == 3 || i == 5 || i == 7 || i == 9) s += '-';
  }
  return s;
}

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal) {
    auto dev = std::unique_ptr<CudaDevice>(new CudaDevice(ordinal));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaDeviceProp prop;
    CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
    dev->model_ = prop.name;
    dev->uuid_ = UuidString(prop.uuid);
    dev->total_bytes_ = static_cast<int64_t>(prop.totalGlobalMem);
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&dev->stream_, cudaStreamNonBlocking));
    return dev;
  }

  ~CudaDevice() override {
    if (stream_ != nullptr) {
      cudaSetDevice(ordinal_);
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  std::string uuid() const override { return uuid_; }
  std::string model() const override { return model_; }

  DeviceStats Stats() const override {
    const AllocatorStats a = alloc_.Stats();
    DeviceStats s;
    s.memory_used_bytes = a.in_use_bytes;
    s.memory_reserved_bytes = a.reserved_bytes;
    s.memory_peak_bytes = a.peak_bytes;
    s.memory_total_bytes = a.total_bytes > 0 ? a.total_bytes : total_bytes_;
    s.memory_free_bytes = a.free_bytes;
    return s;
  }

  int64_t EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                        DType dtype) const override {
    return CudaAttentionPlan::EstimateBytes(spec, shape, dtype);
  }

  absl::StatusOr<AttentionOutputs> Run(const AttentionSpec& spec, const HostTensor& q,
                                       const HostTensor& k, const HostTensor& v,
                                       const RunControl& control, RunInfo* info) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<AttentionOutputs> out = RunImpl(spec, q, k, v, control, info);
    // Whatever happened, leave the stream idle so freed workspaces are safe to reuse.
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    if (info != nullptr) info->compute_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return out;
  }

 private:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal), alloc_(ordinal) {}

  absl::Status CheckControl(const RunControl& control) const {
    if (control.cancel != nullptr && control.cancel->load()) {
      return absl::CancelledError(absl::StrCat(name(), ": run cancelled"));
    }
    if (absl::Now() > control.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name(), ": deadline passed"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<AttentionOutputs> RunImpl(const AttentionSpec& spec, const HostTensor& q,
                                           const HostTensor& k, const HostTensor& v,
                                           const RunControl& control, RunInfo* info) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) {
      return absl::InvalidArgumentError("q, k, v: expected rank 4 [B, N, H, D]");
    }
    if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) {
      return absl::InvalidArgumentError("k, v: dtype must match q");
    }
    if (k.dims() != v.dims() || k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1) ||
        k.dim(3) != q.dim(3)) {
      return absl::InvalidArgumentError(absl::StrCat("k, v: shapes ", k.DebugString(), " / ",
                                                     v.DebugString(), " do not match q ",
                                                     q.DebugString()));
    }
    const AttentionShape shape{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    const DType dtype = q.dtype();
    ATTN_RETURN_IF_ERROR(CheckControl(control));

    ATTN_ASSIGN_OR_RETURN(auto plan,
                          CudaAttentionPlan::Create(spec, shape, dtype, alloc_, stream_));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dq, DeviceBuffer::Create(alloc_, q.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dk, DeviceBuffer::Create(alloc_, k.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dv, DeviceBuffer::Create(alloc_, v.nbytes()));
    ATTN_ASSIGN_OR_RETURN(AttentionOutputs out_host, MakeOutputs(shape, dtype));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dout, DeviceBuffer::Create(alloc_, out_host.o.nbytes()));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer dlse, DeviceBuffer::Create(alloc_, out_host.lse.nbytes()));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dq.get(), q.data(), q.nbytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dk.get(), k.data(), k.nbytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dv.get(), v.data(), v.nbytes(), cudaMemcpyHostToDevice, stream_));
    ATTN_RETURN_IF_ERROR(CheckControl(control));
    ATTN_RETURN_IF_ERROR(
        plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream_,
                  control.cancel));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_host.o.data(), dout.get(), out_host.o.nbytes(),
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_host.lse.data(), dlse.get(), out_host.lse.nbytes(),
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (info != nullptr) {
      info->flops = plan->flops();
      info->sparsity = plan->sparsity();
    }
    return out_host;
  }

  static absl::StatusOr<AttentionOutputs> MakeOutputs(const AttentionShape& s, DType dtype) {
    AttentionOutputs out;
    ATTN_ASSIGN_OR_RETURN(out.o,
                          HostTensor::Create(dtype, {s.batch, s.tokens, s.q_heads, s.head_dim}));
    ATTN_ASSIGN_OR_RETURN(out.lse,
                          HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens}));
    return out;
  }

  const int ordinal_;
  std::string model_;
  std::string uuid_;
  int64_t total_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  mutable CachingAllocator alloc_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeCudaDevices(std::vector<int> ordinals) {
  const int count = CudaDeviceCount();
  if (count == 0) return absl::UnavailableError("no CUDA device (or no driver) is available");
  if (ordinals.empty()) {
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  }
  std::vector<std::unique_ptr<Device>> devices;
  for (int ordinal : ordinals) {
    if (ordinal < 0 || ordinal >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices: CUDA ordinal ", ordinal, " out of range [0, ", count, ")"));
    }
    ATTN_ASSIGN_OR_RETURN(auto dev, CudaDevice::Create(ordinal));
    devices.push_back(std::move(dev));
  }
  return devices;
}

}  // namespace attnserve
