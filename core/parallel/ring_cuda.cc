#include "core/parallel/ring_cuda.h"

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"
#include "core/cuda/pinned_host_pool.h"
#include "core/util/status_macros.h"
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve {
namespace {

// Appends `host` to the layout staging bytes at an 8-byte aligned offset; returns that offset.
template <typename T>
size_t AppendLayout(std::vector<std::byte>& bytes, const std::vector<T>& host) {
  const size_t at = (bytes.size() + 7) / 8 * 8;
  bytes.resize(at + host.size() * sizeof(T));
  if (!host.empty()) std::memcpy(bytes.data() + at, host.data(), host.size() * sizeof(T));
  return at;
}

}  // namespace

bool RingCudnnPiecesWanted(const CudaOptions& cuda) {
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
  return cuda.engine != AttentionEngine::kOwn;
#else
  (void)cuda;
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
  const int64_t hq = ops.shape.q_heads, hkv = ops.shape.kv_heads, d = ops.shape.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(ops.dtype));
  const int64_t nl = ops.q_tokens;
  const int64_t o_tokens = ops.o_tokens > 0 ? ops.o_tokens : nl;
  const int64_t o_row = ops.o_tokens > 0 ? piece.acc_row : piece.q_row;
  if (o_row < 0 || o_row + piece.q.size() > o_tokens) {
    return absl::InternalError("ring piece: query rows outside the accumulator's rows");
  }
  // The piece's first rows: query row q_row of the shard, key row k_row of the K/V piece, row
  // o_row of the accumulator; LSE rows are the shard's.
  FlashFwdTensors t;
  t.q = static_cast<const std::byte*>(ops.q) + piece.q_row * hq * d * es;
  t.k = static_cast<const std::byte*>(ops.k) + piece.k_row * hkv * d * es;
  t.v = static_cast<const std::byte*>(ops.v) + piece.k_row * hkv * d * es;
  t.o = ops.o_acc + o_row * hq * d;
  t.lse = ops.lse + piece.q_row;
  t.shape = ops.shape;
  t.shape.tokens = nl;
  t.kv_tokens = ops.kv_tokens;
  t.o_tokens = o_tokens;
  t.dtype = ops.dtype;
#if ATTNSERVE_HAVE_CUDNN_FRONTEND
  if (ops.cudnn != nullptr && piece.kind != RingPieceKind::kLayout &&
      piece.q.size() <= ops.scratch_rows && ops.scratch_o != nullptr &&
      ops.scratch_lse != nullptr) {
    CudnnSdpaPiece cp;
    cp.batch = ops.shape.batch;
    cp.q_tokens = piece.q.size();
    cp.kv_tokens = piece.k.size();
    cp.q_heads = hq;
    cp.kv_heads = hkv;
    cp.head_dim = d;
    cp.q_batch_stride = nl * hq * d;
    cp.kv_batch_stride = ops.kv_tokens * hkv * d;
    cp.causal = piece.kind == RingPieceKind::kCausalDiagonal;  // same range: top-left diagonal
    cp.scale = ops.scale;
    cp.dtype = ops.dtype;
    const absl::Status st =
        ops.cudnn->ForwardPiece(cp, t.q, t.k, t.v, ops.scratch_o, ops.scratch_lse, stream);
    if (st.ok()) {
      CUDA_RETURN_IF_ERROR(LaunchLseMergeInto(ops.dtype, ops.scratch_o, ops.scratch_lse,
                                              ops.o_acc + o_row * hq * d, ops.lse + piece.q_row,
                                              ops.shape.batch, piece.q.size(), hq, d,
                                              o_tokens * hq * d, hq * nl, nl, stream));
      if (ran_on_cudnn != nullptr) *ran_on_cudnn = true;
      return absl::OkStatus();
    }
    if (!absl::IsUnimplemented(st)) return st;
    // Not covered by cuDNN (e.g. a single-token piece): the flash_fwd kernel below.
  }
#endif
  FlashFwdRange range;
  range.q_len = piece.q.size();
  range.kv_len = piece.k.size();
  range.q_pos_offset = piece.q.begin;
  range.k_pos_offset = piece.k.begin;
  range.accumulate = true;
  FlashFwdLayoutView layout;
  layout.block_size = ops.block_size;
  switch (piece.kind) {
    case RingPieceKind::kFull:
      layout.kind = FlashFwdLayoutView::Kind::kDense;
      break;
    case RingPieceKind::kCausalDiagonal:
      layout.kind = FlashFwdLayoutView::Kind::kDenseCausal;
      layout.row_order = ops.reverse_rows;
      break;
    case RingPieceKind::kLayout:
      if (ops.row_ptr == nullptr || ops.col_idx == nullptr || ops.block_mask == nullptr) {
        return absl::InvalidArgumentError("ring piece: layout piece without a device CSR");
      }
      layout.kind = FlashFwdLayoutView::Kind::kCsr;
      layout.row_ptr = ops.row_ptr;
      layout.col_idx = ops.col_idx;
      layout.block_mask = ops.block_mask;
      layout.rule_causal = piece.layout.rule.causal;
      layout.rule_window = piece.layout.rule.window ? *piece.layout.rule.window : -1;
      break;
  }
  return RunAttentionForward(BuildFlashFwdParams(t, range, layout, ops.scale), ops.flash, stream);
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

  // Every buffer the rank holds is a row of its buffer table, the one EstimateRingRankBytes sums.
  const RingRankBuffers table = RingRankBufferTable(plan, rank, shape, dtype);
  CachingAllocator& a = *alloc_;
  ATTN_ASSIGN_OR_RETURN(q_, DeviceBuffer::Create(a, table.q));
  ATTN_ASSIGN_OR_RETURN(o_, DeviceBuffer::Create(a, table.o));
  ATTN_ASSIGN_OR_RETURN(lse_, DeviceBuffer::Create(a, table.lse));
  ATTN_ASSIGN_OR_RETURN(o_acc_, DeviceBuffer::Create(a, table.o_acc));
  for (int64_t bytes : table.kv_slots) {
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer slot, DeviceBuffer::Create(a, bytes));
    slots_.push_back(std::move(slot));
    slot_buffer_.push_back(static_cast<int>(slot_buffer_.size()));
  }
  if (table.cudnn_o > 0) {
    // Allocated even when libcudnn does not load, so the rank's footprint is the plan's estimate
    // either way.
    ATTN_ASSIGN_OR_RETURN(scratch_o_, DeviceBuffer::Create(a, table.cudnn_o));
    ATTN_ASSIGN_OR_RETURN(scratch_lse_, DeviceBuffer::Create(a, table.cudnn_lse));
    if (options.cuda.engine != AttentionEngine::kOwn) cudnn_ = SharedRingCudnn(device);
  }

  // Every layout piece of this rank's ticks, uploaded once (stream-ordered before the ticks).
  return UploadLayouts(table);
}

