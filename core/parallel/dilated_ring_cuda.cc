#include "core/parallel/dilated_ring_cuda.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// bf16 copy of an f32 tensor, page-locked (the local parts and rings copy from it).
absl::StatusOr<HostTensor> ToBf16Copy(const HostTensor& t) {
  ATTN_ASSIGN_OR_RETURN(HostTensor out, PinnedHostTensor(DType::kBF16, t.dims()));
  out.FromFloat32(t.data_as<float>());
  return out;
}

// Enqueues the upload of `t` into `dst` on `stream`: straight from `t` when it is page-locked,
// else from a page-locked copy made into `stage` (hold it until the stream is synchronized).
absl::Status Upload(const HostTensor& t, void* dst, cudaStream_t stream, HostCopyCounters* counters,
                    HostTensor& stage) {
  const void* src = t.data();
  if (!CopiesAsync(t)) {
    ATTN_ASSIGN_OR_RETURN(stage, PinnedHostTensor(t.dtype(), t.dims()));
    std::memcpy(stage.data(), t.data(), t.nbytes());
    src = stage.data();
  }
  return CopyToDevice(dst, src, t.nbytes(), stream, counters);
}

// A rank's own allocator and stream for its local parts. Used by one thread at a time (the
// composition runs a rank's parts one after another); destroyed on the calling thread.
struct RankResources {
  int device = 0;
  std::unique_ptr<CachingAllocator> alloc;
  cudaStream_t stream = nullptr;

  absl::Status Init() {
    if (alloc != nullptr) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    alloc = std::make_unique<CachingAllocator>(device);
    return absl::OkStatus();
  }
  ~RankResources() {
    if (alloc == nullptr) return;
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    alloc.reset();
  }
};

}  // namespace

