#include "core/cuda/host_copy.h"

#include "core/cuda/cuda_status.h"

namespace attnserve {

bool IsPageLocked(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

namespace {

void Count(HostCopyCounters* counters, std::atomic<int64_t> HostCopyCounters::*direction,
           const void* host, size_t bytes) {
  if (counters == nullptr || bytes == 0) return;
  (counters->*direction).fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  if (!IsPageLocked(host)) {
    counters->pageable_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }
}

}  // namespace

absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                          cudaStream_t stream, HostCopyCounters* counters) {
  if (bytes == 0) return absl::OkStatus();
  Count(counters, &HostCopyCounters::h2d_bytes, host_src, bytes);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, cudaStream_t stream,
                        HostCopyCounters* counters) {
  if (bytes == 0) return absl::OkStatus();
  Count(counters, &HostCopyCounters::d2h_bytes, host_dst, bytes);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

double EventSeconds(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (from == nullptr || to == nullptr || cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<double>(ms) * 1e-3;
}

RunEvents::~RunEvents() {
  for (cudaEvent_t& e : ev_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

absl::Status RunEvents::Init() {
  for (cudaEvent_t& e : ev_) {
    if (e == nullptr) CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  }
  return absl::OkStatus();
}

void RunEvents::Read(double* copy_seconds, double* kernel_seconds) const {
  *copy_seconds = EventSeconds(ev_[0], ev_[1]) + EventSeconds(ev_[2], ev_[3]);
  *kernel_seconds = EventSeconds(ev_[1], ev_[2]);
}

}  // namespace attnserve
