// The engine's shared types: what every backend returns (AttentionOutputs), what a run reports
// (RunInfo) and may be stopped by (RunControl), a device's memory (DeviceStats), and how a request
// is spread over devices (Placement). Header-only and backend-free: the CPU and CUDA backends, the
// multi-device strategies (core/parallel) and the server all speak these types; none of them
// includes another's headers to get them.
#ifndef ATTNSERVE_CORE_ENGINE_TYPES_H_
#define ATTNSERVE_CORE_ENGINE_TYPES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// O and LSE of one attention run.
struct AttentionOutputs {
  HostTensor o;    // [B, N, Hq, D] in the input dtype
  HostTensor lse;  // [B, Hq, N] f32; -inf where a row has no admissible key (O = 0 there)
};

// A tensor in one GPU's memory that the engine does not own (a caller's CUDA IPC region): a run
// on that GPU reads or writes it in place, with no host copy. Row-major like HostTensor; `owner`
// keeps the memory mapped while the view lives (a region lease).
struct DeviceTensorView {
  std::byte* data = nullptr;
  int cuda_ordinal = -1;
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;
  std::shared_ptr<const void> owner;

  bool empty() const { return data == nullptr; }
  int64_t nbytes() const {
    int64_t n = static_cast<int64_t>(DTypeSize(dtype));
    for (int64_t d : dims) n *= d;
    return n;
  }
};

// The tensors of one request that live in one GPU's memory. Each input is either here or in the
// request's host tensor (never both); O and LSE are written here when set. Every set view is on
// the same GPU, and a request with any of them runs on that GPU alone (the placement policies pin
// it there).
struct DeviceIo {
  DeviceTensorView q, k, v, o, lse;

  // The GPU of the views; -1 when there are none.
  int cuda_ordinal() const {
    for (const DeviceTensorView* t : {&q, &k, &v, &o, &lse}) {
      if (!t->empty()) return t->cuda_ordinal;
    }
    return -1;
  }
  bool any() const { return cuda_ordinal() >= 0; }
};

enum class BackendKind { kCpu, kCuda };
constexpr std::string_view BackendName(BackendKind kind) {
  return kind == BackendKind::kCuda ? "cuda" : "cpu";
}

// Memory and identity of a device, as the metrics and Describe report them.
struct DeviceStats {
  int64_t memory_used_bytes = 0;      // bytes in use by attnserve's buffers (CUDA: allocator count)
  int64_t memory_reserved_bytes = 0;  // held by the caching allocator (CPU: same as used)
  int64_t memory_peak_bytes = 0;      // peak of used since start
  int64_t memory_total_bytes = 0;     // device capacity (CPU: MemTotal share)
  int64_t memory_free_bytes = 0;      // cudaMemGetInfo free (CPU: MemAvailable)
  // Host <-> device copies since start (CUDA; zero on CPU devices).
  int64_t copy_h2d_bytes = 0;
  int64_t copy_d2h_bytes = 0;
  int64_t pageable_copy_bytes = 0;  // of the above, from/to pageable host memory
};

// What a run may be interrupted by.
struct RunControl {
  const std::atomic<bool>* cancel = nullptr;  // set when the caller cancels or the deadline passes
  absl::Time deadline = absl::InfiniteFuture();
};

// Figures of one run, for the response header and the metrics.
struct RunInfo {
  double compute_seconds = 0;  // wall time on the device including copies
  double copy_seconds = 0;     // host <-> device copies (CUDA events; 0 on CPU devices)
  double kernel_seconds = 0;   // the attention kernels alone (CUDA events; CPU: the compute)
  int64_t copy_bytes = 0;      // bytes copied host <-> device
  double flops = 0;            // 4 * B * Hq * D * admitted pairs
  double sparsity = 0;         // skipped (query block, key block) pairs
  std::string engine;          // the kernels that ran: "cudnn" or "flash_fwd" on a CUDA device;
                               // empty where the backend does not record it
  std::string kernel;          // the flash kernel that ran last ("sm80", "sm90", ...), if any
};

// How one request is spread over devices.
// kContextParallel: the keys are split by sequence over the devices that hold them (a sharded
// context); every device attends Q to its rows and the partials merge by their LSE.
enum class Placement { kSingle, kDataParallel, kRing, kContextParallel };
// What the caller asked for (the header's placement hint).
enum class PlacementHint { kAuto, kSingle, kDataParallel, kRing };
constexpr std::string_view PlacementName(Placement p) {
  switch (p) {
    case Placement::kDataParallel:
      return "data_parallel";
    case Placement::kRing:
      return "ring";
    case Placement::kContextParallel:
      return "context_parallel";
    case Placement::kSingle:
      break;
  }
  return "single";
}

// One shard of a request's keys split by sequence over devices (an attend against a sharded
// context): key rows [start, start + rows) of the request, on the device with index `device` in
// the server's device pool, either as host tensors k, v [1, rows, Hkv, D] (a CPU device) or as
// views in that GPU's memory (k_dev, v_dev).
struct KeyShard {
  size_t device = 0;
  int64_t start = 0;
  int64_t rows = 0;
  HostTensor k, v;
  DeviceTensorView k_dev, v_dev;
};

// One complete attention request in the engine's terms: what to compute, on which inputs, and
// what may stop it. Built at the RPC edge (wire/ converts the header), validated there once, and
// read by the scheduler and the strategies of core/parallel; the inputs are released as soon as
// the run no longer needs them.
struct AttentionRequest {
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype = DType::kF32;
  PlacementHint placement_hint = PlacementHint::kAuto;
  HostTensor q, k, v;  // [B, N, Hq, D], [B, N, Hkv, D] x 2, in `dtype`
  // Where O (and LSE, when non-empty) should land, when the caller named memory for them (views
  // of its shared-memory region): a single-device run writes there directly (Device::RunInto)
  // and returns empty outputs. Empty o: the run returns new buffers.
  AttentionOutputs outputs_into;
  // Tensors read or written in place in a GPU's memory (CUDA IPC regions); the host tensor of an
  // input found here is empty. Set only by the RPC edge, for a GPU of this server.
  DeviceIo device_io;
  // Non-empty when the keys are split by sequence over devices (in row order, on distinct
  // devices): then k, v and device_io are empty, shape.kv_len() counts every shard's rows, and the
  // request runs context parallel on exactly these devices.
  std::vector<KeyShard> key_shards;
  absl::Time deadline = absl::InfiniteFuture();
  // Set by the RPC side (client cancel, deadline); polled by the run.
  std::atomic<bool> cancel{false};

  RunControl control() const { return RunControl{&cancel, deadline}; }
  // Drops the inputs (the worker calls it as soon as the run has ended).
  void ReleaseInputs() {
    q = HostTensor();
    k = HostTensor();
    v = HostTensor();
    outputs_into = AttentionOutputs();
    device_io = DeviceIo();
    key_shards.clear();
  }
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_ENGINE_TYPES_H_
