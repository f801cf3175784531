// Device: one compute device (a GPU, or a share of the CPU) as the server's workers see it. The
// server creates one Device per worker thread; only that thread calls Run. No gRPC in here.
#ifndef ATTNSERVE_CORE_ENGINE_DEVICE_H_
#define ATTNSERVE_CORE_ENGINE_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/cpu/cpu_backend.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

class ThreadPool;  // core/util/thread_pool.h

enum class BackendKind { kCpu, kCuda };
std::string_view BackendName(BackendKind kind);  // "cpu", "cuda"

// Memory and identity of a device, as the metrics and Describe report them.
struct DeviceStats {
  int64_t memory_used_bytes = 0;      // bytes in use by attnserve's buffers (CUDA: allocator count)
  int64_t memory_reserved_bytes = 0;  // held by the caching allocator (CPU: same as used)
  int64_t memory_peak_bytes = 0;      // peak of used since start
  int64_t memory_total_bytes = 0;     // device capacity (CPU: MemTotal share)
  int64_t memory_free_bytes = 0;      // cudaMemGetInfo free (CPU: MemAvailable)
};

// What a run may be interrupted by.
struct RunControl {
  const std::atomic<bool>* cancel = nullptr;  // set when the caller cancels or the deadline passes
  absl::Time deadline = absl::InfiniteFuture();
};

// Figures of one run, for the response header and the metrics.
struct RunInfo {
  double compute_seconds = 0;  // wall time on the device including copies
  double flops = 0;            // 4 * B * Hq * D * admitted pairs
  double sparsity = 0;         // skipped (query block, key block) pairs
  std::string engine;          // the kernels that ran: "cudnn" or "flash_fwd" on a CudaDevice;
                               // empty where the backend does not record it
};

class Device {
 public:
  virtual ~Device() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;   // "cpu:0", "cuda:0"
  virtual std::string uuid() const = 0;   // GPU UUID, or "cpu-<index>"
  virtual std::string model() const = 0;  // "NVIDIA H200", the CPU's model name
  // Thread-safe: read by the metrics thread.
  virtual DeviceStats Stats() const = 0;
  // Bytes this device needs to run the request (inputs, outputs, workspaces), for admission.
  virtual int64_t EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                                DType dtype) const = 0;
  // Runs attention. Called only from this device's worker thread. Outputs live in host memory.
  virtual absl::StatusOr<AttentionOutputs> Run(const AttentionSpec& spec, const HostTensor& q,
                                               const HostTensor& k, const HostTensor& v,
                                               const RunControl& control, RunInfo* info) = 0;
  // Runs `task` with this device's host compute resources: the CPU device passes its thread pool
  // and charges `bytes` to its memory tracker while the task runs (the server runs one rank of a
  // CPU ring this way). Called only from this device's worker thread. Backends without host
  // compute resources (CUDA) return UNIMPLEMENTED, which is the default; a GPU ring rank runs
  // through RunCudaDeviceTask (core/cuda/cuda_device.h) instead.
  virtual absl::Status RunHostTask(int64_t bytes,
                                   const std::function<absl::Status(ThreadPool* pool)>& task) {
    (void)bytes;
    (void)task;
    return absl::UnimplementedError(std::string(BackendName(kind())) +
                                    " device: no host compute task support");
  }
};

// A CPU device: `threads` threads of its own; buffers charged to its own MemoryTracker.
std::unique_ptr<Device> MakeCpuDevice(int index, int threads);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_ENGINE_DEVICE_H_