absl::StatusOr<AttentionOutputs> RunAttentionOnCudaDevice(
    const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
    CachingAllocator& alloc, cudaStream_t stream, int32_t block_size,
    const std::atomic<bool>* cancel, HostCopyCounters* counters) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered
  CUDA_RETURN_IF_ERROR(cudaSetDevice(alloc.device()));
  const DType dtype = q.dtype();
  AttentionOutputs out;
  // Page-locked outputs: the copies back are asynchronous on `stream`.
  ATTN_ASSIGN_OR_RETURN(out.o, PinnedHostTensor(dtype, q.dims()));
  ATTN_ASSIGN_OR_RETURN(out.lse,
                        PinnedHostTensor(DType::kF32, {shape.batch, shape.q_heads, shape.tokens}));
  CudaAttentionPlan::Options plan_options;
  plan_options.compile.block_size = block_size;
  // Buffers and staging blocks outlive the stream synchronization below (the allocator and the
  // pool may hand a block out again as soon as it is freed).
  std::unique_ptr<CudaAttentionPlan> plan;
  DeviceBuffer dq, dk, dv, dout, dlse;
  HostTensor q_stage, k_stage, v_stage;
  absl::Status st = [&]() -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        plan, CudaAttentionPlan::Create(spec, shape, dtype, alloc, stream, nullptr, plan_options));
    ATTN_ASSIGN_OR_RETURN(dq, DeviceBuffer::Create(alloc, q.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dk, DeviceBuffer::Create(alloc, k.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dv, DeviceBuffer::Create(alloc, v.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dout, DeviceBuffer::Create(alloc, out.o.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dlse, DeviceBuffer::Create(alloc, out.lse.nbytes()));
    ATTN_RETURN_IF_ERROR(Upload(q, dq.get(), stream, counters, q_stage));
    ATTN_RETURN_IF_ERROR(Upload(k, dk.get(), stream, counters, k_stage));
    ATTN_RETURN_IF_ERROR(Upload(v, dv.get(), stream, counters, v_stage));
    ATTN_RETURN_IF_ERROR(
        plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream, cancel));
    ATTN_RETURN_IF_ERROR(CopyToHost(out.o.data(), dout.get(), out.o.nbytes(), stream, counters));
    ATTN_RETURN_IF_ERROR(
        CopyToHost(out.lse.data(), dlse.get(), out.lse.nbytes(), stream, counters));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    cudaStreamSynchronize(stream);
    return st;
  }
  return out;
}

absl::StatusOr<AttentionOutputs> DilatedRingAttentionCuda(
    const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
    std::vector<int> devices, const RingCudaOptions& options, DilatedRingStats* stats) {
  if (devices.empty()) return absl::InvalidArgumentError("dilated ring (CUDA): no devices");
  const int P = static_cast<int>(devices.size());
  const int32_t block = options.plan.block_size;
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  // Plan first: UNIMPLEMENTED / INVALID_ARGUMENT before any conversion or GPU work.
  ATTN_RETURN_IF_ERROR(PlanDilatedRing(spec, shape, P, block).status());

  // f32 computes in bf16, as RingAttentionCuda: convert once, so the gathered jobs, the uploads
  // and the rings all carry bf16.
  const bool f32 = q.dtype() == DType::kF32;
  HostTensor q16, k16, v16;
  if (f32) {
    ATTN_ASSIGN_OR_RETURN(q16, ToBf16Copy(q));
    ATTN_ASSIGN_OR_RETURN(k16, ToBf16Copy(k));
    ATTN_ASSIGN_OR_RETURN(v16, ToBf16Copy(v));
  }
  const HostTensor& qc = f32 ? q16 : q;
  const HostTensor& kc = f32 ? k16 : k;
  const HostTensor& vc = f32 ? v16 : v;

  std::vector<RankResources> ranks(P);
  for (int p = 0; p < P; ++p) ranks[p].device = devices[p];
  int64_t nccl_bytes = 0;

  DilatedRingFn ring = [&](const AttentionSpec& job_spec, const HostTensor& jq,
                           const HostTensor& jk,
                           const HostTensor& jv) -> absl::StatusOr<AttentionOutputs> {
    // The ring's ranks allocate through private allocators: give back what the local parts
    // cached on these devices first.
    for (RankResources& r : ranks) {
      if (r.alloc != nullptr) {
        CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
        r.alloc->EmptyCache();
      }
    }
    std::vector<RingCudaRankStats> rank_stats;
    ATTN_ASSIGN_OR_RETURN(AttentionOutputs out,
                          RingAttentionCuda(job_spec, jq, jk, jv, devices, options, &rank_stats));
    for (const RingCudaRankStats& s : rank_stats) nccl_bytes += s.bytes_sent;
    return out;
  };
  DilatedLocalFn local = [&](int rank, const AttentionSpec& part_spec, const HostTensor& jq,
                             const HostTensor& jk,
                             const HostTensor& jv) -> absl::StatusOr<AttentionOutputs> {
    if (rank < 0 || rank >= P) {
      return absl::InternalError(absl::StrCat("dilated ring (CUDA): rank ", rank, " of ", P));
    }
    RankResources& r = ranks[rank];
    ATTN_RETURN_IF_ERROR(r.Init());
    return RunAttentionOnCudaDevice(part_spec, jq, jk, jv, *r.alloc, r.stream, block,
                                    options.cancel, options.copy_counters);
  };

  DilatedRingStats st;
  ATTN_ASSIGN_OR_RETURN(AttentionOutputs out,
                        DilatedRingAttention(spec, qc, kc, vc, P, block, ring, local, &st));
  st.ring_bytes_moved = nccl_bytes;
  if (stats != nullptr) *stats = st;
  if (f32) {
    ATTN_ASSIGN_OR_RETURN(HostTensor o32, PinnedHostTensor(DType::kF32, out.o.dims()));
    out.o.ToFloat32(o32.data_as<float>());
    out.o = std::move(o32);
  }
  return out;
}

}  // namespace attnserve
