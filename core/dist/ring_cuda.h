// Ring attention over GPUs: the sequence is split over P devices (ring_cuda_plan.h), each device
// keeps its query shard while the K/V shards travel around the ring over NCCL, and every step's
// flash_fwd launches LSE-merge straight into the device's float32 O/LSE accumulators (the
// kernel's accumulate epilogue), so a step needs no merge kernel. One host thread per GPU; only
// that thread touches its device, streams and communicator (ARCHITECTURE.md, "Threads and
// ownership"). Built only with CUDA and NCCL (ATTNSERVE_HAVE_NCCL).
//
// Per step t: start the K/V transfer for step t+1 on the communicator's stream (one packed
// [K | V] buffer, so one send/recv pair per step), enqueue the step's pieces on the compute
// stream, wait for the transfer. The rank's own K/V stay in a "home" buffer that is only read,
// and the shards in flight rotate through min(2, P-1) more buffers, so Run() can be repeated
// (benchmarks) without reloading inputs.
//
// Device memory per rank: Q, O (input dtype) and O (f32) of N/P tokens, K/V of N/P tokens times
// (1 + min(2, P-1)), LSE, and the plan's layouts: O(N/P), which is what lets a ring run sequences
// one GPU cannot hold.
#ifndef ATTNSERVE_CORE_DIST_RING_CUDA_H_
#define ATTNSERVE_CORE_DIST_RING_CUDA_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/cpu/cpu_backend.h"
#include "core/cuda/caching_allocator.h"
#include "core/dist/nccl_communicator.h"
#include "core/dist/ring_cuda_plan.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

struct RingCudaOptions {
  RingCudaPlanOptions plan;  // kernel block size for dense/window
  absl::Duration transfer_timeout = absl::Seconds(120);
  absl::Duration init_timeout = absl::Seconds(120);
  const std::atomic<bool>* cancel = nullptr;  // polled while waiting for transfers
};

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
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;
  AttentionShape shape;  // batch, heads, head dim (tokens unused)
  DType dtype = DType::kBF16;
  float scale = 0.f;
  int32_t block_size = 128;
  // kLayout pieces: the piece's CSR on the device (row_ptr relative to col_idx).
  const int64_t* row_ptr = nullptr;
  const int32_t* col_idx = nullptr;
  const uint8_t* block_mask = nullptr;
  // kCausalDiagonal pieces: optional [nb-1, ..., 0] row order (heavy rows first), or null.
  const int32_t* reverse_rows = nullptr;
};

// Enqueues the flash_fwd launch of `piece` (accumulate mode) on `stream`.
absl::Status LaunchRingPiece(const RingPiece& piece, const RingPieceOperands& ops,
                             cudaStream_t stream);

// One rank of a CUDA ring, owned by and used only from its worker thread. Its device buffers are
// public so that callers (the host API below, benchmarks) fill inputs and read outputs directly.
class RingCudaRank {
 public:
  // Collective: every rank of `group` calls it on its own thread at about the same time (NCCL
  // init). Sets the thread's device. `plan` must outlive the rank. dtype: bf16 or f16.
  static absl::StatusOr<std::unique_ptr<RingCudaRank>> Create(
      const RingCudaPlan& plan, const AttentionShape& shape, DType dtype, float scale, int rank,
      int device, std::shared_ptr<NcclGroup> group, const RingCudaOptions& options);
  ~RingCudaRank();  // synchronizes the stream, then frees everything (owning thread only)

  // Inputs, [B, shard_tokens, H, D] in dtype, the rank's ranges concatenated in ascending order.
  void* q() const { return q_.get(); }
  void* k() const { return home_kv_.get(); }
  void* v() const;
  // Outputs after Run (stream-ordered on stream()): O [B, shard_tokens, Hq, D] in dtype and
  // LSE [B, Hq, shard_tokens] f32.
  void* o() const { return o_.get(); }
  float* lse() const { return lse_.as<float>(); }
  int64_t shard_tokens() const { return plan_->shard_tokens[rank_]; }
  const std::vector<TokenRange>& ranges() const { return plan_->split[rank_]; }
  cudaStream_t stream() const { return stream_; }
  CachingAllocator& allocator() { return *alloc_; }

  // Runs the P steps. Returns once the last transfer was waited for and every kernel is
  // enqueued; synchronize stream() before reading the outputs. A failure aborts the group.
  absl::Status Run();
  RingCudaRankStats stats() const;

 private:
  RingCudaRank() = default;
  absl::Status RunSteps();
  int64_t KvBytes(int source) const;  // packed [K | V] bytes of source's shard

  const RingCudaPlan* plan_ = nullptr;
  AttentionShape shape_;
  DType dtype_ = DType::kBF16;
  float scale_ = 0.f;
  int rank_ = 0;
  int device_ = 0;
  RingCudaOptions options_;
  std::unique_ptr<CachingAllocator> alloc_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer q_, home_kv_, o_, o_acc_, lse_;
  DeviceBuffer rot_kv_[2];
  // Layout pieces of every step, concatenated: row_ptr (int64, relative to the piece's col_idx),
  // col_idx (int32), mask (uint8); per piece the offsets into them.
  DeviceBuffer row_ptr_, col_idx_, mask_, reverse_rows_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> piece_offsets_;  // [step][piece]
  int64_t reverse_rows_len_ = 0;
  std::unique_ptr<NcclCommunicator> comm_;
  int64_t bytes_sent_base_ = 0, bytes_received_base_ = 0;
  int64_t steps_run_ = 0;
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

#endif  // ATTNSERVE_CORE_DIST_RING_CUDA_H_
