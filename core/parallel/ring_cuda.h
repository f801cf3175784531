// Ring attention over GPUs: the sequence is split over P devices (ring_cuda_plan.h), each device
// keeps its query shard while the K/V shards travel around the ring over NCCL, and every step's
// flash_fwd launches LSE-merge straight into the device's float32 O/LSE accumulators (the
// kernel's accumulate epilogue), so a step needs no merge kernel. One host thread per GPU; only
// that thread touches its device, streams and communicator (docs/DESIGN.md, "Threads and
// ownership"). Built only with CUDA and NCCL (ATTNSERVE_HAVE_NCCL).
//
// One executor follows the shared ring schedule (ring_schedule.h, as RingCudaPlan): per tick,
// start the tick's K/V transfer on the communicator's stream (one packed [K | V] piece, so one
// send/recv pair per tick), enqueue the tick's pieces on the compute stream, convert a query
// chunk's rows into O when the chunk is final, wait for the transfer. Which slot is read, sent and
// received is the schedule's; the executor only maps schedule slots onto its buffers, and Run()
// can be repeated (benchmarks) without reloading inputs: both CUDA slot policies leave the home
// K/V in place (keep-home) or bring it back (restore-home, next_run_slot).
//
// Device memory per rank, in units of one bf16 tensor of N/P tokens (RingRankBufferTable lists
// the buffers, which Init allocates and EstimateRingRankBytes sums, allocator rounding included):
// - (q_chunks, kv_pieces) = (1, 1), keep-home: Q 1 + O 1 + f32 O 2 + K/V 2 * (1 + min(2, P-1))
//   + LSE + layouts; at P = 2 that is 8 units, as much as one GPU holding the whole sequence
//   (Q, K, V, O of N tokens = 4 units of N), so it only pays off in time.
// - the lean schedule, picked by the plan when RingCudaPlanOptions::device_memory_budget is below
//   (1, 1)'s need: Q 1 + O 1 + f32 O of one query chunk 2/qc + K/V in c + 1 piece slots 2(c+1)/c
//   + LSE + layouts; (16, 16) is ~4.25 units, so 2 GPUs hold ~1.88x the sequence of one under the
//   same per-GPU budget. NCCL bytes grow with qc (each query chunk sees the whole K/V
//   circulation); each tick's transfer still overlaps its compute.
#ifndef ATTNSERVE_CORE_PARALLEL_RING_CUDA_H_
#define ATTNSERVE_CORE_PARALLEL_RING_CUDA_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/engine/types.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/host_copy.h"
#include "core/parallel/nccl_communicator.h"
#include "core/parallel/ring_cuda_plan.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

class CudnnSdpa;  // core/cuda/cudnn_sdpa (only when built with the cuDNN path)

// Which kernel runs a ring's unmasked (kFull) and diagonal (kCausalDiagonal) pieces: cuDNN's
// fused kernel when this build has the cuDNN path, libcudnn loads and cuda.engine is not kOwn
// (the single-GPU engine choice); flash_fwd otherwise, and for every piece cuDNN does not cover.
// Window and block-sparse pieces always run on flash_fwd.
//
// True when RingCudaRun plans cuDNN pieces for `cuda` (the build has the cuDNN path and the
// engine is not kOwn); whether libcudnn loads is known only on the device (then flash_fwd runs).
bool RingCudnnPiecesWanted(const CudaOptions& cuda);

struct RingCudaOptions {
  RingCudaPlanOptions plan;  // kernel block size for dense/window; RingCudaRun sets cudnn_pieces
  CudaOptions cuda;          // engine (cuDNN pieces or not) and flash kernel choice
  absl::Duration transfer_timeout = absl::Seconds(120);
  absl::Duration init_timeout = absl::Seconds(120);
  const std::atomic<bool>* cancel = nullptr;  // polled while waiting for transfers
  // Every rank's host <-> device copies (CopyToDevice / CopyToHost), for metrics and tests; may
  // be null. Shared by the ranks (the counters are atomic).
  HostCopyCounters* copy_counters = nullptr;
};

// ---- Host copies of the GPU ring (and the dilated composition) ---------------------------------
// Every host buffer the ring copies from or to is page-locked: the request's own tensors when they
// are (the server's are), else a staging block of ProcessPinnedHostPool(); the ring's outputs and
// bf16 conversions come from that pool. Copies are asynchronous on the rank's stream.

