#include "core/dist/ring_cuda.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

template <typename T>
absl::StatusOr<DeviceBuffer> UploadSync(CachingAllocator& alloc, const std::vector<T>& host) {
  ATTN_ASSIGN_OR_RETURN(DeviceBuffer buf,
                        DeviceBuffer::Create(alloc, std::max<size_t>(1, host.size()) * sizeof(T)));
  if (!host.empty()) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return buf;
}

}  // namespace

absl::Status LaunchRingPiece(const RingPiece& piece, const RingPieceOperands& ops,
                             cudaStream_t stream) {
  const int64_t b = ops.shape.batch, hq = ops.shape.q_heads, hkv = ops.shape.kv_heads,
                d = ops.shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(ops.dtype));
  const int64_t nl = ops.q_tokens, ns = ops.kv_tokens;
  FlashFwdParams p;
  p.q = static_cast<const std::byte*>(ops.q) + piece.q_row * hq * d * es;
  p.k = static_cast<const std::byte*>(ops.k) + piece.k_row * hkv * d * es;
  p.v = static_cast<const std::byte*>(ops.v) + piece.k_row * hkv * d * es;
  p.o = ops.o_acc + piece.q_row * hq * d;
  p.lse = ops.lse + piece.q_row;
  p.accumulate = true;
  p.q_batch_stride = p.o_batch_stride = nl * hq * d;
  p.q_row_stride = p.o_row_stride = hq * d;
  p.q_head_stride = p.o_head_stride = d;
  p.k_batch_stride = p.v_batch_stride = ns * hkv * d;
  p.k_row_stride = p.v_row_stride = hkv * d;
  p.k_head_stride = p.v_head_stride = d;
  p.lse_batch_stride = hq * nl;
  p.lse_head_stride = nl;
  p.lse_row_stride = 1;
  p.batch = static_cast<int32_t>(b);
  p.num_segs = 1;
  p.seqlen = piece.q.size();
  p.seqlen_k = piece.k.size();
  p.q_pos_offset = piece.q.begin;
  p.k_pos_offset = piece.k.begin;
  p.num_heads = static_cast<int32_t>(hq);
  p.kv_group = static_cast<int32_t>(hq / hkv);
  p.head_dim = static_cast<int32_t>(d);
  p.block_size = ops.block_size;
  p.dtype = ops.dtype;
  p.scale = ops.scale;
  p.scale_log2 = static_cast<float>(ops.scale * M_LOG2E);
  p.num_q_blocks = NumBlocks(piece.q.size(), ops.block_size);
  p.num_k_blocks = NumBlocks(piece.k.size(), ops.block_size);
  switch (piece.kind) {
    case RingPieceKind::kFull:
      break;
    case RingPieceKind::kCausalDiagonal:
      p.dense_causal = true;
      p.row_order = ops.reverse_rows;
      break;
    case RingPieceKind::kLayout:
      if (ops.row_ptr == nullptr || ops.col_idx == nullptr || ops.block_mask == nullptr) {
        return absl::InvalidArgumentError("ring piece: layout piece without a device CSR");
      }
      p.row_ptr = ops.row_ptr;
      p.col_idx = ops.col_idx;
      p.block_mask = ops.block_mask;
      p.rule_causal = piece.layout.rule.causal;
      p.rule_window = piece.layout.rule.window ? *piece.layout.rule.window : -1;
      break;
  }
  return RunAttentionForward(p, stream);
}

