// RingCudaRun and RingAttentionCuda: the GPU ring over host tensors (ring_cuda.h). Uploads each
// rank's shard, runs its RingCudaRank, downloads its rows; dilated specs run shard-local.
#include "core/parallel/ring_cuda.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {

namespace {

// bf16 copy of an f32 tensor (the kernels compute in bf16, as CudaAttentionPlan does).
absl::StatusOr<HostTensor> ToBf16(const HostTensor& t) {
  ATTN_ASSIGN_OR_RETURN(HostTensor out, HostTensor::Create(DType::kBF16, t.dims()));
  std::vector<float> tmp(t.numel());
  t.ToFloat32(tmp.data());
  out.FromFloat32(tmp.data());
  return out;
}

// Copies rows [range) of every batch between a full [B, N, H, D] host tensor and a shard
// [B, nl, H, D] (ranges concatenated). to_shard: full -> shard, else shard -> full.
void CopyShardRows(std::byte* full, std::byte* shard, const std::vector<TokenRange>& ranges,
                   int64_t b, int64_t n, int64_t nl, int64_t row_bytes, bool to_shard) {
  for (int64_t bi = 0; bi < b; ++bi) {
    int64_t local = 0;
    for (const TokenRange& r : ranges) {
      std::byte* f = full + (bi * n + r.begin) * row_bytes;
      std::byte* s = shard + (bi * nl + local) * row_bytes;
      if (r.size() > 0) {
        if (to_shard) {
          std::memcpy(s, f, r.size() * row_bytes);
        } else {
          std::memcpy(f, s, r.size() * row_bytes);
        }
      }
      local += r.size();
    }
  }
}

}  // namespace

// ---- RingCudaRun ------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RingCudaRun>> RingCudaRun::Create(
    const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
    std::vector<int> devices, const RingCudaOptions& options) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered
  if (devices.empty()) return absl::InvalidArgumentError("ring (CUDA): no devices");
  std::unique_ptr<RingCudaRun> run(new RingCudaRun());
  run->spec_ = spec;
  run->shape_ = shape;
  run->devices_ = std::move(devices);
  run->options_ = options;
  run->in_dtype_ = q.dtype();
  if (q.dtype() == DType::kF32) {
    ATTN_ASSIGN_OR_RETURN(run->q16_, ToBf16(q));
    ATTN_ASSIGN_OR_RETURN(run->k16_, ToBf16(k));
    ATTN_ASSIGN_OR_RETURN(run->v16_, ToBf16(v));
    run->q_ = &run->q16_;
    run->k_ = &run->k16_;
    run->v_ = &run->v16_;
  } else {
    run->q_ = &q;
    run->k_ = &k;
    run->v_ = &v;
  }
  const DType dtype = run->q_->dtype();
  const int P = run->ranks();
  const int64_t b = shape.batch, n = shape.tokens, hq = shape.q_heads, d = shape.head_dim;
  run->scale_ = EffectiveScale(spec, d);
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    ATTN_ASSIGN_OR_RETURN(run->dilated_split_, SplitDilatedForRingCuda(spec, n, P));
  } else {
    RingCudaPlanOptions po = options.plan;
    if (RingCudnnPiecesWanted(options.cuda)) po.cudnn_pieces = true;
    ATTN_ASSIGN_OR_RETURN(RingCudaPlan plan, PlanRingCuda(spec, shape, dtype, P, po));
    run->plan_ = std::move(plan);
  }
  ATTN_ASSIGN_OR_RETURN(run->out_.o, HostTensor::Create(dtype, {b, n, hq, d}));
  ATTN_ASSIGN_OR_RETURN(run->out_.lse, HostTensor::Create(DType::kF32, {b, hq, n}));
  run->stats_.assign(P, RingCudaRankStats{});
  run->done_.assign(P, 0);
  return run;
}

int64_t RingCudaRun::EstimateRankBytes(int rank) const {
  if (rank < 0 || rank >= ranks()) return 0;
  const DType dtype = q_->dtype();
  if (plan_) return EstimateRingRankBytes(*plan_, rank, shape_, dtype);
  return EstimateDilatedRankBytes(dilated_split_[rank], shape_, dtype);
}

absl::Status RingCudaRun::RunRank(int rank, NcclCommunicator& comm, CachingAllocator* alloc,
                                  cudaStream_t stream) {
  absl::Status s = RunRankImpl(rank, &comm, alloc, stream);
  if (!s.ok()) comm.Abort(s);
  return s;
}

