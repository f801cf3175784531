#include "core/dist/ring_cuda.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_device.h"
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

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

bool RingCudnnPiecesWanted() {
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
  const char* env = std::getenv(kAttentionEngineEnv);
  return env == nullptr || std::string_view(env) != "own";
#else
  return false;
#endif
}

namespace {

// One cuDNN engine per device for every ring of the process (a handle and its graph cache cost
// ~1 s to warm up; rings repeat the same few piece shapes). Created on first use, never freed.
// Null when libcudnn cannot be loaded there (logged once per device by the caller's stats).
CudnnSdpa* SharedRingCudnn(int device) {
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
  static std::mutex* mu = new std::mutex;
  static std::map<int, CudnnSdpa*>* engines = new std::map<int, CudnnSdpa*>;
  std::lock_guard<std::mutex> lock(*mu);
  if (auto it = engines->find(device); it != engines->end()) return it->second;
  CudnnSdpa::Options o;
  o.device = device;
  absl::StatusOr<std::unique_ptr<CudnnSdpa>> e = CudnnSdpa::Create(o);
  CudnnSdpa* engine = e.ok() ? e->release() : nullptr;
  (*engines)[device] = engine;
  return engine;
#else
  (void)device;
  return nullptr;
#endif
}

}  // namespace

absl::Status LaunchRingPiece(const RingPiece& piece, const RingPieceOperands& ops,
                             cudaStream_t stream, bool* ran_on_cudnn) {
  if (ran_on_cudnn != nullptr) *ran_on_cudnn = false;
  const int64_t b = ops.shape.batch, hq = ops.shape.q_heads, hkv = ops.shape.kv_heads,
                d = ops.shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(ops.dtype));
  const int64_t nl = ops.q_tokens, ns = ops.kv_tokens;
  FlashFwdParams p;
  p.q = static_cast<const std::byte*>(ops.q) + piece.q_row * hq * d * es;
  p.k = static_cast<const std::byte*>(ops.k) + piece.k_row * hkv * d * es;
  p.v = static_cast<const std::byte*>(ops.v) + piece.k_row * hkv * d * es;
  const int64_t o_tokens = ops.o_tokens > 0 ? ops.o_tokens : nl;
  const int64_t o_row = ops.o_tokens > 0 ? piece.acc_row : piece.q_row;
  if (o_row < 0 || o_row + piece.q.size() > o_tokens) {
    return absl::InternalError("ring piece: query rows outside the accumulator's rows");
  }
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
  if (ops.cudnn != nullptr && piece.kind != RingPieceKind::kLayout &&
      piece.q.size() <= ops.scratch_rows && ops.scratch_o != nullptr &&
      ops.scratch_lse != nullptr) {
    CudnnSdpaPiece cp;
    cp.batch = b;
    cp.q_tokens = piece.q.size();
    cp.kv_tokens = piece.k.size();
    cp.q_heads = hq;
    cp.kv_heads = hkv;
    cp.head_dim = d;
    cp.q_batch_stride = nl * hq * d;
    cp.kv_batch_stride = ns * hkv * d;
    cp.causal = piece.kind == RingPieceKind::kCausalDiagonal;  // same range: top-left diagonal
    cp.scale = ops.scale;
    cp.dtype = ops.dtype;
    const absl::Status st =
        ops.cudnn->ForwardPiece(cp, p.q, p.k, p.v, ops.scratch_o, ops.scratch_lse, stream);
    if (st.ok()) {
      CUDA_RETURN_IF_ERROR(LaunchLseMergeInto(ops.dtype, ops.scratch_o, ops.scratch_lse,
                                              ops.o_acc + o_row * hq * d, ops.lse + piece.q_row,
                                              b, piece.q.size(), hq, d, o_tokens * hq * d,
                                              hq * nl, nl, stream));
      if (ran_on_cudnn != nullptr) *ran_on_cudnn = true;
      return absl::OkStatus();
    }
    if (!absl::IsUnimplemented(st)) return st;
    // Not covered by cuDNN (e.g. a single-token piece): the flash_fwd kernel below.
  }
#endif
  p.o = ops.o_acc + o_row * hq * d;
  p.lse = ops.lse + piece.q_row;
  p.accumulate = true;
  p.q_batch_stride = nl * hq * d;
  p.o_batch_stride = o_tokens * hq * d;
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

