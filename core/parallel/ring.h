// Ring attention over P workers (one thread each) and data-parallel placement.
//
// Ring: the sequence is split over P ranks; each rank keeps its query shard, and the key/value
// shards travel around the ring (rank p sends to p+1 and receives from p-1), double-buffered: the
// transfer for step t+1 is started before the compute of step t and waited for after it. After P
// steps every rank has seen every K/V shard; its partial results were merged step by step with
// the LSE rule in float32, so its query rows are final. The steps are the ticks of the shared
// ring schedule (ring_schedule.h) at (q_chunks, kv_pieces) = (1, 1) with the consume-home slot
// policy: the schedule the GPU ring follows too, with the same transfers.
//
// Splits (what TokenRange lists each rank holds):
// - non-causal: P contiguous shards; with U split units, the first U % P shards get one more.
// - causal: zigzag, 2P chunks, rank p holds chunks p and 2P-1-p, so the causal triangle gives
//   every rank the same number of admitted pairs.
// - the split unit is one token for dense/window/dilated and one block of the global BlockLayout
//   for block_sparse, whose kept blocks are data: shard boundaries on block boundaries make every
//   (query shard, key shard) piece a plain slice of the global layout (the last shard ends at N).
// Every step evaluates masks on GLOBAL positions; a (query chunk, key chunk) piece with no kept
// tile is skipped without compute. A piece is a RectLayout run by the CPU backend's own tile
// kernel (CpuAttentionPiece), so a ring computes exactly what the single-device backend does.
//
// Dilated specs run as one job per (branch, head group): the group's positions (those of offset o
// = h mod r) are gathered into a sequence of their own, and the job is a segment-local (and causal
// when asked) attention over that gathered sequence. What moves: a group's ring carries only its
// gathered positions (about N/r) and only the key/value heads its query heads read. Summed over a
// branch's groups that is 1/r of a dense ring's bytes when each KV head serves a single group
// (e.g. MHA with Hq divisible by r) and up to the same bytes when every group reads every KV head
// (GQA with r <= g): the positions of different offsets are disjoint, but each is sent once per
// group that needs it. A job whose gathered sequence has at least P segments is cut on segment
// boundaries and needs no communication at all: each rank computes the segments it owns. The
// branches are combined with the LSE rule in a fixed order (branch, group), so runs are
// reproducible bit for bit.
#ifndef ATTNSERVE_CORE_PARALLEL_RING_H_
#define ATTNSERVE_CORE_PARALLEL_RING_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/cpu/cpu_backend.h"
#include "core/parallel/communicator.h"
#include "core/parallel/ring_schedule.h"
#include "core/spec/attention_spec.h"
#include "core/spec/block_layout.h"
#include "core/spec/pattern_compiler.h"
#include "core/spec/rect_layout.h"
#include "core/tensor/tensor.h"
#include "core/util/thread_pool.h"

namespace attnserve {

// The split a spec uses: zigzag when causal, contiguous otherwise; see the file comment.
SplitKind SplitKindFor(const AttentionSpec& spec);

struct RingOptions {
  // Tile size of the CPU step for dense, window and dilated jobs (block_sparse uses its blocks).
  int32_t tile = 64;
  // Bound on each transfer wait; the run's deadline bounds it further.
  absl::Duration transfer_timeout = absl::Seconds(60);
  const std::atomic<bool>* cancel = nullptr;  // polled between tiles and while waiting
  absl::Time deadline = absl::InfiniteFuture();
  // Charged with the run's buffers (outputs, shards, accumulators); may be null.
  MemoryTracker* tracker = nullptr;
  // For block_sparse and dilated plans; max_kept_blocks bounds a block_sparse layout's size.
  CompileOptions compile;
};

// Per-rank figures of a run.
struct RingRankStats {
  int64_t steps = 0;           // ring steps run (P, or 1 for communication-free jobs), all jobs
  int64_t admitted_pairs = 0;  // (query, key) pairs computed, summed over heads and batch
  int64_t kept_tiles = 0;      // tile pairs computed, per (batch, head)
  int64_t skipped_pieces = 0;  // (query chunk, key chunk) pieces skipped: nothing admitted
  int64_t bytes_sent = 0;      // over the communicator, this run
  int64_t bytes_received = 0;
};

// One ring computation shared by its P ranks. Create() validates and plans (on any thread); then
// each rank's worker thread calls RunRank once with its communicator; when all returned OK,
// TakeOutputs() yields O and LSE. A rank that fails aborts the communicator group so the others
// return promptly with that error instead of waiting out a timeout.
class RingRun {
 public:
  static absl::StatusOr<std::unique_ptr<RingRun>> Create(const AttentionSpec& spec,
                                                         const HostTensor& q, const HostTensor& k,
                                                         const HostTensor& v, int ranks,
                                                         const RingOptions& options = {});
  ~RingRun();

