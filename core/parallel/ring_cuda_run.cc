// RingCudaRun and RingAttentionCuda: the GPU ring over host tensors (ring_cuda.h). Uploads each
// rank's shard, runs its RingCudaRank, downloads its rows (asynchronous copies on the rank's
// stream, page-locked host memory: the host copies of ring_cuda.h); dilated specs run shard-local.
#include "core/parallel/ring_cuda.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/host_copy.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {

// ---- Host copies (ring_cuda.h) -----------------------------------------------------------------

std::vector<ShardRowBlock> ShardRowBlocks(const std::vector<TokenRange>& ranges, int64_t batch,
                                          int64_t n) {
  std::vector<ShardRowBlock> blocks;
  for (int64_t bi = 0; bi < batch; ++bi) {
    int64_t local = 0;
    for (const TokenRange& r : ranges) {
      if (r.size() > 0) blocks.push_back({bi, local, r.size(), bi * n + r.begin});
      local += r.size();
    }
  }
  return blocks;
}

absl::Status RingCopyQueue::Add(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (bytes_ > 0 && d == dst_ + bytes_ && s == src_ + bytes_) {
    bytes_ += bytes;
    return absl::OkStatus();
  }
  ATTN_RETURN_IF_ERROR(Flush());
  dst_ = d;
  src_ = s;
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status RingCopyQueue::Flush() {
  const size_t bytes = std::exchange(bytes_, 0);
  if (bytes == 0) return absl::OkStatus();
  switch (kind_) {
    case cudaMemcpyHostToDevice:
      return CopyToDevice(dst_, src_, bytes, stream_, counters_);
    case cudaMemcpyDeviceToHost:
      return CopyToHost(dst_, src_, bytes, stream_, counters_);
    default:
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_, src_, bytes, kind_, stream_));
      return absl::OkStatus();
  }
}

absl::StatusOr<HostTensor> PinnedHostTensor(DType dtype, std::vector<int64_t> dims) {
  return HostTensor::Create(dtype, std::move(dims), nullptr, &ProcessPinnedHostPool());
}

bool CopiesAsync(const HostTensor& t) { return !t.empty() && IsPageLocked(t.data()); }