absl::StatusOr<std::unique_ptr<RingCudaRank>> RingCudaRank::Create(
    const RingCudaPlan& plan, const AttentionShape& shape, DType dtype, float scale, int rank,
    int device, std::shared_ptr<NcclGroup> group, const RingCudaOptions& options) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError("ring (CUDA): device buffers must be bf16 or f16");
  }
  if (rank < 0 || rank >= plan.ranks || group == nullptr || group->size() != plan.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("ring (CUDA): rank ", rank, " of ", plan.ranks,
                                                   " does not match the plan or the group"));
  }
  if (!CudaSupportsHeadDim(shape.head_dim)) {
    return absl::UnimplementedError(absl::StrCat(
        "shape.head_dim: the CUDA backend supports head dims 64 and 128, got ", shape.head_dim));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<RingCudaRank> r(new RingCudaRank());
  r->plan_ = &plan;
  r->shape_ = shape;
  r->dtype_ = dtype;
  r->scale_ = scale;
  r->rank_ = rank;
  r->device_ = device;
  r->options_ = options;
  r->alloc_ = std::make_unique<CachingAllocator>(device);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r->stream_, cudaStreamNonBlocking));

  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t nl = plan.shard_tokens[rank];
  const int64_t nmax = plan.max_shard_tokens;
  CachingAllocator& a = *r->alloc_;
  auto make = [&a](int64_t bytes) {
    return DeviceBuffer::Create(a, std::max<int64_t>(bytes, 256));
  };
  ATTN_ASSIGN_OR_RETURN(r->q_, make(b * nl * hq * d * es));
  ATTN_ASSIGN_OR_RETURN(r->home_kv_, make(2 * b * nl * hkv * d * es));
  ATTN_ASSIGN_OR_RETURN(r->o_, make(b * nl * hq * d * es));
  ATTN_ASSIGN_OR_RETURN(r->o_acc_, make(b * nl * hq * d * 4));
  ATTN_ASSIGN_OR_RETURN(r->lse_, make(b * hq * nl * 4));
  for (int i = 0; i < std::min(2, plan.ranks - 1); ++i) {
    ATTN_ASSIGN_OR_RETURN(r->rot_kv_[i], make(2 * b * nmax * hkv * d * es));
  }

  // Every layout piece of this rank's steps, uploaded once.
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> col_idx;
  std::vector<uint8_t> mask;
  int64_t max_q_blocks = 1;
  r->piece_offsets_.resize(plan.ranks);
  for (int t = 0; t < plan.ranks; ++t) {
    for (const RingPiece& piece : plan.steps[rank][t].pieces) {
      max_q_blocks = std::max(max_q_blocks, NumBlocks(piece.q.size(), plan.block_size));
      r->piece_offsets_[t].push_back(
          {static_cast<int64_t>(row_ptr.size()), static_cast<int64_t>(col_idx.size())});
      if (piece.kind != RingPieceKind::kLayout) continue;
      if (piece.layout.tile != plan.block_size) {
        return absl::InternalError("ring (CUDA): piece layout tile != kernel block size");
      }
      row_ptr.insert(row_ptr.end(), piece.layout.row_ptr.begin(), piece.layout.row_ptr.end());
      col_idx.insert(col_idx.end(), piece.layout.col_idx.begin(), piece.layout.col_idx.end());
      for (BlockMask m : piece.layout.mask) mask.push_back(static_cast<uint8_t>(m));
    }
  }
  // Heavy rows first for causal diagonal pieces: [M-1, ..., 0]; a piece of nb blocks uses the
  // last nb entries, which are [nb-1, ..., 0].
  std::vector<int32_t> reverse(max_q_blocks);
  for (int64_t i = 0; i < max_q_blocks; ++i)
    reverse[i] = static_cast<int32_t>(max_q_blocks - 1 - i);
  r->reverse_rows_len_ = max_q_blocks;
  ATTN_ASSIGN_OR_RETURN(r->row_ptr_, UploadSync(a, row_ptr));
  ATTN_ASSIGN_OR_RETURN(r->col_idx_, UploadSync(a, col_idx));
  ATTN_ASSIGN_OR_RETURN(r->mask_, UploadSync(a, mask));
  ATTN_ASSIGN_OR_RETURN(r->reverse_rows_, UploadSync(a, reverse));

  // cudaMemcpy from pageable memory runs on the legacy default stream, which the non-blocking
  // compute stream does not wait for: finish it here.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  ForceNcclNvlsOff();
  NcclCommunicator::Options copts;
  copts.group = std::move(group);
  copts.rank = rank;
  copts.cuda_device = device;
  copts.compute_stream = r->stream_;
  copts.init_timeout = options.init_timeout;
  ATTN_ASSIGN_OR_RETURN(r->comm_, NcclCommunicator::Create(copts));
  return r;
}