absl::Status RingCudaRank::Init(const RingCudaPlan& plan, const AttentionShape& shape,
                                DType dtype, float scale, int rank, int device,
                                const RingCudaOptions& options, CachingAllocator* alloc,
                                cudaStream_t stream) {
  device_ = device;  // the destructor switches to it
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError("ring (CUDA): device buffers must be bf16 or f16");
  }
  if (rank < 0 || rank >= plan.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring (CUDA): rank ", rank, " of ", plan.ranks, " does not match the plan"));
  }
  if (!CudaSupportsHeadDim(shape.head_dim)) {
    return absl::UnimplementedError(absl::StrCat(
        "shape.head_dim: the CUDA backend supports head dims 64 and 128, got ", shape.head_dim));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  plan_ = &plan;
  shape_ = shape;
  dtype_ = dtype;
  scale_ = scale;
  rank_ = rank;
  device_ = device;
  options_ = options;
  if (alloc == nullptr) {
    owned_alloc_ = std::make_unique<CachingAllocator>(device);
    alloc_ = owned_alloc_.get();
  } else {
    alloc_ = alloc;
  }
  if (stream == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    own_stream_ = true;
  } else {
    stream_ = stream;
    own_stream_ = false;
  }

  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t nl = plan.shard_tokens[rank];
  const int64_t nmax = plan.max_shard_tokens;
  CachingAllocator& a = *alloc_;
  auto make = [&a](int64_t bytes) {
    return DeviceBuffer::Create(a, std::max<int64_t>(bytes, 256));
  };
  // Allocation order and sizes: EstimateRingRankBytes (ring_cuda_plan.cc) mirrors them.
  ATTN_ASSIGN_OR_RETURN(q_, make(b * nl * hq * d * es));
  ATTN_ASSIGN_OR_RETURN(o_, make(b * nl * hq * d * es));
  ATTN_ASSIGN_OR_RETURN(lse_, make(b * hq * nl * 4));
  if (!lean()) {
    ATTN_ASSIGN_OR_RETURN(home_kv_, make(2 * b * nl * hkv * d * es));
    ATTN_ASSIGN_OR_RETURN(o_acc_, make(b * nl * hq * d * 4));
    for (int i = 0; i < std::min(2, plan.ranks - 1); ++i) {
      ATTN_ASSIGN_OR_RETURN(rot_kv_[i], make(2 * b * nmax * hkv * d * es));
    }
  } else {
    ATTN_ASSIGN_OR_RETURN(o_acc_, make(b * plan.max_q_chunk_tokens * hq * d * 4));
    const int nslots = plan.ranks == 1 ? plan.kv_pieces : plan.kv_pieces + 1;
    for (int i = 0; i < nslots; ++i) {
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer slot, make(2 * b * plan.max_kv_piece_tokens * hkv * d * es));
      slots_.push_back(std::move(slot));
    }
  }

  if (plan.cudnn_scratch_rows > 0) {
    // Sizes mirror AddCudnnScratch (ring_cuda_plan.cc); allocated even when libcudnn does not
    // load, so the rank's footprint is the plan's estimate either way.
    ATTN_ASSIGN_OR_RETURN(scratch_o_, make(b * plan.cudnn_scratch_rows * hq * d * es));
    ATTN_ASSIGN_OR_RETURN(scratch_lse_, make(b * hq * plan.cudnn_scratch_rows * 4));
    cudnn_ = SharedRingCudnn(device);
  }

  // Every layout piece of this rank's ticks, uploaded once.
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> col_idx;
  std::vector<uint8_t> mask;
  int64_t max_q_blocks = 1;
  const int64_t ticks = plan.ticks();
  piece_offsets_.assign(ticks, {});
  for (int64_t t = 0; t < ticks; ++t) {
    for (const RingPiece& piece : plan.steps[rank][t].pieces) {
      max_q_blocks = std::max(max_q_blocks, NumBlocks(piece.q.size(), plan.block_size));
      piece_offsets_[t].push_back(
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
  reverse_rows_len_ = max_q_blocks;
  ATTN_ASSIGN_OR_RETURN(row_ptr_, UploadSync(a, row_ptr));
  ATTN_ASSIGN_OR_RETURN(col_idx_, UploadSync(a, col_idx));
  ATTN_ASSIGN_OR_RETURN(mask_, UploadSync(a, mask));
  ATTN_ASSIGN_OR_RETURN(reverse_rows_, UploadSync(a, reverse));

  // cudaMemcpy from pageable memory runs on the legacy default stream, which the non-blocking
  // compute stream does not wait for: finish it here.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RingCudaRank>> RingCudaRank::Create(
    const RingCudaPlan& plan, const AttentionShape& shape, DType dtype, float scale, int rank,
    int device, std::shared_ptr<NcclGroup> group, const RingCudaOptions& options) {
  if (group == nullptr || group->size() != plan.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("ring (CUDA): rank ", rank, " of ", plan.ranks,
                                                   " does not match the plan or the group"));
  }
  std::unique_ptr<RingCudaRank> r(new RingCudaRank());
  ATTN_RETURN_IF_ERROR(r->Init(plan, shape, dtype, scale, rank, device, options, nullptr, nullptr));
  ForceNcclNvlsOff();
  NcclCommunicator::Options copts;
  copts.group = std::move(group);
  copts.rank = rank;
  copts.cuda_device = device;
  copts.compute_stream = r->stream_;
  copts.init_timeout = options.init_timeout;
  ATTN_ASSIGN_OR_RETURN(r->owned_comm_, NcclCommunicator::Create(copts));
  r->comm_ = r->owned_comm_.get();
  return r;
}

absl::StatusOr<std::unique_ptr<RingCudaRank>> RingCudaRank::Create(
    const RingCudaPlan& plan, const AttentionShape& shape, DType dtype, float scale, int rank,
    int device, NcclCommunicator& comm, CachingAllocator* alloc, cudaStream_t stream,
    const RingCudaOptions& options) {
  if (comm.size() != plan.ranks || comm.rank() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring (CUDA): communicator rank ", comm.rank(), " of ", comm.size(),
        " does not match rank ", rank, " of a ", plan.ranks, "-rank plan"));
  }
  if (alloc != nullptr && alloc->device() != device) {
    return absl::InvalidArgumentError(absl::StrCat("ring (CUDA): allocator of cuda:",
                                                   alloc->device(), " for rank on cuda:", device));
  }
  std::unique_ptr<RingCudaRank> r(new RingCudaRank());
  ATTN_RETURN_IF_ERROR(r->Init(plan, shape, dtype, scale, rank, device, options, alloc, stream));
  r->comm_ = &comm;
  r->borrowed_comm_stream_ = stream;
  comm.set_compute_stream(r->stream_);
  return r;
}