  int ranks() const { return ranks_; }
  // Rank `comm.rank()`'s part. Thread-safe across ranks; call once per rank. The inputs given to
  // Create must stay alive and unchanged until every rank returned.
  absl::Status RunRank(Communicator& comm, ThreadPool* pool);
  // O [B, N, Hq, D] in the input dtype and LSE [B, Hq, N]; call once, after every rank succeeded.
  absl::StatusOr<AttentionOutputs> TakeOutputs();
  // Per-rank figures (complete once every rank returned).
  const std::vector<RingRankStats>& stats() const { return stats_; }

  // One unit of ring work: a sequence (the original one, or one dilated group's gathered
  // positions), the heads it computes and how it is cut. Public so tests can inspect plans.
  struct Job {
    int64_t seq_len = 0;
    std::vector<int64_t> positions;              // gathered global positions; empty: identity
    std::vector<int64_t> segment_starts;         // dilated jobs: segments of the gathered sequence
    std::vector<int32_t> q_heads;                // global query heads, in buffer order
    std::vector<int32_t> kv_heads;               // global key/value heads, in buffer order
    std::vector<HeadPair> pairs;                 // (index into q_heads, index into kv_heads)
    // Its split (schedule.split, per rank) and ticks; schedule.circulate false: every rank's keys
    // are its own (one tick, no transfers).
    RingSchedule schedule;
    IntervalRule rule;                           // for rule-defined jobs
    const BlockLayout* layout = nullptr;         // block_sparse: slice this instead of `rule`
  };
  const std::vector<Job>& jobs() const { return jobs_; }

 private:
  RingRun() = default;
  struct RankBuffers;  // one rank's buffers for one job (ring.cc)
  absl::Status RunJob(Communicator& comm, ThreadPool* pool, size_t job_index, RingRankStats& stats);
  absl::StatusOr<RankBuffers> LoadShard(const Job& job, int rank) const;
  absl::Status ComputeTick(const Job& job, const RingTick& tick, RankBuffers& buf,
                           ThreadPool* pool, RingRankStats& stats) const;
  absl::Status MergeJobRows(size_t job_index, int rank, const HostTensor& acc_o,
                            const HostTensor& acc_lse, int64_t rows);
  absl::Status WaitForMergeTurn(size_t job_index);
  WaitOptions MakeWaitOptions() const;

  AttentionSpec spec_;
  AttentionShape shape_;
  DType dtype_ = DType::kF32;
  int ranks_ = 1;
  RingOptions options_;
  const HostTensor* q_ = nullptr;
  const HostTensor* k_ = nullptr;
  const HostTensor* v_ = nullptr;
  std::optional<CompiledPattern> compiled_;
  std::vector<Job> jobs_;
  // Float32 accumulators of the final outputs: [B, N, Hq, D] and [B, Hq, N].
  HostTensor out_o_;
  HostTensor out_lse_;
  std::vector<RingRankStats> stats_;
  // Jobs merge into out_* in job order: job j's rows are merged only after every rank merged
  // job j-1 (ranks' rows are disjoint within a job, not across jobs).
  std::mutex merge_mu_;
  std::condition_variable merge_cv_;
  int64_t merges_done_ = 0;  // guarded by merge_mu_
  bool failed_ = false;      // guarded by merge_mu_
};

// Runs a ring over `ranks` worker threads started here, joined by an InProcessCommGroup; each
// rank gets a ThreadPool of `threads_per_rank` threads (0: none, the rank's thread computes).
absl::StatusOr<AttentionOutputs> RingAttentionInProcess(
    const AttentionSpec& spec, const HostTensor& q, const HostTensor& k, const HostTensor& v,
    int ranks, const RingOptions& options = {}, int threads_per_rank = 0,
    std::vector<RingRankStats>* stats = nullptr);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_RING_H_
