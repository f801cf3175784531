#include "bench/ring/ring_run.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/harness/rank_threads.h"
#include "bench/ring/ring_bench.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_status.h"
#include "core/parallel/nccl_communicator.h"
#include "core/parallel/ring_cuda_plan.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

constexpr int64_t kBf16Bytes = 2;

// Copies the rank's ranges of Q, K and V from the single-GPU problem on source.device (B = 1:
// shard rows are the ranges' rows, concatenated).
absl::Status CopyShardFromSource(RingCudaRank& r, int rank, const SingleGpu& source) {
  const AttentionShape& s = source.shape;
  int64_t local = 0;
  for (const TokenRange& rg : r.ranges()) {
    auto copy = [&](void* dst, const void* src, int64_t heads) -> absl::Status {
      const int64_t row = heads * s.head_dim * kBf16Bytes;
      CUDA_RETURN_IF_ERROR(cudaMemcpyPeer(static_cast<std::byte*>(dst) + local * row, rank,
                                          static_cast<const std::byte*>(src) + rg.begin * row,
                                          source.device, rg.size() * row));
      return absl::OkStatus();
    };
    ATTN_RETURN_IF_ERROR(copy(r.q(), source.q.get(), s.q_heads));
    ATTN_RETURN_IF_ERROR(copy(r.k(), source.k.get(), s.kv_heads));
    ATTN_RETURN_IF_ERROR(copy(r.v(), source.v.get(), s.kv_heads));
    local += rg.size();
  }
  return absl::OkStatus();
}