RingCudaRank::~RingCudaRank() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (owned_comm_ != nullptr) {
    owned_comm_.reset();  // its comm stream waits on nothing of ours any more
  } else if (comm_ != nullptr) {
    comm_->set_compute_stream(borrowed_comm_stream_);
  }
  comm_ = nullptr;
  for (DeviceBuffer* buf : {&q_, &home_kv_, &o_, &o_acc_, &lse_, &rot_kv_[0], &rot_kv_[1],
                            &row_ptr_, &col_idx_, &mask_, &reverse_rows_}) {
    buf->Reset();
  }
  slots_.clear();
  if (stream_ != nullptr && own_stream_) cudaStreamDestroy(stream_);
}

void* RingCudaRank::v() const {
  if (lean()) return nullptr;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  return static_cast<std::byte*>(home_kv_.get()) +
         shape_.batch * shard_tokens() * shape_.kv_heads * shape_.head_dim * es;
}

absl::Status RingCudaRank::SetKv(const void* k, const void* v) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // no queued work reads the old K/V
  const int64_t b = shape_.batch, nl = shard_tokens();
  const int64_t row = shape_.kv_heads * shape_.head_dim * static_cast<int64_t>(DTypeSize(dtype_));
  if (!lean()) {
    if (b * nl * row > 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpy(home_kv_.get(), k, b * nl * row, cudaMemcpyDefault));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(this->v(), v, b * nl * row, cudaMemcpyDefault));
    }
  } else {
    const int nslots = static_cast<int>(slots_.size());
    const std::vector<RingChunk>& pieces = plan_->kv_piece[rank_];
    for (int j = 0; j < static_cast<int>(pieces.size()); ++j) {
      const int64_t t = pieces[j].tokens;
      if (t == 0 || b == 0) continue;
      std::byte* dst = static_cast<std::byte*>(Slot((slot_base_ + j) % nslots));
      const std::byte* ks = static_cast<const std::byte*>(k) + pieces[j].row * row;
      const std::byte* vs = static_cast<const std::byte*>(v) + pieces[j].row * row;
      // Rows [row, row + t) of every batch (one copy per batch: a 2D copy's pitch is capped at
      // 2^31 bytes, which a long shard exceeds).
      for (int64_t bi = 0; bi < b; ++bi) {
        CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + bi * t * row, ks + bi * nl * row, t * row,
                                        cudaMemcpyDefault));
        CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + (b + bi) * t * row, vs + bi * nl * row, t * row,
                                        cudaMemcpyDefault));
      }
    }
  }
  // The copies ran on the legacy default stream; the rank's stream may be non-blocking.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