RingCudaRank::~RingCudaRank() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  comm_.reset();  // its comm stream waits on nothing of ours any more
  for (DeviceBuffer* buf : {&q_, &home_kv_, &o_, &o_acc_, &lse_, &rot_kv_[0], &rot_kv_[1],
                            &row_ptr_, &col_idx_, &mask_, &reverse_rows_}) {
    buf->Reset();
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void* RingCudaRank::v() const {
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  return static_cast<std::byte*>(home_kv_.get()) +
         shape_.batch * shard_tokens() * shape_.kv_heads * shape_.head_dim * es;
}

int64_t RingCudaRank::KvBytes(int source) const {
  return 2 * shape_.batch * plan_->shard_tokens[source] * shape_.kv_heads * shape_.head_dim *
         static_cast<int64_t>(DTypeSize(dtype_));
}

absl::Status RingCudaRank::Run() {
  absl::Status s = RunSteps();
  if (!s.ok() && comm_ != nullptr) comm_->Abort(s);
  return s;
}

absl::Status RingCudaRank::RunSteps() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int P = plan_->ranks;
  const int64_t b = shape_.batch, hq = shape_.q_heads, hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t nl = shard_tokens();
  bytes_sent_base_ = comm_->bytes_sent();
  bytes_received_base_ = comm_->bytes_received();
  steps_run_ = 0;
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o_acc_.get(), 0, b * nl * hq * d * 4, stream_));
  CUDA_RETURN_IF_ERROR(LaunchFillFloat(lse_.as<float>(), -INFINITY, b * hq * nl, stream_));

  const WaitOptions wait{options_.transfer_timeout, options_.cancel};
  const void* cur = home_kv_.get();
  for (int t = 0; t < P; ++t) {
    const RingStep& step = plan_->steps[rank_][t];
    const int src = step.source;
    PendingTransfer transfer;
    void* recv = nullptr;
    if (t + 1 < P) {
      // Send what we hold to rank+1, receive what rank-1 holds: the shard of source src-1.
      const int next_src = (src - 1 + P) % P;
      recv = rot_kv_[t % 2].get();
      ATTN_ASSIGN_OR_RETURN(transfer, comm_->StartSendRecv(cur, KvBytes(src), (rank_ + 1) % P, recv,
                                                           KvBytes(next_src), (rank_ - 1 + P) % P));
    }
    const int64_t ns = plan_->shard_tokens[src];
    const std::byte* kbase = static_cast<const std::byte*>(cur);
    const std::byte* vbase = kbase + b * ns * hkv * d * es;
    for (size_t i = 0; i < step.pieces.size(); ++i) {
      const RingPiece& piece = step.pieces[i];
      RingPieceOperands ops;
      ops.q = q_.get();
      ops.k = kbase;
      ops.v = vbase;
      ops.o_acc = o_acc_.as<float>();
      ops.lse = lse_.as<float>();
      ops.q_tokens = nl;
      ops.kv_tokens = ns;
      ops.shape = shape_;
      ops.dtype = dtype_;
      ops.scale = scale_;
      ops.block_size = plan_->block_size;
      const auto [rp, ci] = piece_offsets_[t][i];
      ops.row_ptr = row_ptr_.as<int64_t>() + rp;
      ops.col_idx = col_idx_.as<int32_t>() + ci;
      ops.block_mask = mask_.as<uint8_t>() + ci;
      const int64_t nb = NumBlocks(piece.q.size(), plan_->block_size);
      ops.reverse_rows = reverse_rows_.as<int32_t>() + (reverse_rows_len_ - nb);
      ATTN_RETURN_IF_ERROR(LaunchRingPiece(piece, ops, stream_));
    }
    if (transfer.valid()) {
      ATTN_RETURN_IF_ERROR(comm_->Wait(std::move(transfer), wait));
      cur = recv;
    }
    ++steps_run_;
  }
  CUDA_RETURN_IF_ERROR(
      LaunchConvert(DType::kF32, o_acc_.get(), dtype_, o_.get(), b * nl * hq * d, stream_));
  return absl::OkStatus();
}

RingCudaRankStats RingCudaRank::stats() const {
  RingCudaRankStats s;
  s.device = device_;
  s.steps = steps_run_;
  for (const RingStep& step : plan_->steps[rank_]) {
    s.pieces += static_cast<int64_t>(step.pieces.size());
    s.skipped_pieces += step.skipped_pieces;
  }
  s.admitted_pairs = plan_->admitted_pairs[rank_] * shape_.batch * shape_.q_heads;
  s.bytes_sent = comm_->bytes_sent() - bytes_sent_base_;
  s.bytes_received = comm_->bytes_received() - bytes_received_base_;
  s.peak_device_bytes = alloc_->Stats().peak_bytes;
  return s;
}

// ---- host API --------------------------------------------------------------------------------

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