// Rows [local_row, local_row + tokens) of batch item `batch` of a rank's shard are rows
// [host_row, host_row + tokens) of a host array of token rows (a [B, N, H, D] tensor is B * N
// rows of H * D elements).
struct ShardRowBlock {
  int64_t batch = 0;
  int64_t local_row = 0;
  int64_t tokens = 0;
  int64_t host_row = 0;
};
// Where a shard made of `ranges` (concatenated in order) lies in a [batch, n, H, D] tensor: one
// block per (batch item, non-empty range).
std::vector<ShardRowBlock> ShardRowBlocks(const std::vector<TokenRange>& ranges, int64_t batch,
                                          int64_t n);

// Queues copies on a stream, merging a copy that continues the previous one on both sides into
// it (the row blocks of consecutive ranges or batch items become one copy). Host -> device and
// device -> host copies go through CopyToDevice / CopyToHost (counted in `counters`, may be
// null); other kinds through cudaMemcpyAsync. Flush() after the last Add; the memory named must
// stay valid until the stream is synchronized.
class RingCopyQueue {
 public:
  RingCopyQueue(cudaMemcpyKind kind, cudaStream_t stream, HostCopyCounters* counters)
      : kind_(kind), stream_(stream), counters_(counters) {}
  absl::Status Add(void* dst, const void* src, size_t bytes);
  absl::Status Flush();

 private:
  const cudaMemcpyKind kind_;
  const cudaStream_t stream_;
  HostCopyCounters* const counters_;
  std::byte* dst_ = nullptr;
  const std::byte* src_ = nullptr;
  size_t bytes_ = 0;
};

// A host tensor in page-locked memory from ProcessPinnedHostPool() (pageable only when the pool
// is over its cap, which the pool counts).
absl::StatusOr<HostTensor> PinnedHostTensor(DType dtype, std::vector<int64_t> dims);
// Whether the device can copy `t` asynchronously (page-locked: pool memory or registered).
bool CopiesAsync(const HostTensor& t);

// Per-rank figures of one run.
struct RingCudaRankStats {
  int device = 0;
  int64_t steps = 0;
  int64_t pieces = 0;          // kernel launches (one per computed piece)
  int64_t skipped_pieces = 0;  // pieces with nothing admitted
  int64_t admitted_pairs = 0;  // summed over batch and query heads
  int64_t bytes_sent = 0;      // NCCL bytes, this rank, this run
  int64_t bytes_received = 0;
  int64_t peak_device_bytes = 0;  // caching allocator peak
  int64_t cudnn_pieces = 0;       // pieces run on cuDNN's fused kernel (the rest: flash_fwd)
  int q_chunks = 1;               // schedule chosen by the plan (ring_cuda_plan.h)
  int kv_pieces = 1;
  int64_t estimated_device_bytes = 0;  // EstimateRingRankBytes for this rank
};

// Device operands of one piece launch. q/k/v point at local row 0 of their shards
// ([B, q_tokens, Hq, D] and [B, kv_tokens, Hkv, D]); o_acc [B, q_tokens, Hq, D] f32 and
// lse [B, Hq, q_tokens] f32 are the accumulators the launch LSE-merges into.
struct RingPieceOperands {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  float* o_acc = nullptr;
  float* lse = nullptr;
  // o_tokens > 0: o_acc holds one query chunk's rows (lean schedule, [B, o_tokens, Hq, D]) and a
  // piece writes at its acc_row; 0: o_acc holds the whole shard and a piece writes at its q_row.
  int64_t o_tokens = 0;
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;
  AttentionShape shape;  // batch, heads, head dim (tokens unused)
  DType dtype = DType::kBF16;
  float scale = 0.f;
  int32_t block_size = 128;
  FlashKernelOptions flash;  // which flash_fwd kernel runs the launch
  // kLayout pieces: the piece's CSR on the device (row_ptr relative to col_idx).
  const int64_t* row_ptr = nullptr;
  const int32_t* col_idx = nullptr;
  const uint8_t* block_mask = nullptr;
  // kCausalDiagonal pieces: optional [nb-1, ..., 0] row order (heavy rows first), or null.
  const int32_t* reverse_rows = nullptr;
  // kFull / kCausalDiagonal pieces on cuDNN (null: flash_fwd for every piece): the piece's O and
  // LSE go to the scratch ([B, rows, Hq, D] in dtype, [B, Hq, rows] f32), then are LSE-merged
  // into o_acc / lse. A piece cuDNN does not cover (or with more rows) runs on flash_fwd.
  CudnnSdpa* cudnn = nullptr;
  void* scratch_o = nullptr;
  float* scratch_lse = nullptr;
  int64_t scratch_rows = 0;
};