absl::Status RingCudaRank::UploadLayouts(const RingRankBuffers& table) {
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> col_idx;
  std::vector<uint8_t> mask;
  int64_t max_q_blocks = 1;
  const int64_t ticks = plan_->ticks();
  piece_offsets_.assign(ticks, {});
  for (int64_t t = 0; t < ticks; ++t) {
    for (const RingPiece& piece : plan_->steps[rank_][t].pieces) {
      max_q_blocks = std::max(max_q_blocks, NumBlocks(piece.q.size(), plan_->block_size));
      piece_offsets_[t].push_back(
          {static_cast<int64_t>(row_ptr.size()), static_cast<int64_t>(col_idx.size())});
      if (piece.kind != RingPieceKind::kLayout) continue;
      if (piece.layout.tile != plan_->block_size) {
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
  if (static_cast<int64_t>(row_ptr.size() * sizeof(int64_t)) > table.row_ptr ||
      static_cast<int64_t>(col_idx.size() * sizeof(int32_t)) > table.col_idx ||
      static_cast<int64_t>(mask.size()) > table.mask ||
      static_cast<int64_t>(reverse.size() * sizeof(int32_t)) > table.reverse_rows) {
    return absl::InternalError("ring (CUDA): layout data larger than its planned buffer");
  }
  std::vector<std::byte> bytes;
  const size_t at[4] = {AppendLayout(bytes, row_ptr), AppendLayout(bytes, col_idx),
                        AppendLayout(bytes, mask), AppendLayout(bytes, reverse)};
  const size_t len[4] = {row_ptr.size() * sizeof(int64_t), col_idx.size() * sizeof(int32_t),
                         mask.size(), reverse.size() * sizeof(int32_t)};
  CachingAllocator& a = *alloc_;
  ATTN_ASSIGN_OR_RETURN(row_ptr_, DeviceBuffer::Create(a, table.row_ptr));
  ATTN_ASSIGN_OR_RETURN(col_idx_, DeviceBuffer::Create(a, table.col_idx));
  ATTN_ASSIGN_OR_RETURN(mask_, DeviceBuffer::Create(a, table.mask));
  ATTN_ASSIGN_OR_RETURN(reverse_rows_, DeviceBuffer::Create(a, table.reverse_rows));
  // One page-locked block for all four, held until the destructor synchronized the stream (the
  // copies run on the rank's stream, ahead of every tick).
  const int64_t words = static_cast<int64_t>(bytes.size() + 3) / 4;  // f32 words: no byte dtype
  ATTN_ASSIGN_OR_RETURN(layout_stage_, PinnedHostTensor(DType::kF32, {words}));
  if (!bytes.empty()) std::memcpy(layout_stage_.data(), bytes.data(), bytes.size());
  DeviceBuffer* dst[4] = {&row_ptr_, &col_idx_, &mask_, &reverse_rows_};
  for (int i = 0; i < 4; ++i) {
    ATTN_RETURN_IF_ERROR(CopyToDevice(dst[i]->get(), layout_stage_.data() + at[i], len[i], stream_,
                                      options_.copy_counters));
  }
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
  for (DeviceBuffer* buf : {&q_, &o_, &o_acc_, &lse_, &scratch_o_, &scratch_lse_, &row_ptr_,
                            &col_idx_, &mask_, &reverse_rows_}) {
    buf->Reset();
  }
  slots_.clear();
  if (stream_ != nullptr && own_stream_) cudaStreamDestroy(stream_);
}

void* RingCudaRank::v() const {
  if (lean()) return nullptr;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  return static_cast<std::byte*>(Slot(0)) +
         shape_.batch * shard_tokens() * shape_.kv_heads * shape_.head_dim * es;
}

absl::Status RingCudaRank::SetKv(const void* k, const void* v) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  // The shard itself: batch item bi's rows are rows [bi * nl, (bi + 1) * nl) of k and v.
  const std::vector<ShardRowBlock> blocks =
      ShardRowBlocks({TokenRange{0, shard_tokens()}}, shape_.batch, shard_tokens());
  // cudaMemcpyDefault: k and v may be host or device memory (not counted: not a request path).
  RingCopyQueue queue(cudaMemcpyDefault, stream_, nullptr);
  ATTN_RETURN_IF_ERROR(CopyKvRows(KvPart::kK, k, blocks, queue));
  ATTN_RETURN_IF_ERROR(CopyKvRows(KvPart::kV, v, blocks, queue));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status RingCudaRank::EnqueueKvRows(KvPart part, const void* rows,
                                         const std::vector<ShardRowBlock>& blocks) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  RingCopyQueue queue(cudaMemcpyHostToDevice, stream_, options_.copy_counters);
  return CopyKvRows(part, rows, blocks, queue);
}

// Every schedule starts a run with the rank's own piece j in slot j, packed [K_j | V_j] of
// [B, t_j, Hkv, D] each: piece j's rows of batch item bi are shard rows [row_j, row_j + t_j).
// Stream-ordered on stream_ after any queued work that reads the slots (the communicator's
// transfers are waited for on stream_ too).
absl::Status RingCudaRank::CopyKvRows(KvPart part, const void* rows,
                                      const std::vector<ShardRowBlock>& blocks,
                                      RingCopyQueue& queue) {
  const int64_t b = shape_.batch;
  const int64_t row = shape_.kv_heads * shape_.head_dim * static_cast<int64_t>(DTypeSize(dtype_));
  const std::byte* src = static_cast<const std::byte*>(rows);
  const std::vector<RingChunk>& pieces = plan_->kv_piece[rank_];
  for (int j = 0; j < static_cast<int>(pieces.size()); ++j) {
    const int64_t t = pieces[j].tokens, begin = pieces[j].row;
    if (t == 0 || b == 0) continue;
    std::byte* dst = static_cast<std::byte*>(Slot(j)) + (part == KvPart::kV ? b * t * row : 0);
    for (const ShardRowBlock& blk : blocks) {
      // The block's rows that fall in piece j.
      const int64_t lo = std::max(begin, blk.local_row);
      const int64_t hi = std::min(begin + t, blk.local_row + blk.tokens);
      if (lo >= hi) continue;
      ATTN_RETURN_IF_ERROR(queue.Add(dst + (blk.batch * t + lo - begin) * row,
                                     src + (blk.host_row + lo - blk.local_row) * row,
                                     (hi - lo) * row));
    }
    // Slots are separate allocations: never merge a copy across two of them.
    ATTN_RETURN_IF_ERROR(queue.Flush());
  }
  return absl::OkStatus();
}

std::vector<std::pair<void*, int64_t>> RingCudaRank::HomeKv() const {
  std::vector<std::pair<void*, int64_t>> out;
  for (int j = 0; j < plan_->kv_pieces; ++j) out.push_back({Slot(j), PieceBytes(rank_, j)});
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
  absl::Status s = RunTicks();
  if (!s.ok() && comm_ != nullptr) comm_->Abort(s);
  return s;
}

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
  ops.flash = options_.cuda.flash;
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

absl::Status RingCudaRank::FinishChunk(const RingChunk& chunk) {
  const int64_t b = shape_.batch, hq = shape_.q_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t nl = shard_tokens();
  if (chunk.tokens == nl) {  // the chunk is the whole shard: its rows are the shard's rows
    CUDA_RETURN_IF_ERROR(
        LaunchConvert(DType::kF32, o_acc_.get(), dtype_, o_.get(), b * nl * hq * d, stream_));
    return absl::OkStatus();
  }
  // Range by range, batch by batch: the chunk's rows are its ranges concatenated.
  int64_t acc_row = 0;
  for (const TokenRange& r : chunk.ranges) {
    const int64_t row = LocalRow(plan_->split[rank_], r.begin);
    for (int64_t bi = 0; bi < b && r.size() > 0; ++bi) {
      CUDA_RETURN_IF_ERROR(LaunchConvert(
          DType::kF32, o_acc_.as<float>() + (bi * chunk.tokens + acc_row) * hq * d, dtype_,
          static_cast<std::byte*>(o_.get()) + (bi * nl + row) * hq * d * es, r.size() * hq * d,
          stream_));
    }
    acc_row += r.size();
  }
  return absl::OkStatus();
}

// The one executor of the schedule (ring_schedule.h). A tick's transfer is started before its
// compute is enqueued: the communicator orders the transfer after the compute stream's queued
// work, so the slot it receives into (whose last compute was enqueued at an earlier tick) is free
// by then, and the slot it sends is only read. After the run the schedule's next_run_slot says
// where the home K/V lies for the next one.
absl::Status RingCudaRank::RunTicks() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int64_t b = shape_.batch, hq = shape_.q_heads, hkv = shape_.kv_heads, d = shape_.head_dim;
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t nl = shard_tokens();
  bytes_sent_base_ = comm_->bytes_sent();
  bytes_received_base_ = comm_->bytes_received();
  steps_run_ = 0;
  cudnn_pieces_run_ = 0;
  CUDA_RETURN_IF_ERROR(LaunchFillFloat(lse_.as<float>(), -INFINITY, b * hq * nl, stream_));
  const WaitOptions wait{options_.transfer_timeout, options_.cancel};
  const std::vector<RingTick>& ticks = plan_->rank_ticks[rank_];
  for (int64_t k = 0; k < static_cast<int64_t>(ticks.size()); ++k) {
    const RingTick& tick = ticks[k];
    const RingChunk& qch = plan_->q_chunk[rank_][tick.q_chunk];
    if (tick.chunk_begins && qch.tokens > 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(o_acc_.get(), 0, b * qch.tokens * hq * d * 4, stream_));
    }
    PendingTransfer transfer;
    if (tick.send.valid()) {
      ATTN_ASSIGN_OR_RETURN(
          transfer,
          comm_->StartSendRecv(Slot(tick.send.slot), PieceBytes(tick.send.source, tick.send.piece),
                               tick.send.peer, Slot(tick.recv.slot),
                               PieceBytes(tick.recv.source, tick.recv.piece), tick.recv.peer));
    }
    const int64_t ns = plan_->kv_piece[tick.source][tick.kv_piece].tokens;
    const std::byte* kbase = static_cast<const std::byte*>(Slot(tick.slot));
    const std::byte* vbase = kbase + b * ns * hkv * d * es;
    const std::vector<RingPiece>& pieces = plan_->steps[rank_][k].pieces;
    for (size_t i = 0; i < pieces.size(); ++i) {
      ATTN_RETURN_IF_ERROR(RunPiece(pieces[i], k, i, kbase, vbase, ns, qch.tokens));
    }
    if (tick.chunk_ends && qch.tokens > 0) ATTN_RETURN_IF_ERROR(FinishChunk(qch));
    if (transfer.valid()) ATTN_RETURN_IF_ERROR(comm_->Wait(std::move(transfer), wait));
    ++steps_run_;
  }
  std::vector<int> next(slot_buffer_.size());
  for (size_t i = 0; i < next.size(); ++i) next[i] = slot_buffer_[plan_->next_run_slot[i]];
  slot_buffer_ = std::move(next);
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

}  // namespace attnserve