absl::Status RingCudaRun::RunRankImpl(int rank, NcclCommunicator* comm, CachingAllocator* alloc,
                                      cudaStream_t stream) {
  if (rank < 0 || rank >= ranks()) {
    return absl::InvalidArgumentError(absl::StrCat("ring (CUDA): rank ", rank, " of ", ranks()));
  }
  if (taken_) return absl::FailedPreconditionError("ring (CUDA): outputs already taken");
  if (!plan_) return RunDilatedRank(rank, alloc, stream);
  if (comm == nullptr) return absl::InvalidArgumentError("ring (CUDA): no communicator");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[rank]));
  const DType dtype = q_->dtype();
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<RingCudaRank> r,
                        RingCudaRank::Create(*plan_, shape_, dtype, scale_, rank, devices_[rank],
                                             *comm, alloc, stream, options_));
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads,
                hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t nl = r->shard_tokens();
  const std::vector<TokenRange>& ranges = r->ranges();
  std::vector<std::byte> stage(std::max<int64_t>(b * nl * hq * d * es, 1));
  std::vector<std::byte> kstage(std::max<int64_t>(b * nl * hkv * d * es, 1));
  std::vector<std::byte> vstage(kstage.size());
  CopyShardRows(const_cast<std::byte*>(q_->data()), stage.data(), ranges, b, n, nl, hq * d * es,
                /*to_shard=*/true);
  if (b * nl > 0) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(r->q(), stage.data(), b * nl * hq * d * es, cudaMemcpyHostToDevice));
  }
  CopyShardRows(const_cast<std::byte*>(k_->data()), kstage.data(), ranges, b, n, nl,
                hkv * d * es, /*to_shard=*/true);
  CopyShardRows(const_cast<std::byte*>(v_->data()), vstage.data(), ranges, b, n, nl,
                hkv * d * es, /*to_shard=*/true);
  ATTN_RETURN_IF_ERROR(r->SetKv(kstage.data(), vstage.data()));  // synchronizes the device
  ATTN_RETURN_IF_ERROR(r->Run());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
  if (b * nl > 0) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(stage.data(), r->o(), b * nl * hq * d * es, cudaMemcpyDeviceToHost));
  }
  CopyShardRows(out_.o.data(), stage.data(), ranges, b, n, nl, hq * d * es, /*to_shard=*/false);
  std::vector<float> lse(std::max<int64_t>(b * hq * nl, 1));
  if (b * nl > 0) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(lse.data(), r->lse(), b * hq * nl * 4, cudaMemcpyDeviceToHost));
  }
  // LSE [B, Hq, nl] -> [B, Hq, N]: each (batch, head) row is a [1, nl, 1, 4-byte] shard.
  CopyShardRows(out_.lse.data(), reinterpret_cast<std::byte*>(lse.data()), ranges, b * hq, n, nl,
                4, /*to_shard=*/false);
  stats_[rank] = r->stats();
  done_[rank] = 1;
  return absl::OkStatus();
}

absl::Status RingCudaRun::RunDilatedRank(int rank, CachingAllocator* borrowed_alloc,
                                         cudaStream_t borrowed_stream) {
  const int device = devices_[rank];
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<CachingAllocator> own_alloc;
  if (borrowed_alloc == nullptr) own_alloc = std::make_unique<CachingAllocator>(device);
  CachingAllocator& alloc = borrowed_alloc ? *borrowed_alloc : *own_alloc;
  cudaStream_t stream = borrowed_stream;
  if (stream == nullptr) CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  const DType dtype = q_->dtype();
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads,
                hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  absl::Status st = [&]() -> absl::Status {
    for (const TokenRange& r : dilated_split_[rank]) {
      if (r.size() == 0) continue;
      const AttentionShape sub{b, r.size(), hq, hkv, d};
      ATTN_ASSIGN_OR_RETURN(auto plan, CudaAttentionPlan::Create(spec_, sub, dtype, alloc, stream));
      const int64_t nq = b * r.size() * hq * d * es, nkv = b * r.size() * hkv * d * es;
      std::vector<std::byte> stage(std::max(nq, nkv));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer dq, DeviceBuffer::Create(alloc, nq));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer dk, DeviceBuffer::Create(alloc, nkv));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer dv, DeviceBuffer::Create(alloc, nkv));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer dout, DeviceBuffer::Create(alloc, nq));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer dlse, DeviceBuffer::Create(alloc, b * hq * r.size() * 4));
      const std::vector<TokenRange> one = {r};
      auto upload = [&](const HostTensor& t, int64_t heads, DeviceBuffer& dst) -> absl::Status {
        CopyShardRows(const_cast<std::byte*>(t.data()), stage.data(), one, b, n, r.size(),
                      heads * d * es, /*to_shard=*/true);
        CUDA_RETURN_IF_ERROR(cudaMemcpy(dst.get(), stage.data(), b * r.size() * heads * d * es,
                                        cudaMemcpyHostToDevice));
        return absl::OkStatus();
      };
      ATTN_RETURN_IF_ERROR(upload(*q_, hq, dq));
      ATTN_RETURN_IF_ERROR(upload(*k_, hkv, dk));
      ATTN_RETURN_IF_ERROR(upload(*v_, hkv, dv));
      // A borrowed stream may be non-blocking: the legacy-stream copies finish first.
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      ATTN_RETURN_IF_ERROR(
          plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(stage.data(), dout.get(), nq, cudaMemcpyDeviceToHost));
      CopyShardRows(out_.o.data(), stage.data(), one, b, n, r.size(), hq * d * es,
                    /*to_shard=*/false);
      std::vector<float> lse(b * hq * r.size());
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(lse.data(), dlse.get(), lse.size() * 4, cudaMemcpyDeviceToHost));
      CopyShardRows(out_.lse.data(), reinterpret_cast<std::byte*>(lse.data()), one, b * hq, n,
                    r.size(), 4, /*to_shard=*/false);
    }
    return absl::OkStatus();
  }();
  cudaStreamSynchronize(stream);
  if (borrowed_stream == nullptr) cudaStreamDestroy(stream);
  RingCudaRankStats rs;
  rs.device = device;
  rs.peak_device_bytes = alloc.Stats().peak_bytes;
  rs.estimated_device_bytes = EstimateRankBytes(rank);
  stats_[rank] = rs;
  if (st.ok()) done_[rank] = 1;
  return st;
}