// Enqueues `piece` on `stream`, merged into the accumulators: cuDNN + LSE merge when ops.cudnn is
// set and covers the piece (*ran_on_cudnn = true), else the flash_fwd launch in accumulate mode.
absl::Status LaunchRingPiece(const RingPiece& piece, const RingPieceOperands& ops,
                             cudaStream_t stream, bool* ran_on_cudnn = nullptr);

// One rank of a CUDA ring, owned by and used only from its worker thread. Its device buffers are
// public so that callers (the host API below, benchmarks) fill inputs and read outputs directly.
class RingCudaRank {
 public:
  // Collective: every rank of `group` calls it on its own thread at about the same time (NCCL
  // init). Sets the thread's device. `plan` must outlive the rank. dtype: bf16 or f16.
  static absl::StatusOr<std::unique_ptr<RingCudaRank>> Create(
      const RingCudaPlan& plan, const AttentionShape& shape, DType dtype, float scale, int rank,
      int device, std::shared_ptr<NcclGroup> group, const RingCudaOptions& options);
  // Borrowed resources (the service's per-device worker): `comm` is rank `rank` of a group of
  // plan.ranks (its compute stream is set to the rank's stream while the rank lives); `alloc`
  // null: a private allocator; `stream` null: a private stream. All must outlive the rank. Not
  // collective (the communicator already exists).
  static absl::StatusOr<std::unique_ptr<RingCudaRank>> Create(
      const RingCudaPlan& plan, const AttentionShape& shape, DType dtype, float scale, int rank,
      int device, NcclCommunicator& comm, CachingAllocator* alloc, cudaStream_t stream,
      const RingCudaOptions& options);
  ~RingCudaRank();  // synchronizes the stream, then frees everything (owning thread only)

  // Inputs, [B, shard_tokens, H, D] in dtype, the rank's ranges concatenated in ascending order.
  // q() is written directly. K/V: SetKv (any schedule); k()/v() point at the home shard only in
  // the (1, 1) schedule (null otherwise: the lean schedule stores K/V as pieces in its slots).
  void* q() const { return q_.get(); }
  void* k() const { return lean() ? nullptr : Slot(0); }
  void* v() const;
  // Copies the rank's K and V shards ([B, shard_tokens, Hkv, D] in dtype, host or device memory,
  // cudaMemcpyDefault) into the home K/V storage on stream(), synchronously. Run() restores the
  // home K/V before it returns (every schedule), so repeated runs need SetKv only once.
  absl::Status SetKv(const void* k, const void* v);
  // Enqueues on stream() the copies of the rank's K (or V) rows into the home K/V storage from
  // host rows of Hkv * D elements in dtype: `blocks` say where each of the shard's rows lies in
  // `rows` (ShardRowBlocks). Counted in options.copy_counters. Asynchronous when `rows` is
  // page-locked; it must stay valid until stream() is synchronized. Use before Run(), like SetKv.
  enum class KvPart { kK, kV };
  absl::Status EnqueueKvRows(KvPart part, const void* rows,
                             const std::vector<ShardRowBlock>& blocks);
  bool lean() const { return plan_->q_chunks > 1 || plan_->kv_pieces > 1; }
  // The home K/V storage as (device pointer, bytes): (1, 1) one entry [K | V] of the shard; lean
  // one per piece j, [K_j | V_j] of [B, t_j, Hkv, D] each. For filling inputs on the device
  // (benchmarks); valid until the next Run().
  std::vector<std::pair<void*, int64_t>> HomeKv() const;
  // Outputs after Run (stream-ordered on stream()): O [B, shard_tokens, Hq, D] in dtype and
  // LSE [B, Hq, shard_tokens] f32.
  void* o() const { return o_.get(); }
  float* lse() const { return lse_.as<float>(); }
  int64_t shard_tokens() const { return plan_->shard_tokens[rank_]; }
  const std::vector<TokenRange>& ranges() const { return plan_->split[rank_]; }
  cudaStream_t stream() const { return stream_; }
  CachingAllocator& allocator() { return *alloc_; }

