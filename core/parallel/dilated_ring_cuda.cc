#include "core/parallel/dilated_ring_cuda.h"

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

absl::StatusOr<HostTensor> ToBf16Copy(const HostTensor& t) {
  ATTN_ASSIGN_OR_RETURN(HostTensor out, HostTensor::Create(DType::kBF16, t.dims()));
  out.FromFloat32(t.data_as<float>());
  return out;
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

absl::StatusOr<AttentionOutputs> RunAttentionOnCudaDevice(const AttentionSpec& spec,
                                                          const HostTensor& q, const HostTensor& k,
                                                          const HostTensor& v,
                                                          CachingAllocator& alloc,
                                                          cudaStream_t stream, int32_t block_size,
                                                          const std::atomic<bool>* cancel) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered
  CUDA_RETURN_IF_ERROR(cudaSetDevice(alloc.device()));
  const DType dtype = q.dtype();
  AttentionOutputs out;
  ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(dtype, q.dims()));
  ATTN_ASSIGN_OR_RETURN(
      out.lse, HostTensor::Create(DType::kF32, {shape.batch, shape.q_heads, shape.tokens}));
  CudaAttentionPlan::Options plan_options;
  plan_options.compile.block_size = block_size;
  // Buffers outlive the stream synchronization below (the allocator may hand a block out again
  // as soon as it is freed).
  std::unique_ptr<CudaAttentionPlan> plan;
  DeviceBuffer dq, dk, dv, dout, dlse;
  absl::Status st = [&]() -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        plan, CudaAttentionPlan::Create(spec, shape, dtype, alloc, stream, nullptr, plan_options));
    ATTN_ASSIGN_OR_RETURN(dq, DeviceBuffer::Create(alloc, q.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dk, DeviceBuffer::Create(alloc, k.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dv, DeviceBuffer::Create(alloc, v.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dout, DeviceBuffer::Create(alloc, out.o.nbytes()));
    ATTN_ASSIGN_OR_RETURN(dlse, DeviceBuffer::Create(alloc, out.lse.nbytes()));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dq.get(), q.data(), q.nbytes(), cudaMemcpyHostToDevice, stream));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dk.get(), k.data(), k.nbytes(), cudaMemcpyHostToDevice, stream));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dv.get(), v.data(), v.nbytes(), cudaMemcpyHostToDevice, stream));
    ATTN_RETURN_IF_ERROR(
        plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream, cancel));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out.o.data(), dout.get(), out.o.nbytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.lse.data(), dlse.get(), out.lse.nbytes(),
                                         cudaMemcpyDeviceToHost, stream));
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
                                    options.cancel);
  };

  DilatedRingStats st;
  ATTN_ASSIGN_OR_RETURN(AttentionOutputs out,
                        DilatedRingAttention(spec, qc, kc, vc, P, block, ring, local, &st));
  st.ring_bytes_moved = nccl_bytes;
  if (stats != nullptr) *stats = st;
  if (f32) {
    ATTN_ASSIGN_OR_RETURN(HostTensor o32, HostTensor::Create(DType::kF32, out.o.dims()));
    out.o.ToFloat32(o32.data_as<float>());
    out.o = std::move(o32);
  }
  return out;
}

}  // namespace attnserve