std::vector<std::pair<void*, int64_t>> RingCudaRank::HomeKv() const {
  std::vector<std::pair<void*, int64_t>> out;
  if (!lean()) {
    out.push_back({home_kv_.get(), KvBytes(rank_)});
  } else {
    const int nslots = static_cast<int>(slots_.size());
    for (int j = 0; j < plan_->kv_pieces; ++j) {
      out.push_back({Slot((slot_base_ + j) % nslots), PieceBytes(rank_, j)});
    }
  }
  return out;
}

int64_t RingCudaRank::KvBytes(int source) const {
  return 2 * shape_.batch * plan_->shard_tokens[source] * shape_.kv_heads * shape_.head_dim *
         static_cast<int64_t>(DTypeSize(dtype_));
}

int64_t RingCudaRank::PieceBytes(int source, int piece) const {
  return 2 * shape_.batch * plan_->kv_piece[source][piece].tokens * shape_.kv_heads *
         shape_.head_dim * static_cast<int64_t>(DTypeSize(dtype_));
}

absl::Status RingCudaRank::Run() {
  absl::Status s = lean() ? RunTicks() : RunSteps();
  if (!s.ok() && comm_ != nullptr) comm_->Abort(s);
  return s;
}

// Lean schedule (ring_cuda_plan.h): stream entry X_m lives in slot (slot_base_ + m) % (c + 1).
// Tick k reads X_k's slot, sends it to rank+1 and receives X_{k+c} into the slot of X_{k-1},
// whose compute (enqueued at tick k-1, before this transfer starts: the communicator orders the
// transfer after the compute stream's queued work) and send (waited at tick k-1) are done. The
// transfers run on every tick, also the last c: those bring the rank's own pieces X_T..X_{T+c-1}
// back (the stream has period P*c and T is a multiple of it), so after a run the home pieces are
// again in the slots, at base (slot_base_ + T) % (c + 1), and Run() can be repeated. P = 1: no
// transfers, slot j holds piece j for good.
absl::Status RingCudaRank::RunPiece(const RingPiece& piece, int64_t tick, size_t index,
                                   const void* k, const void* v, int64_t kv_tokens,
                                   int64_t o_tokens) {
  RingPieceOperands ops;
  ops.q = q_.get();
  ops.k = k;
  ops.v = v;
  ops.o_acc = o_acc_.as<float>();
  ops.lse = lse_.as<float>();
  ops.o_tokens = o_tokens;
  ops.q_tokens = shard_tokens();
  ops.kv_tokens = kv_tokens;
  ops.shape = shape_;
  ops.dtype = dtype_;
  ops.scale = scale_;
  ops.block_size = plan_->block_size;
  const auto [rp, ci] = piece_offsets_[tick][index];
  ops.row_ptr = row_ptr_.as<int64_t>() + rp;
  ops.col_idx = col_idx_.as<int32_t>() + ci;
  ops.block_mask = mask_.as<uint8_t>() + ci;
  const int64_t nb = NumBlocks(piece.q.size(), plan_->block_size);
  ops.reverse_rows = reverse_rows_.as<int32_t>() + (reverse_rows_len_ - nb);
  ops.cudnn = cudnn_;
  ops.scratch_o = scratch_o_.get();
  ops.scratch_lse = scratch_lse_.as<float>();
  ops.scratch_rows = plan_->cudnn_scratch_rows;
  bool on_cudnn = false;
  ATTN_RETURN_IF_ERROR(LaunchRingPiece(piece, ops, stream_, &on_cudnn));
  if (on_cudnn) ++cudnn_pieces_run_;
  return absl::OkStatus();
}

