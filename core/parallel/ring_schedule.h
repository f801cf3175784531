// The one ring schedule: which query chunk of which rank meets which K/V piece at each tick, and
// which K/V slot is computed from, sent and received at that tick. Pure host data, built once per
// ring and followed as-is by both executors: the CPU ring (ring.cc, RingRun) and the GPU ring
// (ring_cuda.cc, RingCudaRank, whose RingCudaPlan adds the kernel's class of every pair). The
// schedule is executed for every rank on the CPU against a float64 reference in
// ring_cuda_plan_test.cc, with a slot model that fails when a live piece is overwritten.
//
// Splits (SplitSequence below): contiguous shards when not causal, zigzag (2P chunks, rank p
// holds chunks p and 2P-1-p) when causal. Each rank's K/V shard is cut into c = kv_pieces pieces
// and its query shard into qc = q_chunks chunks, on unit boundaries (c = 1 or qc = 1 keeps the
// whole shard). Zigzag K/V pieces: c even, half from each of the rank's two ranges, so a piece is
// one contiguous range of positions. Zigzag query chunks are mirrored: each range is cut into qc
// parts and chunk j = {L_j, H_{qc-1-j}}, so every chunk of every rank has about the same causal
// work. The ranks advance tick by tick (a tick's transfer needs both neighbours), so a tick costs
// the slowest rank's piece: with contiguous chunks the rank holding the sequence's two ends would
// idle through its early chunks and dominate its late ones (about 1.25x the balanced time at P=2).
//
// The K/V stream of rank p: X_0..X_{c-1} are its own pieces and X_{m+c} is rank (p-1)'s X_m, i.e.
// X_m = piece (m mod c) of rank (p - floor((m mod Pc) / c)) mod P: period P*c, every K/V piece of
// the ring once per period. Tick k (qc*P*c ticks) computes query chunk floor(k / (P*c)) against
// X_k; a chunk's float32 accumulator is final after its P*c ticks. Rank p sends to p+1 and
// receives from p-1. Where the entries live (the slots) is the slot policy's choice:
// - kKeepHome ((qc, c) = (1, 1) only, the double-buffered P-step ring): the rank's own shard stays
//   in a read-only home slot 0; tick k sends X_k and receives X_{k+1} into one of min(2, P-1)
//   rotating slots, for k < P-1 (P-1 transfers). A run leaves the home slot as it found it.
// - kRestoreHome (the lean "circulating pieces" schedule, c+1 slots): X_m lives in slot
//   m mod (c+1); every tick sends X_k and receives X_{k+c} into the slot X_{k-1} left, including
//   the last c ticks, which bring the rank's own pieces back (the stream has period P*c and the
//   tick count is a multiple of it). After a run home piece j lies in slot next_run_slot[j].
// - kConsumeHome (one-shot runs, c+1 slots): as kRestoreHome without the transfers whose entry
//   is never computed (ticks k with k + c >= the tick count); at (1, 1) that is the classic
//   double buffer: X_m in slot m mod 2, P-1 transfers.
// With P = 1 or circulate = false (each rank computes against its own K/V only: segment-local
// dilated jobs) there are c slots, X_m in slot m mod c and no transfers.
// Every policy starts a run with the rank's own piece j in slot j.
#ifndef ATTNSERVE_CORE_PARALLEL_RING_SCHEDULE_H_
#define ATTNSERVE_CORE_PARALLEL_RING_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve {

struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

enum class SplitKind { kContiguous, kZigzag };

// The ranges rank p holds, for p in [0, parts): one range (contiguous) or two (zigzag: chunk p then
// chunk 2P-1-p), in ascending position order. Boundaries are multiples of `unit` except n itself;
// units are shared out as evenly as possible, earlier shards/chunks taking the remainder. Ranges
// may be empty when n has fewer units than shards. Requires parts >= 1, unit >= 1, n >= 0.
std::vector<std::vector<TokenRange>> SplitSequence(int64_t n, int parts, SplitKind kind,
                                                   int64_t unit = 1);

// A query chunk or K/V piece of a rank's shard: its ranges, ascending. K/V pieces (and query
// chunks of contiguous splits) occupy consecutive local rows; a zigzag query chunk (qc > 1) is
// mirrored, {L_j, H_{qc-1-j}} of the shard's two ranges, so its rows are two runs.
struct RingChunk {
  std::vector<TokenRange> ranges;
  int64_t row = 0;     // local row of its first token in the shard
  int64_t tokens = 0;  // total tokens
};