  // Runs the plan's ticks (P steps in the (1, 1) schedule). Returns once the last transfer was
  // waited for and every kernel is enqueued; synchronize stream() before reading the outputs. A
  // failure aborts the group.
  absl::Status Run();
  RingCudaRankStats stats() const;

 private:
  RingCudaRank() = default;
  absl::Status Init(const RingCudaPlan& plan, const AttentionShape& shape, DType dtype,
                    float scale, int rank, int device, const RingCudaOptions& options,
                    CachingAllocator* alloc, cudaStream_t stream);
  absl::Status RunTicks();
  // Enqueues the conversion of a final query chunk's f32 rows into O (input dtype).
  absl::Status FinishChunk(const RingChunk& chunk);
  // Piece `index` of tick `tick` against the K/V at k/v (kv_tokens rows), merged into the
  // accumulators: o_acc covers o_tokens rows (lean: one query chunk) or, for 0, the whole shard.
  absl::Status RunPiece(const RingPiece& piece, int64_t tick, size_t index, const void* k,
                        const void* v, int64_t kv_tokens, int64_t o_tokens);
  int64_t PieceBytes(int source, int piece) const;  // packed [K | V] bytes of a K/V piece
  // The buffer of schedule slot i (slots move between buffers from run to run: slot_buffer_).
  void* Slot(int i) const { return slots_[slot_buffer_[i]].get(); }
  int64_t KvBytes(int source) const;  // packed [K | V] bytes of source's shard
  // Queues the copies of EnqueueKvRows into `queue` (its kind and counters).
  absl::Status CopyKvRows(KvPart part, const void* rows, const std::vector<ShardRowBlock>& blocks,
                          RingCopyQueue& queue);
  // Uploads the layout pieces of the rank's ticks through one page-locked staging block.
  absl::Status UploadLayouts(const RingRankBuffers& table);

  const RingCudaPlan* plan_ = nullptr;
  AttentionShape shape_;
  DType dtype_ = DType::kBF16;
  float scale_ = 0.f;
  int rank_ = 0;
  int device_ = 0;
  RingCudaOptions options_;
  std::unique_ptr<CachingAllocator> owned_alloc_;
  CachingAllocator* alloc_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = true;
  cudaStream_t borrowed_comm_stream_ = nullptr;  // restored as comm's compute stream at exit
  DeviceBuffer q_, o_, o_acc_, lse_;
  // cuDNN pieces (plan.cudnn_scratch_rows > 0): the device's shared engine (null when libcudnn
  // did not load: flash_fwd runs every piece) and the piece scratch.
  CudnnSdpa* cudnn_ = nullptr;
  DeviceBuffer scratch_o_, scratch_lse_;
  int64_t cudnn_pieces_run_ = 0;
  // K/V buffers, one per schedule slot (RingSchedule::slot_tokens); schedule slot i of the next
  // run lives in slots_[slot_buffer_[i]] (the restore-home policy rotates them, next_run_slot).
  std::vector<DeviceBuffer> slots_;
  std::vector<int> slot_buffer_;
  // Layout pieces of every step, concatenated: row_ptr (int64, relative to the piece's col_idx),
  // col_idx (int32), mask (uint8); per piece the offsets into them.
  DeviceBuffer row_ptr_, col_idx_, mask_, reverse_rows_;
  HostTensor layout_stage_;  // page-locked source of their upload, held until the stream syncs
  std::vector<std::vector<std::pair<int64_t, int64_t>>> piece_offsets_;  // [step][piece]
  int64_t reverse_rows_len_ = 0;
  std::unique_ptr<NcclCommunicator> owned_comm_;
  NcclCommunicator* comm_ = nullptr;
  int64_t bytes_sent_base_ = 0, bytes_received_base_ = 0;
  int64_t steps_run_ = 0;
};