float Bf16ToFloat(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Max |dO|, max |O_ref| and max |dLSE| of one rank's sampled rows against the single GPU.
struct RankError {
  double o_abs = 0, o_ref_max = 0, lse_abs = 0;
};

absl::StatusOr<RankError> CompareWithSource(const RingCudaRank& r, const SingleGpu& source) {
  const int64_t hq = source.shape.q_heads, d = source.shape.head_dim, n = source.shape.tokens;
  const int64_t nl = r.shard_tokens();
  std::vector<uint16_t> o_shard(nl * hq * d);
  std::vector<float> lse_shard(hq * nl);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(o_shard.data(), r.o(), o_shard.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(lse_shard.data(), r.lse(), lse_shard.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<uint16_t> o_ref(hq * d);
  float lse_ref = 0;
  RankError e;
  int64_t local = 0;
  for (const TokenRange& rg : r.ranges()) {
    for (int64_t row = rg.begin; row < rg.end; row += 509) {
      const int64_t lr = local + (row - rg.begin);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(
          o_ref.data(), static_cast<const std::byte*>(source.o.get()) + row * hq * d * 2,
          hq * d * 2, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < hq * d; ++i) {
        const double a = Bf16ToFloat(o_shard[lr * hq * d + i]), b = Bf16ToFloat(o_ref[i]);
        e.o_abs = std::max(e.o_abs, std::fabs(a - b));
        e.o_ref_max = std::max(e.o_ref_max, std::fabs(b));
      }
      for (int64_t h = 0; h < hq; ++h) {
        CUDA_RETURN_IF_ERROR(cudaMemcpy(&lse_ref, source.lse.as<float>() + h * n + row, 4,
                                        cudaMemcpyDeviceToHost));
        e.lse_abs =
            std::max(e.lse_abs, static_cast<double>(std::fabs(lse_shard[h * nl + lr] - lse_ref)));
      }
    }
    local += rg.size();
  }
  return e;
}

}  // namespace

RingCudaOptions RingOptionsFor(const CudaOptions& cuda) {
  RingCudaOptions options;
  options.cuda = cuda;
  return options;
}

RingResult RunRing(const RingRunSpec& spec, const CudaOptions& cuda, SingleGpu* source) {
  RingResult res;
  const AttentionShape& shape = spec.shape;
  RingCudaPlanOptions po;
  po.cudnn_pieces = spec.cudnn_pieces;
  absl::StatusOr<RingCudaPlan> plan =
      PlanRingCuda(DenseSpecOf(spec.causal), shape.tokens, spec.devices, po);
  if (!plan.ok()) {
    res.status = plan.status();
    return res;
  }
  ForceNcclNvlsOff();
  absl::StatusOr<std::shared_ptr<NcclGroup>> group = NcclGroup::Create(spec.devices);
  if (!group.ok()) {
    res.status = group.status();
    return res;
  }
  Barrier barrier(spec.devices);
  std::vector<RankError> errors(spec.devices);
  res.stats.resize(spec.devices);
  Clock::time_point t0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const RingCudaOptions ring_options = RingOptionsFor(cuda);
  auto rank_fn = [&](int rank) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<RingCudaRank> r,
                          RingCudaRank::Create(*plan, shape, DType::kBF16, scale, rank, rank,
                                               *group, ring_options));
    const int64_t nl = r->shard_tokens(), hq = shape.q_heads, hkv = shape.kv_heads;
    if (source != nullptr) {
      ATTN_RETURN_IF_ERROR(CopyShardFromSource(*r, rank, *source));
    } else {
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, r->q(), nl * hq * shape.head_dim,
                                             spec.seed + rank, -1.f, 1.f, r->stream()));
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, r->k(), 2 * nl * hkv * shape.head_dim,
                                             spec.seed + 100 + rank, -1.f, 1.f, r->stream()));
    }
    // cudaMemcpyPeer runs on the legacy default stream, which r->stream() does not wait for.
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    for (int it = 0; it < spec.warmup + spec.reps; ++it) {
      if (!barrier.Arrive()) return OtherRankFailed();
      if (rank == 0) t0 = Clock::now();
      ATTN_RETURN_IF_ERROR(r->Run());
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
      if (!barrier.Arrive()) return OtherRankFailed();
      if (rank == 0 && it >= spec.warmup) res.times.push_back(Seconds(t0, Clock::now()));
    }
    res.stats[rank] = r->stats();
    if (source != nullptr) {
      ATTN_ASSIGN_OR_RETURN(errors[rank], CompareWithSource(*r, *source));
    }
    return absl::OkStatus();
  };
  res.status = FirstFailure(RunRankThreads(
      spec.devices, rank_fn, &barrier, [&](const absl::Status& s) { (*group)->Abort(s); }));
  if (!res.status.ok() || source == nullptr) return res;
  RankError all;
  for (const RankError& e : errors) {
    all.o_abs = std::max(all.o_abs, e.o_abs);
    all.o_ref_max = std::max(all.o_ref_max, e.o_ref_max);
    all.lse_abs = std::max(all.lse_abs, e.lse_abs);
  }
  res.check_o_rel = all.o_abs / std::max(all.o_ref_max, 1e-30);
  res.check_lse_abs = all.lse_abs;
  return res;
}

DpResult RunDataParallel(const AttentionShape& shape, bool causal, int devices, int warmup,
                         int reps, const CudaOptions& cuda) {
  DpResult res;
  AttentionShape part = shape;
  part.q_heads = shape.q_heads / devices;
  part.kv_heads = std::max<int64_t>(1, shape.kv_heads / devices);
  Barrier barrier(devices);
  std::vector<double> times;
  res.peak_bytes.assign(devices, 0);
  Clock::time_point t0;
  res.status = FirstFailure(RunRankThreads(
      devices,
      [&](int dev) -> absl::Status {
        ATTN_ASSIGN_OR_RETURN(auto g, MakeSingleGpu(dev, part, causal, 7 + dev, cuda));
        for (int it = 0; it < warmup + reps; ++it) {
          if (!barrier.Arrive()) return OtherRankFailed();
          if (dev == 0) t0 = Clock::now();
          ATTN_RETURN_IF_ERROR(RunSingleOnce(*g).status());
          if (!barrier.Arrive()) return OtherRankFailed();
          if (dev == 0 && it >= warmup) times.push_back(Seconds(t0, Clock::now()));
        }
        res.peak_bytes[dev] = g->alloc->Stats().peak_bytes;
        return absl::OkStatus();
      },
      &barrier));
  if (res.status.ok()) res.median_s = Median(times);
  return res;
}

}  // namespace attnserve::bench
