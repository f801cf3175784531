// Device: one compute device (a GPU, or a share of the CPU) as the server's workers see it, and
// the one way every multi-device strategy (core/parallel) runs its part on a device: RunTask (or
// RunLaneTask). The server runs lanes() worker threads per Device (its lane workers): up to
// lanes() of them may call Run or RunLaneTask at once, while RunTask runs only with the whole
// device reserved (no Run in flight). This
// header names no backend: core/cpu and core/cuda implement it, the server and core/parallel use
// it.
#ifndef ATTNSERVE_CORE_ENGINE_DEVICE_H_
#define ATTNSERVE_CORE_ENGINE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/engine/types.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

struct CUstream_st;  // the CUDA runtime's stream (cudaStream_t is CUstream_st*)

namespace attnserve {

class HostMemory;        // core/tensor/host_memory.h
class ThreadPool;        // core/util/thread_pool.h
class CachingAllocator;  // core/cuda/caching_allocator.h
struct HostCopyCounters;  // core/cuda/host_copy.h

// What a task run on a device's worker thread may use: that device's own resources, so what the
// task allocates and how long it runs show in that device's memory and busy metrics.
struct DeviceContext {
  BackendKind kind = BackendKind::kCpu;
  std::string name;                       // "cpu:0", "cuda:1"
  ThreadPool* pool = nullptr;             // CPU: the device's threads
  int cuda_ordinal = -1;                  // CUDA: the GPU the calling thread is bound to
  CachingAllocator* allocator = nullptr;  // CUDA: the device's caching allocator
  CUstream_st* stream = nullptr;          // CUDA: the stream of the lane(s) the task holds
  HostMemory* host_memory = nullptr;      // the device's host memory (page-locked on CUDA)
  HostCopyCounters* copies = nullptr;     // CUDA: where the device counts its host copies
};
using DeviceTask = std::function<absl::Status(DeviceContext& ctx)>;

// Memory a device keeps between requests (a context's K and V): taken from the device's own
// memory and counted in its Stats() for as long as the object lives. Writes to disjoint ranges may
// run on several threads at once; a request reads it through a view (HostTensor::Wrap of
// host_data() on a CPU device, a DeviceTensorView of device_data() on a GPU).
class ResidentMemory {
 public:
  explicit ResidentMemory(int64_t bytes) : bytes_(bytes) {}
  virtual ~ResidentMemory() = default;
  ResidentMemory(const ResidentMemory&) = delete;
  ResidentMemory& operator=(const ResidentMemory&) = delete;

  int64_t bytes() const { return bytes_; }
  // Copies `n` bytes of host memory `src` to [offset, offset + n) and returns once they are
  // there. The range must be inside.
  virtual absl::Status Write(int64_t offset, const void* src, int64_t n) = 0;
  // Copies the first `n` bytes of `from` (memory of the same device) to the start of this one.
  virtual absl::Status CopyFrom(ResidentMemory& from, int64_t n) = 0;
  // The bytes: in host memory on a CPU device, in the GPU's memory on a CUDA device (the other
  // is null).
  virtual std::byte* host_data() { return nullptr; }
  virtual std::byte* device_data() { return nullptr; }