absl::StatusOr<AttentionOutputs> RingCudaRun::TakeOutputs() {
  if (taken_) return absl::FailedPreconditionError("ring (CUDA): outputs already taken");
  for (int r = 0; r < ranks(); ++r) {
    if (!done_[r]) {
      return absl::FailedPreconditionError(
          absl::StrCat("ring (CUDA): rank ", r, " has not completed RunRank"));
    }
  }
  taken_ = true;
  AttentionOutputs out = std::move(out_);
  if (in_dtype_ == DType::kF32) {
    ATTN_ASSIGN_OR_RETURN(HostTensor o32, HostTensor::Create(DType::kF32, out.o.dims()));
    out.o.ToFloat32(o32.data_as<float>());
    out.o = std::move(o32);
  }
  return out;
}

std::vector<RingCudaRankStats> RingCudaRun::stats() const { return stats_; }

absl::StatusOr<AttentionOutputs> RingAttentionCuda(const AttentionSpec& spec, const HostTensor& q,
                                                   const HostTensor& k, const HostTensor& v,
                                                   std::vector<int> devices,
                                                   const RingCudaOptions& options,
                                                   std::vector<RingCudaRankStats>* stats) {
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<RingCudaRun> run,
                        RingCudaRun::Create(spec, q, k, v, std::move(devices), options));
  const int P = run->ranks();
  std::vector<absl::Status> status(P);
  // Outlives the rank threads (joined below): they copy it into their communicator options.
  std::shared_ptr<NcclGroup> group;
  if (run->plan() != nullptr) {
    ForceNcclNvlsOff();
    ATTN_ASSIGN_OR_RETURN(group, NcclGroup::Create(P));
  }
  std::vector<std::thread> threads;
  threads.reserve(P);
  if (run->plan() == nullptr) {  // dilated: shard-local, no communicator
    for (int rank = 0; rank < P; ++rank) {
      threads.emplace_back(
          [&, rank] { status[rank] = run->RunRankImpl(rank, nullptr, nullptr, nullptr); });
    }
  } else {
    for (int rank = 0; rank < P; ++rank) {
      threads.emplace_back([&, rank] {
        status[rank] = [&]() -> absl::Status {
          CUDA_RETURN_IF_ERROR(cudaSetDevice(run->device(rank)));
          NcclCommunicator::Options copts;
          copts.group = group;
          copts.rank = rank;
          copts.cuda_device = run->device(rank);
          copts.init_timeout = options.init_timeout;
          ATTN_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                                NcclCommunicator::Create(copts));
          return run->RunRank(rank, *comm);  // the rank (and its stream) end before comm
        }();
        if (!status[rank].ok()) group->Abort(status[rank]);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  // The first rank's own error; ranks that only saw the abort report the same status.
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  if (stats != nullptr) *stats = run->stats();
  return run->TakeOutputs();
}

}  // namespace attnserve