namespace {

// bf16 copy of an f32 tensor (the kernels compute in bf16, as CudaAttentionPlan does), in
// page-locked memory: the ranks copy their shards straight from it.
absl::StatusOr<HostTensor> ToBf16(const HostTensor& t) {
  ATTN_ASSIGN_OR_RETURN(HostTensor out, PinnedHostTensor(DType::kBF16, t.dims()));
  out.FromFloat32(t.data_as<float>());
  return out;
}

// Copies rows [range) of every batch between a full [B, N, H, D] host tensor and a shard
// [B, nl, H, D] (ranges concatenated). to_shard: full -> shard, else shard -> full.
void CopyShardRows(std::byte* full, std::byte* shard, const std::vector<TokenRange>& ranges,
                   int64_t b, int64_t n, int64_t nl, int64_t row_bytes, bool to_shard) {
  for (const ShardRowBlock& blk : ShardRowBlocks(ranges, b, n)) {
    std::byte* f = full + blk.host_row * row_bytes;
    std::byte* s = shard + (blk.batch * nl + blk.local_row) * row_bytes;
    if (to_shard) {
      std::memcpy(s, f, blk.tokens * row_bytes);
    } else {
      std::memcpy(f, s, blk.tokens * row_bytes);
    }
  }
}

int64_t RowBytes(const HostTensor& t) {
  return t.dim(2) * t.dim(3) * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// The host rows a shard (`ranges` of every batch item, nl rows) of a [B, N, H, D] input is
// uploaded from: the input's own rows when it is page-locked (no staging copy; the server's
// request tensors are), else the shard gathered into a page-locked block.
struct ShardSource {
  const std::byte* rows = nullptr;
  std::vector<ShardRowBlock> blocks;
  HostTensor stage;  // the gathered shard (pageable inputs only); held until the stream syncs
};

absl::StatusOr<ShardSource> SourceOf(const HostTensor& t, const std::vector<TokenRange>& ranges,
                                     int64_t nl) {
  const int64_t b = t.dim(0), n = t.dim(1);
  ShardSource s;
  if (CopiesAsync(t)) {
    s.rows = t.data();
    s.blocks = ShardRowBlocks(ranges, b, n);
    return s;
  }
  ATTN_ASSIGN_OR_RETURN(s.stage, PinnedHostTensor(t.dtype(), {b, nl, t.dim(2), t.dim(3)}));
  CopyShardRows(const_cast<std::byte*>(t.data()), s.stage.data(), ranges, b, n, nl, RowBytes(t),
                /*to_shard=*/true);
  s.rows = s.stage.data();
  s.blocks = ShardRowBlocks({TokenRange{0, nl}}, b, nl);
  return s;
}

// Enqueues the upload of a shard into `dst` ([B, nl, H, D], rows of `row_bytes`) on `stream`.
absl::Status UploadShard(const ShardSource& src, int64_t row_bytes, int64_t nl, void* dst,
                         cudaStream_t stream, HostCopyCounters* counters) {
  RingCopyQueue queue(cudaMemcpyHostToDevice, stream, counters);
  for (const ShardRowBlock& blk : src.blocks) {
    ATTN_RETURN_IF_ERROR(
        queue.Add(static_cast<std::byte*>(dst) + (blk.batch * nl + blk.local_row) * row_bytes,
                  src.rows + blk.host_row * row_bytes, blk.tokens * row_bytes));
  }
  return queue.Flush();
}

// Enqueues the download of a shard ([B, nl, H, D] at `src`) straight into its rows of `full`
// ([B, N, H, D], page-locked) on `stream`.
absl::Status DownloadShard(const void* src, const std::vector<TokenRange>& ranges, int64_t nl,
                           HostTensor& full, cudaStream_t stream, HostCopyCounters* counters) {
  const int64_t row = RowBytes(full);
  RingCopyQueue queue(cudaMemcpyDeviceToHost, stream, counters);
  for (const ShardRowBlock& blk : ShardRowBlocks(ranges, full.dim(0), full.dim(1))) {
    ATTN_RETURN_IF_ERROR(
        queue.Add(full.data() + blk.host_row * row,
                  static_cast<const std::byte*>(src) + (blk.batch * nl + blk.local_row) * row,
                  blk.tokens * row));
  }
  return queue.Flush();
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
  // Page-locked: every rank copies its rows of O straight into them.
  ATTN_ASSIGN_OR_RETURN(run->out_.o, PinnedHostTensor(dtype, {b, n, hq, d}));
  ATTN_ASSIGN_OR_RETURN(run->out_.lse, PinnedHostTensor(DType::kF32, {b, hq, n}));
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
                                  cudaStream_t stream, HostCopyCounters* copies) {
  absl::Status s = RunRankImpl(rank, &comm, alloc, stream, copies);
  if (!s.ok()) comm.Abort(s);
  return s;
}

absl::Status RingCudaRun::RunRankImpl(int rank, NcclCommunicator* comm, CachingAllocator* alloc,
                                      cudaStream_t stream, HostCopyCounters* copies) {
  HostCopyCounters* counters = copies != nullptr ? copies : options_.copy_counters;
  if (rank < 0 || rank >= ranks()) {
    return absl::InvalidArgumentError(absl::StrCat("ring (CUDA): rank ", rank, " of ", ranks()));
  }
  if (taken_) return absl::FailedPreconditionError("ring (CUDA): outputs already taken");
  if (!plan_) return RunDilatedRank(rank, alloc, stream, counters);
  if (comm == nullptr) return absl::InvalidArgumentError("ring (CUDA): no communicator");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[rank]));
  const DType dtype = q_->dtype();
  // Host memory the rank's copies read or write: declared before the rank, whose destructor
  // synchronizes its stream, so that none goes back to the pool with a copy still queued.
  ShardSource qs, ks, vs;
  HostTensor lse;
  RingCudaOptions rank_options = options_;
  rank_options.copy_counters = counters;  // the K/V rows the rank enqueues are counted there too
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<RingCudaRank> r,
                        RingCudaRank::Create(*plan_, shape_, dtype, scale_, rank, devices_[rank],
                                             *comm, alloc, stream, rank_options));
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads;
  const int64_t nl = r->shard_tokens();
  const std::vector<TokenRange>& ranges = r->ranges();
  // Inputs on the rank's stream, ahead of its ticks (the communicator orders each transfer after
  // the stream's queued work): straight from the inputs' rows when they are page-locked.
  ATTN_ASSIGN_OR_RETURN(qs, SourceOf(*q_, ranges, nl));
  ATTN_ASSIGN_OR_RETURN(ks, SourceOf(*k_, ranges, nl));
  ATTN_ASSIGN_OR_RETURN(vs, SourceOf(*v_, ranges, nl));
  ATTN_RETURN_IF_ERROR(UploadShard(qs, RowBytes(*q_), nl, r->q(), r->stream(), counters));
  ATTN_RETURN_IF_ERROR(r->EnqueueKvRows(RingCudaRank::KvPart::kK, ks.rows, ks.blocks));
  ATTN_RETURN_IF_ERROR(r->EnqueueKvRows(RingCudaRank::KvPart::kV, vs.rows, vs.blocks));
  ATTN_RETURN_IF_ERROR(r->Run());
  // O straight into the run's page-locked O rows; LSE [B, Hq, nl] through a page-locked block.
  ATTN_RETURN_IF_ERROR(DownloadShard(r->o(), ranges, nl, out_.o, r->stream(), counters));
  ATTN_ASSIGN_OR_RETURN(lse, PinnedHostTensor(DType::kF32, {b, hq, nl}));
  ATTN_RETURN_IF_ERROR(CopyToHost(lse.data(), r->lse(), lse.nbytes(), r->stream(), counters));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
  // LSE [B, Hq, nl] -> [B, Hq, N]: each (batch, head) row is a [1, nl, 1, 4-byte] shard.
  CopyShardRows(out_.lse.data(), lse.data(), ranges, b * hq, n, nl, 4, /*to_shard=*/false);
  stats_[rank] = r->stats();
  done_[rank] = 1;
  return absl::OkStatus();
}

