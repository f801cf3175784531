// Host <-> device copies of the CUDA backend, and what they cost. Every copy between a request's
// host buffers and a GPU goes through CopyToDevice / CopyToHost: they queue the copy on a stream
// and count its bytes, and a copy from or to pageable host memory (which runs at a fraction of
// the bus's rate and synchronizes the host) is counted separately, so a test or the metrics can
// prove none is left on the request paths.
#ifndef ATTNSERVE_CORE_CUDA_HOST_COPY_H_
#define ATTNSERVE_CORE_CUDA_HOST_COPY_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace attnserve {

// Counters of one device's host copies. Thread-safe.
struct HostCopyCounters {
  std::atomic<int64_t> h2d_bytes{0};
  std::atomic<int64_t> d2h_bytes{0};
  std::atomic<int64_t> pageable_bytes{0};  // of the above, from/to pageable host memory
};

// Whether `p` is page-locked host memory (cudaHostAlloc'ed or cudaHostRegister'ed) as the CUDA
// runtime sees it.
bool IsPageLocked(const void* p);

// cudaMemcpyAsync on `stream`, counted in `counters` (may be null).
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                          cudaStream_t stream, HostCopyCounters* counters);
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, cudaStream_t stream,
                        HostCopyCounters* counters);

// Seconds between two recorded events (0 when either failed).
double EventSeconds(cudaEvent_t from, cudaEvent_t to);

// Four timing events of a run: before the inputs' copies, after them, after the kernels, after
// the outputs' copies. Created once per device (cudaEventDefault: timing on).
class RunEvents {
 public:
  RunEvents() = default;
  ~RunEvents();
  RunEvents(const RunEvents&) = delete;
  RunEvents& operator=(const RunEvents&) = delete;
  absl::Status Init();
  cudaEvent_t inputs_start() const { return ev_[0]; }
  cudaEvent_t inputs_done() const { return ev_[1]; }
  cudaEvent_t kernels_done() const { return ev_[2]; }
  cudaEvent_t outputs_done() const { return ev_[3]; }
  // After the stream reached outputs_done: copy time (both directions) and kernel time.
  void Read(double* copy_seconds, double* kernel_seconds) const;

 private:
  cudaEvent_t ev_[4] = {nullptr, nullptr, nullptr, nullptr};
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_HOST_COPY_H_
