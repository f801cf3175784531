// Dilated (LongNet) attention over several GPUs: DilatedRingAttention (dilated_ring.h) bound to
// the CUDA primitives. Jobs whose gathered sequence has at least P segments run as per-rank parts
// on their GPU alone (CudaAttentionPlan, no communication); the others run as a CUDA ring
// (RingAttentionCuda) over their gathered positions and KV heads only. Built only with CUDA and
// NCCL (ATTNSERVE_HAVE_NCCL).
#ifndef ATTNSERVE_CORE_PARALLEL_DILATED_RING_CUDA_H_
#define ATTNSERVE_CORE_PARALLEL_DILATED_RING_CUDA_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/types.h"
#include "core/cuda/caching_allocator.h"
#include "core/parallel/dilated_ring.h"
#include "core/parallel/ring_cuda.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

// One attention on one GPU over host tensors: uploads q/k/v, runs the CudaAttentionPlan of `spec`
// (dense/window/dilated layouts at `block_size`) on `stream` with buffers from `alloc`, downloads
// O (q's dtype) and LSE [B, Hq, N] f32, and synchronizes `stream`. Sets the calling thread's
// device to alloc.device(). `stream` must belong to that device. f32 inputs compute in bf16
// (CudaAttentionPlan converts on the device). What the dilated composition's local parts run;
// a service worker can call it inside Device::RunTask (core/engine/device.h) with its
// DeviceContext's allocator and stream. Every copy is asynchronous on `stream` and counted in
// `counters` (may be null): O and LSE are page-locked (ProcessPinnedHostPool), inputs are copied
// straight from q/k/v when page-locked, else through page-locked staging copies.
absl::StatusOr<AttentionOutputs> RunAttentionOnCudaDevice(
    const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
    CachingAllocator& alloc, cudaStream_t stream, int32_t block_size,
    const std::atomic<bool>* cancel = nullptr, HostCopyCounters* counters = nullptr);

// Any dilated spec over `devices` (rank i on devices[i]): q [B, N, Hq, D], k/v [B, N, Hkv, D] on
// the host (f32, f16 or bf16; f32 computes in bf16 as RingAttentionCuda does: bf16 copies are
// made here and O is converted back). Ring jobs call RingAttentionCuda(job spec, gathered q/k/v,
// devices, options) (block-diagonal CSR at options.plan.block_size when a job has several
// segments); local parts run RunAttentionOnCudaDevice on devices[rank] with a per-rank caching
// allocator and stream owned by this call (their caches are emptied before each ring, whose
// ranks allocate privately). stats->ring_bytes_moved is the NCCL bytes the rings' ranks sent.
// UNIMPLEMENTED (before any GPU work) as DilatedRingAttention: a ring job whose gathered segment
// boundaries miss the block size.
absl::StatusOr<AttentionOutputs> DilatedRingAttentionCuda(const AttentionSpec& spec,
                                                          const HostTensor& q, const HostTensor& k,
                                                          const HostTensor& v,
                                                          std::vector<int> devices,
                                                          const RingCudaOptions& options = {},
                                                          DilatedRingStats* stats = nullptr);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_DILATED_RING_CUDA_H_