absl::Status RingCudaRank::RunTicks() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int P = plan_->ranks, c = plan_->kv_pieces;
  const int64_t T = plan_->ticks(), period = static_cast<int64_t>(P) * c;
  const int64_t b = shape_.batch, hq = shape_.q_heads, hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t nl = shard_tokens();
  const int nslots = static_cast<int>(slots_.size());
  auto slot_of = [&](int64_t m) -> int {
    return P == 1 ? static_cast<int>(m % c) : static_cast<int>((slot_base_ + m) % nslots);
  };
  bytes_sent_base_ = comm_->bytes_sent();
  bytes_received_base_ = comm_->bytes_received();
  steps_run_ = 0;
  cudnn_pieces_run_ = 0;
  CUDA_RETURN_IF_ERROR(LaunchFillFloat(lse_.as<float>(), -INFINITY, b * hq * nl, stream_));
  const WaitOptions wait{options_.transfer_timeout, options_.cancel};
  for (int64_t k = 0; k < T; ++k) {
    const RingStep& step = plan_->steps[rank_][k];
    const RingChunk& qch = plan_->q_chunk[rank_][step.q_chunk];
    if (k % period == 0 && qch.tokens > 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(o_acc_.get(), 0, b * qch.tokens * hq * d * 4, stream_));
    }
    PendingTransfer transfer;
    if (P > 1) {
      const int64_t m2 = (k + c) % period;
      const int src2 = static_cast<int>(((rank_ - m2 / c) % P + P) % P);
      ATTN_ASSIGN_OR_RETURN(
          transfer, comm_->StartSendRecv(Slot(slot_of(k)), PieceBytes(step.source, step.kv_piece),
                                         (rank_ + 1) % P, Slot(slot_of(k + c)),
                                         PieceBytes(src2, static_cast<int>(m2 % c)),
                                         (rank_ - 1 + P) % P));
    }
    const int64_t ns = plan_->kv_piece[step.source][step.kv_piece].tokens;
    const std::byte* kbase = static_cast<const std::byte*>(Slot(slot_of(k)));
    const std::byte* vbase = kbase + b * ns * hkv * d * es;
    for (size_t i = 0; i < step.pieces.size(); ++i) {
      const RingPiece& piece = step.pieces[i];
      ATTN_RETURN_IF_ERROR(RunPiece(piece, k, i, kbase, vbase, ns, qch.tokens));
    }
    if ((k + 1) % period == 0 && qch.tokens > 0) {
      // The chunk is final: its f32 rows -> O (input dtype), range by range, batch by batch.
      int64_t acc_row = 0;
      for (const TokenRange& r : qch.ranges) {
        const int64_t row = LocalRow(plan_->split[rank_], r.begin);
        for (int64_t bi = 0; bi < b && r.size() > 0; ++bi) {
          CUDA_RETURN_IF_ERROR(LaunchConvert(
              DType::kF32, o_acc_.as<float>() + (bi * qch.tokens + acc_row) * hq * d, dtype_,
              static_cast<std::byte*>(o_.get()) + (bi * nl + row) * hq * d * es,
              r.size() * hq * d, stream_));
        }
        acc_row += r.size();
      }
    }
    if (transfer.valid()) ATTN_RETURN_IF_ERROR(comm_->Wait(std::move(transfer), wait));
    ++steps_run_;
  }
  if (P > 1) slot_base_ = static_cast<int>((slot_base_ + T) % nslots);
  return absl::OkStatus();
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
  cudnn_pieces_run_ = 0;
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
      ATTN_RETURN_IF_ERROR(RunPiece(piece, t, i, kbase, vbase, ns, /*o_tokens=*/0));
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
  s.cudnn_pieces = cudnn_pieces_run_;
  s.q_chunks = plan_->q_chunks;
  s.kv_pieces = plan_->kv_pieces;
  s.estimated_device_bytes = EstimateRingRankBytes(*plan_, rank_, shape_, dtype_);
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

// ---- RingCudaRun ------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RingCudaRun>> RingCudaRun::Create(
    const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
    std::vector<int> devices, const RingCudaOptions& options) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, shape));
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
  if (const auto* dil = std::get_if<DilatedSpec>(&spec.pattern)) {
    // Shards cut on multiples of lcm(segment lengths) hold whole segments of every branch, and a
    // segment's queries attend only to its own keys, so each rank runs the single-GPU dilated
    // plan on each of its ranges with no communication. Segment structure is preserved: a range
    // starting at a multiple of every w_k sees segment t of the range as global segment
    // t + begin / w_k, with the same head offsets; only the range ending at N has short
    // segments, exactly where the global sequence has them.
    int64_t unit = 1;
    for (int64_t w : dil->segment_lengths) {
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
    run->dilated_split_ = SplitSequence(n, P, SplitKindFor(spec), unit);
  } else {
    RingCudaPlanOptions po = options.plan;
    if (options.piece_engine == RingPieceEngine::kAuto && RingCudnnPiecesWanted()) {
      po.cudnn_pieces = true;
    }
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
  // Dilated: the buffers of the largest range (q, k, v, o, lse), one range at a time; the
  // single-GPU plan's own workspace is not included.
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  int64_t total = 0;
  for (const TokenRange& r : dilated_split_[rank]) {
    const int64_t nq = shape_.batch * r.size() * shape_.q_heads * shape_.head_dim * es;
    const int64_t nkv = shape_.batch * r.size() * shape_.kv_heads * shape_.head_dim * es;
    total = std::max(total, 2 * RingAllocRound(nq) + 2 * RingAllocRound(nkv) +
                                RingAllocRound(shape_.batch * shape_.q_heads * r.size() * 4));
  }
  return total;
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