namespace {

// Dilated specs: shards cut on multiples of lcm(segment lengths) hold whole segments of every
// branch, and a segment's queries attend only to its own keys, so each rank runs the single-GPU
// dilated plan on each of its ranges with no communication. Segment structure is preserved: a
// range starting at a multiple of every w_k sees segment t of the range as global segment
// t + begin / w_k, with the same head offsets; only the range ending at N has short segments,
// exactly where the global sequence has them.
absl::Status RunDilatedLocal(const AttentionSpec& spec, const HostTensor& q, const HostTensor& k,
                             const HostTensor& v, const AttentionShape& shape,
                             const std::vector<int>& devices, AttentionOutputs& out) {
  const auto& dil = std::get<DilatedSpec>(spec.pattern);
  const int P = static_cast<int>(devices.size());
  const int64_t b = shape.batch, n = shape.tokens, hq = shape.q_heads, hkv = shape.kv_heads,
                d = shape.head_dim;
  int64_t unit = 1;
  for (int64_t w : dil.segment_lengths) {
    unit = std::lcm(unit, w);
    if (unit > n) break;
  }
  if (NumBlocks(n, unit) < P) {
    return absl::UnimplementedError(absl::StrCat(
        "placement ring: the dilated branches' segments (lcm of segment_lengths = ", unit,
        " tokens) do not fit ", P, " shards of ", n,
        " tokens, and the CUDA ring does not move dilated segments between GPUs; use the "
        "single-GPU or data-parallel placement"));
  }
  const std::vector<std::vector<TokenRange>> split = SplitSequence(n, P, SplitKindFor(spec), unit);
  const int64_t es = static_cast<int64_t>(DTypeSize(q.dtype()));
  std::vector<absl::Status> status(P);
  auto worker = [&](int rank) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[rank]));
    CachingAllocator alloc(devices[rank]);
    cudaStream_t stream;
    CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));  // blocking: ordered after cudaMemcpy
    absl::Status st = [&]() -> absl::Status {
      for (const TokenRange& r : split[rank]) {
        if (r.size() == 0) continue;
        const AttentionShape sub{b, r.size(), hq, hkv, d};
        ATTN_ASSIGN_OR_RETURN(auto plan,
                              CudaAttentionPlan::Create(spec, sub, q.dtype(), alloc, stream));
        const int64_t nq = b * r.size() * hq * d * es, nkv = b * r.size() * hkv * d * es;
        std::vector<std::byte> stage(std::max(nq, nkv));
        ATTN_ASSIGN_OR_RETURN(DeviceBuffer dq, DeviceBuffer::Create(alloc, nq));
        ATTN_ASSIGN_OR_RETURN(DeviceBuffer dk, DeviceBuffer::Create(alloc, nkv));
        ATTN_ASSIGN_OR_RETURN(DeviceBuffer dv, DeviceBuffer::Create(alloc, nkv));
        ATTN_ASSIGN_OR_RETURN(DeviceBuffer dout, DeviceBuffer::Create(alloc, nq));
        ATTN_ASSIGN_OR_RETURN(DeviceBuffer dlse,
                              DeviceBuffer::Create(alloc, b * hq * r.size() * 4));
        const std::vector<TokenRange> one = {r};
        auto upload = [&](const HostTensor& t, int64_t heads, DeviceBuffer& dst) -> absl::Status {
          CopyShardRows(const_cast<std::byte*>(t.data()), stage.data(), one, b, n, r.size(),
                        heads * d * es, /*to_shard=*/true);
          CUDA_RETURN_IF_ERROR(cudaMemcpy(dst.get(), stage.data(), b * r.size() * heads * d * es,
                                          cudaMemcpyHostToDevice));
          return absl::OkStatus();
        };
        ATTN_RETURN_IF_ERROR(upload(q, hq, dq));
        ATTN_RETURN_IF_ERROR(upload(k, hkv, dk));
        ATTN_RETURN_IF_ERROR(upload(v, hkv, dv));
        ATTN_RETURN_IF_ERROR(
            plan->Run(dq.get(), dk.get(), dv.get(), dout.get(), dlse.as<float>(), stream));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        CUDA_RETURN_IF_ERROR(cudaMemcpy(stage.data(), dout.get(), nq, cudaMemcpyDeviceToHost));
        CopyShardRows(out.o.data(), stage.data(), one, b, n, r.size(), hq * d * es,
                      /*to_shard=*/false);
        std::vector<float> lse(b * hq * r.size());
        CUDA_RETURN_IF_ERROR(
            cudaMemcpy(lse.data(), dlse.get(), lse.size() * 4, cudaMemcpyDeviceToHost));
        CopyShardRows(out.lse.data(), reinterpret_cast<std::byte*>(lse.data()), one, b * hq, n,
                      r.size(), 4, /*to_shard=*/false);
      }
      return absl::OkStatus();
    }();
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    return st;
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < P; ++rank) {
    threads.emplace_back([&, rank] { status[rank] = worker(rank); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttentionOutputs> RingAttentionCuda(const AttentionSpec& spec, const HostTensor& q,
                                                   const HostTensor& k, const HostTensor& v,
                                                   std::vector<int> devices,
                                                   const RingCudaOptions& options,
                                                   std::vector<RingCudaRankStats>* stats) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, shape));
  if (devices.empty()) return absl::InvalidArgumentError("ring (CUDA): no devices");
  const DType in_dtype = q.dtype();
  if (in_dtype == DType::kF32) {
    ATTN_ASSIGN_OR_RETURN(HostTensor qb, ToBf16(q));
    ATTN_ASSIGN_OR_RETURN(HostTensor kb, ToBf16(k));
    ATTN_ASSIGN_OR_RETURN(HostTensor vb, ToBf16(v));
    ATTN_ASSIGN_OR_RETURN(AttentionOutputs out,
                          RingAttentionCuda(spec, qb, kb, vb, devices, options, stats));
    ATTN_ASSIGN_OR_RETURN(HostTensor o32, HostTensor::Create(DType::kF32, out.o.dims()));
    out.o.ToFloat32(o32.data_as<float>());
    out.o = std::move(o32);
    return out;
  }
  const int P = static_cast<int>(devices.size());
  const int64_t b = shape.batch, n = shape.tokens, hq = shape.q_heads, hkv = shape.kv_heads,
                d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(in_dtype));
  if (std::holds_alternative<DilatedSpec>(spec.pattern)) {
    AttentionOutputs out;
    ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(in_dtype, {b, n, hq, d}));
    ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, {b, hq, n}));
    ATTN_RETURN_IF_ERROR(RunDilatedLocal(spec, q, k, v, shape, devices, out));
    if (stats != nullptr) stats->assign(P, RingCudaRankStats{});
    return out;
  }
  ATTN_ASSIGN_OR_RETURN(const RingCudaPlan plan, PlanRingCuda(spec, n, P, options.plan));
  ForceNcclNvlsOff();
  ATTN_ASSIGN_OR_RETURN(std::shared_ptr<NcclGroup> group, NcclGroup::Create(P));

  AttentionOutputs out;
  ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(in_dtype, {b, n, hq, d}));
  ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, {b, hq, n}));
  const float scale = EffectiveScale(spec, d);
  std::vector<absl::Status> status(P);
  std::vector<RingCudaRankStats> rank_stats(P);

  auto worker = [&](int rank) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        std::unique_ptr<RingCudaRank> r,
        RingCudaRank::Create(plan, shape, in_dtype, scale, rank, devices[rank], group, options));
    const int64_t nl = r->shard_tokens();
    const std::vector<TokenRange>& ranges = r->ranges();
    std::vector<std::byte> stage(std::max<int64_t>(b * nl * hq * d * es, 1));
    auto upload = [&](const HostTensor& t, int64_t heads, void* dst) -> absl::Status {
      CopyShardRows(const_cast<std::byte*>(t.data()), stage.data(), ranges, b, n, nl,
                    heads * d * es, /*to_shard=*/true);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(dst, stage.data(), b * nl * heads * d * es, cudaMemcpyHostToDevice));
      return absl::OkStatus();
    };
    ATTN_RETURN_IF_ERROR(upload(q, hq, r->q()));
    ATTN_RETURN_IF_ERROR(upload(k, hkv, r->k()));
    ATTN_RETURN_IF_ERROR(upload(v, hkv, r->v()));
    // The copies ran on the legacy default stream; the rank's stream is non-blocking.
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    ATTN_RETURN_IF_ERROR(r->Run());
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(stage.data(), r->o(), b * nl * hq * d * es, cudaMemcpyDeviceToHost));
    CopyShardRows(out.o.data(), stage.data(), ranges, b, n, nl, hq * d * es, /*to_shard=*/false);
    std::vector<float> lse(std::max<int64_t>(b * hq * nl, 1));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(lse.data(), r->lse(), b * hq * nl * 4, cudaMemcpyDeviceToHost));
    // LSE [B, Hq, nl] -> [B, Hq, N]: each (batch, head) row is a [1, nl, 1, 4-byte] shard.
    CopyShardRows(out.lse.data(), reinterpret_cast<std::byte*>(lse.data()), ranges, b * hq, n, nl,
                  4, /*to_shard=*/false);
    rank_stats[rank] = r->stats();
    return absl::OkStatus();
  };

  std::vector<std::thread> threads;
  threads.reserve(P);
  for (int rank = 0; rank < P; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = worker(rank);
      if (!status[rank].ok()) group->Abort(status[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  // The first rank's own error; ranks that only saw the abort report the same status.
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  if (stats != nullptr) *stats = std::move(rank_stats);
  return out;
}

}  // namespace attnserve