// One (query range, key range) pair a tick computes; both ranges are non-empty.
struct RingPair {
  TokenRange q;           // global query positions
  TokenRange k;           // global key positions
  int64_t q_row = 0;      // local row of q.begin in the rank's query shard
  int64_t k_row = 0;      // local row of k.begin in the K/V piece (c = 1: the source's shard)
  int64_t acc_row = 0;    // row of q.begin in its query chunk's rows (its ranges concatenated)
};

// One side of a tick's transfer: the slot read (send) or written (receive), the neighbour, and
// the K/V piece that travels.
struct RingMove {
  int slot = -1;  // -1: no transfer this tick
  int peer = -1;
  int source = -1;  // rank whose piece it is
  int piece = -1;
  int64_t tokens = 0;
  bool valid() const { return slot >= 0; }
};

struct RingTick {
  int q_chunk = 0;   // query chunk of the rank
  int source = 0;    // rank whose K/V piece this tick reads
  int kv_piece = 0;  // piece of the source's shard
  int slot = 0;      // slot holding that piece
  bool chunk_begins = false;  // reset the chunk's accumulator first
  bool chunk_ends = false;    // the chunk's rows are final after this tick
  // Started before the tick's compute and waited for after it; both valid or neither.
  RingMove send, recv;
  std::vector<RingPair> pairs;  // in (query range, key range) order
};

enum class RingSlotPolicy { kKeepHome, kRestoreHome, kConsumeHome };

struct RingScheduleOptions {
  int q_chunks = 1;  // qc
  int kv_pieces = 1;  // c
  int64_t unit = 1;  // chunk and piece boundaries fall on multiples of it
  bool circulate = true;  // false: every rank computes against its own K/V only
  RingSlotPolicy slots = RingSlotPolicy::kConsumeHome;
};

struct RingSchedule {
  int ranks = 1;
  int q_chunks = 1;   // qc
  int kv_pieces = 1;  // c
  bool circulate = true;
  RingSlotPolicy slot_policy = RingSlotPolicy::kConsumeHome;
  SplitKind split_kind = SplitKind::kContiguous;
  std::vector<std::vector<TokenRange>> split;  // per rank, ascending
  std::vector<int64_t> shard_tokens;           // per rank: tokens it holds
  int64_t max_shard_tokens = 0;
  std::vector<std::vector<RingChunk>> q_chunk;   // [rank][qc]
  std::vector<std::vector<RingChunk>> kv_piece;  // [rank][c]
  int64_t max_q_chunk_tokens = 0;
  int64_t max_kv_piece_tokens = 0;
  std::vector<std::vector<int64_t>> slot_tokens;  // [rank][slot]: K/V tokens the slot holds
  // The next run's slot s is this run's slot next_run_slot[s] (identity for kKeepHome; kConsume-
  // Home leaves no home behind: empty).
  std::vector<int> next_run_slot;
  std::vector<std::vector<RingTick>> rank_ticks;  // [rank][tick]
  int64_t period() const { return static_cast<int64_t>(circulate ? ranks : 1) * kv_pieces; }
  int64_t ticks() const { return q_chunks * period(); }
  // Largest query chunk of `rank` (the rows its float32 accumulator holds).
  int64_t MaxQChunkTokens(int rank) const;
};

// Builds the schedule of a split (SplitSequence's output, `kind` its kind). INVALID_ARGUMENT for
// counts < 1, a piece count that is not a multiple of a shard's ranges (zigzag: even), or
// kKeepHome with (qc, c) != (1, 1).
absl::StatusOr<RingSchedule> MakeRingSchedule(std::vector<std::vector<TokenRange>> split,
                                              SplitKind kind, const RingScheduleOptions& options);

// K/V slots a rank holds, in tokens each: what MakeRingSchedule puts in slot_tokens, computable
// without building a schedule (memory estimates of candidate counts).
std::vector<int64_t> RingSlotTokens(RingSlotPolicy policy, bool circulate, int ranks, int kv_pieces,
                                    int64_t own_shard_tokens, int64_t max_shard_tokens,
                                    int64_t max_kv_piece_tokens);

// Cuts a shard (its ranges) into m chunks on `unit` boundaries, as MakeRingSchedule does (mirror:
// zigzag query chunks). `what` names the count in the INVALID_ARGUMENT message.
absl::StatusOr<std::vector<RingChunk>> CutShard(const std::vector<TokenRange>& ranges, int m,
                                                int64_t unit, const char* what,
                                                bool mirror = false);

// Local row of global position `pos` in the shard made of `ranges` (pos must lie in one).
int64_t LocalRow(const std::vector<TokenRange>& ranges, int64_t pos);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_RING_SCHEDULE_H_