// One GPU ring computation over host tensors, driven rank by rank (RingAttentionCuda below runs
// every rank on a thread of its own; the service runs each rank on its device's worker thread).
class RingCudaRun {  // one GPU ring computation over host tensors
 public:
  // Validates and plans on any thread; inputs must outlive every RunRank. devices[i] = CUDA
  // ordinal of rank i. f32 inputs compute in bf16 (page-locked copies are made here); O comes
  // back in the input dtype, O and LSE in page-locked memory. RESOURCE_EXHAUSTED when
  // options.plan.device_memory_budget is set and no schedule fits it.
  static absl::StatusOr<std::unique_ptr<RingCudaRun>> Create(
      const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
      std::vector<int> devices, const RingCudaOptions& options = {});
  int ranks() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_[rank]; }
  int64_t EstimateRankBytes(int rank) const;  // device bytes RunRank(rank) will hold at peak
  // On the thread that owns devices[rank] (sets the device): uploads the rank's shard, runs,
  // downloads its part of O/LSE into the run's host outputs, all asynchronously on the rank's
  // stream (straight from and to the tensors' rows where they are page-locked, else through
  // page-locked staging; "Host copies" above), synchronized before it returns. `comm` is a
  // borrowed NCCL communicator of rank `rank` in a group of ranks() (may be cached across runs
  // by the caller); `alloc` a borrowed allocator for that device (null: a private one); `stream`
  // the worker's stream (null: a private one). A failure aborts comm's group. Dilated specs run
  // the shard-local path and do not use comm. Ranks may run concurrently (each writes only its
  // rows). The rank's host copies are counted in `copies` (the device's counters, when run as a
  // device task), else in options.copy_counters.
  absl::Status RunRank(int rank, NcclCommunicator& comm, CachingAllocator* alloc = nullptr,
                       cudaStream_t stream = nullptr, HostCopyCounters* copies = nullptr);
  absl::StatusOr<AttentionOutputs> TakeOutputs();  // after all ranks returned OK
  std::vector<RingCudaRankStats> stats() const;     // incl. chosen q_chunks, kv_pieces
  const RingCudaPlan* plan() const { return plan_ ? &*plan_ : nullptr; }  // null for dilated

 private:
  friend absl::StatusOr<AttentionOutputs> RingAttentionCuda(const AttentionSpec&,
                                                            const HostTensor&, const HostTensor&,
                                                            const HostTensor&, std::vector<int>,
                                                            const RingCudaOptions&,
                                                            std::vector<RingCudaRankStats>*);
  RingCudaRun() = default;
  absl::Status RunRankImpl(int rank, NcclCommunicator* comm, CachingAllocator* alloc,
                           cudaStream_t stream, HostCopyCounters* copies);
  absl::Status RunDilatedRank(int rank, CachingAllocator* alloc, cudaStream_t stream,
                              HostCopyCounters* copies);
  // One range of a dilated rank: its single-GPU plan over [B, range, H, D], synchronized.
  absl::Status RunDilatedPart(const TokenRange& range, CachingAllocator& alloc,
                              cudaStream_t stream, HostCopyCounters* copies);

  AttentionSpec spec_;
  const HostTensor* q_ = nullptr;
  const HostTensor* k_ = nullptr;
  const HostTensor* v_ = nullptr;
  HostTensor q16_, k16_, v16_;  // bf16 copies of f32 inputs
  DType in_dtype_ = DType::kBF16;
  AttentionShape shape_;
  std::vector<int> devices_;
  RingCudaOptions options_;
  std::optional<RingCudaPlan> plan_;                   // absent for dilated specs
  std::vector<std::vector<TokenRange>> dilated_split_;  // dilated specs
  float scale_ = 0.f;
  AttentionOutputs out_;  // in the compute dtype (bf16/f16)
  std::vector<RingCudaRankStats> stats_;
  std::vector<char> done_;
  bool taken_ = false;
};

// Host tensors in and out: q [B, N, Hq, D], k/v [B, N, Hkv, D] (f32, f16 or bf16; f32 computes
// in bf16), one ring rank per entry of `devices` (each on its own thread). Returns O in the input
// dtype and LSE [B, Hq, N]. `stats` (optional) receives one entry per rank.
// Dilated specs need no ring: shards are cut on multiples of lcm(segment_lengths), so every
// segment lies in one shard, and each device runs the single-GPU dilated plan on its shards with
// no transfers (stats then count nothing). UNIMPLEMENTED when there are fewer such units than
// devices (segments would have to cross GPUs): callers fall back to single-GPU/data-parallel.
absl::StatusOr<AttentionOutputs> RingAttentionCuda(const AttentionSpec& spec, const HostTensor& q,
                                                   const HostTensor& k, const HostTensor& v,
                                                   std::vector<int> devices,
                                                   const RingCudaOptions& options = {},
                                                   std::vector<RingCudaRankStats>* stats = nullptr);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_RING_CUDA_H_