absl::Status RingCudaRun::RunDilatedPart(const TokenRange& range, CachingAllocator& alloc,
                                         cudaStream_t stream, HostCopyCounters* counters) {
  const DType dtype = q_->dtype();
  const int64_t b = shape_.batch, n = shape_.tokens, hq = shape_.q_heads,
                hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t nl = range.size();
  const std::vector<TokenRange> one = {range};
  // Buffers and staging blocks outlive the stream synchronization below, on every path.
  std::unique_ptr<CudaAttentionPlan> plan;
  DeviceBuffer dq, dk, dv, dout, dlse;
  ShardSource qs, ks, vs;
  HostTensor lse;
  const absl::Status st = [&]() -> absl::Status {
    const AttentionShape sub{b, nl, hq, hkv, d};
    ATTN_ASSIGN_OR_RETURN(plan, CudaAttentionPlan::Create(spec_, sub, dtype, alloc, stream));
    const int64_t nq = b * nl * hq * d * es, nkv = b * nl * hkv * d * es;
    ATTN_ASSIGN_OR_RETURN(dq, DeviceBuffer::Create(alloc, nq));
    ATTN_ASSIGN_OR_RETURN(dk, DeviceBuffer::Create(alloc, nkv));
    ATTN_ASSIGN_OR_RETURN(dv, DeviceBuffer::Create(alloc, nkv));
    ATTN_ASSIGN_OR_RETURN(dout, DeviceBuffer::Create(alloc, nq));
    ATTN_ASSIGN_OR_RETURN(dlse, DeviceBuffer::Create(alloc, b * hq * nl * 4));
    ATTN_ASSIGN_OR_RETURN(qs, SourceOf(*q_, one, nl));
    ATTN_ASSIGN_OR_RETURN(ks, SourceOf(*k_, one, nl));
    ATTN_ASSIGN_OR_RETURN(vs, SourceOf(*v_, one, nl));
    ATTN_RETURN_IF_ERROR(UploadShard(qs, hq * d * es, nl, dq.get(), stream, counters));
    ATTN_RETURN_IF_ERROR(UploadShard(ks, hkv * d * es, nl, dk.get(), stream, counters));
    ATTN_RETURN_IF_ERROR(UploadShard(vs, hkv * d * es, nl, dv.get(), stream, counters));
    ATTN_RETURN_IF_ERROR(
        plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream));
    ATTN_RETURN_IF_ERROR(DownloadShard(dout.get(), one, nl, out_.o, stream, counters));
    ATTN_ASSIGN_OR_RETURN(lse, PinnedHostTensor(DType::kF32, {b, hq, nl}));
    return CopyToHost(lse.data(), dlse.get(), lse.nbytes(), stream, counters);
  }();
  const cudaError_t sync = cudaStreamSynchronize(stream);
  ATTN_RETURN_IF_ERROR(st);
  if (sync != cudaSuccess) {
    return CudaErrorToStatus(sync, "cudaStreamSynchronize(dilated part)", __FILE__, __LINE__);
  }
  CopyShardRows(out_.lse.data(), lse.data(), one, b * hq, n, nl, 4, /*to_shard=*/false);
  return absl::OkStatus();
}

absl::Status RingCudaRun::RunDilatedRank(int rank, CachingAllocator* borrowed_alloc,
                                         cudaStream_t borrowed_stream,
                                         HostCopyCounters* counters) {
  const int device = devices_[rank];
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<CachingAllocator> own_alloc;
  if (borrowed_alloc == nullptr) own_alloc = std::make_unique<CachingAllocator>(device);
  CachingAllocator& alloc = borrowed_alloc ? *borrowed_alloc : *own_alloc;
  cudaStream_t stream = borrowed_stream;
  if (stream == nullptr) CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  absl::Status st;
  for (const TokenRange& r : dilated_split_[rank]) {
    if (r.size() > 0 && st.ok()) st = RunDilatedPart(r, alloc, stream, counters);
  }
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
    ATTN_ASSIGN_OR_RETURN(HostTensor o32, PinnedHostTensor(DType::kF32, out.o.dims()));
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
          [&, rank] { status[rank] = run->RunRankImpl(rank, nullptr, nullptr, nullptr, nullptr); });
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
