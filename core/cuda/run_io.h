// Where the tensors of one run on a GPU come from and go to: each input from host memory (copied
// in on the run's stream) or from a view of the GPU's own memory (read in place: a caller's CUDA
// IPC region); O and LSE to a device view (written in place), to a caller's host view (a
// registered shared-memory region) or to new page-locked buffers returned to the caller.
#ifndef ATTNSERVE_CORE_CUDA_RUN_IO_H_
#define ATTNSERVE_CORE_CUDA_RUN_IO_H_

#include <array>

#include "absl/status/statusor.h"
#include "core/engine/types.h"
#include "core/tensor/tensor.h"

namespace attnserve {

struct CudaRunIo {
  AttentionShape shape;
  DType dtype = DType::kF32;
  // q, k, v: exactly one of host_in[i] (copied in) and device_in[i] (read in place) is set.
  std::array<const HostTensor*, 3> host_in{};
  std::array<const std::byte*, 3> device_in{};
  // Written in place when set.
  std::byte* o_device = nullptr;
  float* lse_device = nullptr;
  // Copied back into these when non-empty (views of the caller's memory or page-locked buffers
  // of their own); what the run returns. LSE stays on the device when O is written in place and
  // the caller named no place for LSE (it was not asked for).
  AttentionOutputs host_out;

  // Bytes crossing the bus (inputs copied in plus outputs copied back).
  int64_t host_copy_bytes() const;
};

// Resolves a run on CUDA device `ordinal`. `host_q/k/v` are the request's host tensors (ignored,
// and normally empty, where `io` has a view); `io` and `into` may be null. INTERNAL when a view is
// on another GPU or does not have the shape and dtype of its tensor (the RPC edge built them from
// the validated header, so this is a bug), or when an input has neither a view nor host bytes.
absl::StatusOr<CudaRunIo> ResolveCudaRunIo(int ordinal, const AttentionShape& shape, DType dtype,
                                           const HostTensor& host_q, const HostTensor& host_k,
                                           const HostTensor& host_v, const DeviceIo* io,
                                           AttentionOutputs* into);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_RUN_IO_H_