 private:
  int64_t bytes_;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;   // "cpu:0", "cuda:0"
  virtual std::string uuid() const = 0;   // GPU UUID, or "cpu-<index>"
  virtual std::string model() const = 0;  // "NVIDIA H200", the CPU's model name
  // Head dims this device's backend runs (Describe lists them; validation asks HeadDimSupported).
  virtual bool HeadDimSupported(int64_t head_dim) const = 0;
  // Thread-safe: read by the metrics thread.
  virtual DeviceStats Stats() const = 0;
  // Where host buffers that this device copies from or to should live (request inputs, outputs,
  // staging): page-locked memory on a CUDA device, plain memory on a CPU device. Thread-safe;
  // outlives every tensor allocated from it.
  virtual HostMemory& host_memory() = 0;
  // Bytes this device needs to run the request (inputs, outputs, workspaces), for admission.
  virtual int64_t EstimateBytes(const AttentionSpec& spec, const AttentionShape& shape,
                                DType dtype) const = 0;
  // How many Run calls this device may hold at once (from that many threads; a CUDA device gives
  // each its own stream, so one run's copies overlap another's kernels). The scheduler never calls
  // Run from more threads at once, nor RunTask while a Run is in flight. Constant; thread-safe.
  virtual int lanes() const { return 1; }
  // Runs attention. Called only from this device's lane workers, at most lanes() at once. Outputs
  // live in host memory.
  virtual absl::StatusOr<AttentionOutputs> Run(const AttentionSpec& spec, const HostTensor& q,
                                               const HostTensor& k, const HostTensor& v,
                                               const RunControl& control, RunInfo* info) = 0;
  // Runs like Run, but writes O into `into.o` and LSE into `into.lse` (when non-empty): tensors
  // of the outputs' shapes and dtypes, typically views of a caller's shared-memory region, so no
  // host copy follows the run. The default runs Run and copies; CUDA devices copy from the GPU
  // straight into `into`.
  virtual absl::Status RunInto(const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
                               const HostTensor& v, const RunControl& control, RunInfo* info,
                               AttentionOutputs& into) {
    absl::StatusOr<AttentionOutputs> out = Run(spec, q, k, v, control, info);
    if (!out.ok()) return out.status();
    return CopyOutputsInto(*out, into);
  }
  // The CUDA ordinal of this device's GPU; -1 for devices that are not GPUs. A request with
  // DeviceIo views runs only on the device whose ordinal is theirs.
  virtual int cuda_ordinal() const { return -1; }
  // Runs a request some of whose tensors are in this device's memory (`io`, every view on
  // cuda_ordinal()): an input whose view is set is read in place and its host tensor (empty) is
  // ignored; O / LSE go to io.o / io.lse when set (no copy back), else into `into`'s tensors when
  // `into` is non-null and they are non-empty, else into returned host buffers. `shape` and
  // `dtype` are the request's (validated at the edge). UNIMPLEMENTED on devices without device
  // memory of their own.
  virtual absl::StatusOr<AttentionOutputs> RunWithDeviceIo(
      const AttentionSpec& spec, const AttentionShape& shape, DType dtype, const HostTensor& q,
      const HostTensor& k, const HostTensor& v, const DeviceIo& io, const RunControl& control,
      RunInfo* info, AttentionOutputs* into) {
    (void)spec, (void)shape, (void)dtype, (void)q, (void)k, (void)v, (void)io, (void)control,
        (void)info, (void)into;
    return absl::UnimplementedError(
        absl::StrCat(name(), ": tensors in GPU memory need a CUDA device"));
  }
  // `bytes` of this device's memory kept until the returned object is destroyed (thread-safe).
  // RESOURCE_EXHAUSTED when the device cannot give them; UNIMPLEMENTED on devices that keep none.
  virtual absl::StatusOr<std::unique_ptr<ResidentMemory>> AllocateResident(int64_t bytes) {
    (void)bytes;
    return absl::UnimplementedError(absl::StrCat(name(), ": keeps no memory between requests"));
  }
  // Checks that `into` has `from`'s shapes and copies (LSE only when into.lse is non-empty).
  static absl::Status CopyOutputsInto(const AttentionOutputs& from, AttentionOutputs& into) {
    if (into.o.dims() != from.o.dims() || into.o.dtype() != from.o.dtype() ||
        (!into.lse.empty() && into.lse.nbytes() != from.lse.nbytes())) {
      return absl::InternalError("RunInto: the destination does not have the outputs' shape");
    }
    std::memcpy(into.o.data(), from.o.data(), from.o.nbytes());
    if (!into.lse.empty()) std::memcpy(into.lse.data(), from.lse.data(), from.lse.nbytes());
    return absl::OkStatus();
  }
  // Runs `task` on the calling thread (this device's lane-0 worker, every lane reserved) with this
  // device's resources: a ring rank, a data-parallel share. `host_bytes` is charged to the
  // device's host memory while the task runs (CPU devices; device memory the task allocates
  // through ctx.allocator is counted by the allocator itself). CUDA devices synchronize their
  // stream and clear the CUDA error state afterwards, whatever the task returns.
  virtual absl::Status RunTask(int64_t host_bytes, const DeviceTask& task) = 0;
  // Runs `task` like RunTask, but holding one lane only, so the device's other lanes keep running
  // requests (and other lane tasks) meanwhile: for tasks that use no NCCL communicator (those
  // belong to lane 0's worker) and free device memory only once their stream is idle. Called from
  // a lane worker the scheduler reserved, like Run; ctx.stream is that lane's stream. The default
  // (devices of one lane) is RunTask.
  virtual absl::Status RunLaneTask(int64_t host_bytes, const DeviceTask& task) {
    return RunTask(host_bytes, task);
  }
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_ENGINE_DEVICE_H_
