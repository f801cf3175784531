// Dilated (LongNet) attention over P devices, composed on the host from two primitives the caller
// binds: a ring over every rank (for one job whose segments span shards) and a run on one rank's
// device alone (for the segments that rank owns). Pure host code: the CPU ring and CPU backend
// bind it in tests, the CUDA ring and the single-GPU plan in dilated_ring_cuda.h.
//
// Jobs. Branch k (segment length w, rate r) and head offset o = h mod r (docs/DESIGN.md, "The
// math"; the same groups as RingRun's dilated jobs in ring.h) gather the positions
// t*w + o + m*r of every segment t into a sequence of their own, in ascending order. Every full
// segment gathers the same count w_g = ceil((w - o) / r); only the last (short) segment may hold
// fewer, or none. In gathered coordinates the job is therefore "attend within your own segment of
// w_g positions (causal if the spec is)", i.e. a rate-1 dilated pattern, and causal order is kept
// because gathering preserves position order. A job's tensors are q [B, N_g, hq, D] and k/v
// [B, N_g, hkv, D]: the group's query heads and the KV heads they read (GQA). The gathered heads
// must again be a plain GQA mapping (query head i reads KV head i / (hq / hkv)); when a group's
// query heads do not share its KV heads evenly (e.g. Hq = 8, Hkv = 2, r = 3) the group is split
// into one job per run length, so no KV head is ever duplicated.
//
// Placement of a job with S non-empty gathered segments over P ranks:
// - S >= P: local. The gathered sequence is cut on segment boundaries into P contiguous parts
//   (whole segments, as even as possible, earlier ranks taking the remainder, so the short last
//   segment ends up with the last rank) and `local(rank, ...)` runs each part, one thread per
//   rank. No communication at all.
// - S < P but the gathered sequence has fewer than P blocks of block_size: a ring would leave
//   ranks without a token, so the whole job runs as one part on one rank (short jobs take the
//   ranks in turn). Counted as local.
// - S < P otherwise: ring. One segment: the dense (or causal) spec over the gathered sequence.
// Several: a
//   block_sparse spec with a caller CSR, block-diagonal over the gathered segments, at
//   `block_size`. That needs every segment boundary except the sequence end on a block boundary
//   (w_g a multiple of block_size); otherwise the job cannot be expressed and the whole call
//   answers UNIMPLEMENTED before anything runs. A ring carries only the job's gathered positions
//   and KV heads: about 1/r of a dense ring's bytes per group.
//
// Outputs. Every job's O/LSE is scattered back to its original positions and heads and merged
// into float32 accumulators with the LSE rule, jobs in a FIXED order (branch, offset, head run),
// so runs are reproducible bit for bit given reproducible primitives. O is converted to the input
// dtype at the end; LSE is [B, Hq, N] f32 (-inf, O = 0 where no branch covers a query). Host
// memory: the accumulators plus one job's gathered tensors, O(N x heads); no O(N^2) buffer (the
// CSR of a ring job holds the kept blocks of fewer than P segments).
#ifndef ATTNSERVE_CORE_PARALLEL_DILATED_RING_H_
#define ATTNSERVE_CORE_PARALLEL_DILATED_RING_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cpu/cpu_backend.h"
#include "core/parallel/ring.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"

namespace attnserve {

struct DilatedRingStats {
  int64_t ring_jobs = 0;   // jobs run as a ring over every rank
  int64_t local_jobs = 0;  // jobs run as per-rank parts with no communication
  // K/V bytes the rings carried. DilatedRingAttention counts what a ring must move: each rank's
  // K/V shard (input dtype) visits the P - 1 other ranks, (P - 1) * 2 * B * N_g * hkv * D * size
  // per ring job. Bindings that can measure it (DilatedRingAttentionCuda: NCCL bytes sent)
  // overwrite it with the measured figure.
  int64_t ring_bytes_moved = 0;
};

// Runs one job (an attention over a gathered sequence) as a ring over all ranks.
using DilatedRingFn = std::function<absl::StatusOr<AttentionOutputs>(
    const AttentionSpec&, const HostTensor& q, const HostTensor& k, const HostTensor& v)>;
// Runs one job's segments that a rank owns on that rank's device alone (no communication).
// Called concurrently for different ranks (one thread each), never twice at once for one rank.
using DilatedLocalFn = std::function<absl::StatusOr<AttentionOutputs>(
    int rank, const AttentionSpec&, const HostTensor& q, const HostTensor& k, const HostTensor& v)>;

// One job of the plan (see the file comment). Gathered index i lies in segment s = i / seg_len
// and is global position s * segment_length + offset + (i - s * seg_len) * rate.
struct DilatedRingJob {
  int branch = 0;  // index into spec.dilated
  int64_t segment_length = 0;
  int64_t rate = 1;
  int64_t offset = 0;
  int64_t seq_len = 0;            // N_g: gathered positions
  int64_t seg_len = 0;            // w_g: positions of every full gathered segment
  int64_t segments = 0;           // non-empty gathered segments
  std::vector<int32_t> q_heads;   // global query heads, ascending
  std::vector<int32_t> kv_heads;  // global KV heads, ascending; q_heads[i] reads kv_heads[i / g']
  bool local = false;
  // local: per rank, its part of the gathered sequence (whole segments; may be empty); ring: empty.
  std::vector<TokenRange> parts;

  int64_t Position(int64_t i) const {
    const int64_t s = i / seg_len;
    return s * segment_length + offset + (i - s * seg_len) * rate;
  }
};

// The jobs of `spec` (dilated) over `shape` on `ranks` ranks at `block_size`, in merge order.
// INVALID_ARGUMENT for a bad spec/shape, ranks < 1, a block size other than 64/128, or a spec
// that is not dilated; UNIMPLEMENTED (naming spec.dilated.segment_lengths[k], its rate and the
// block size) when a ring job's gathered segments do not fall on block boundaries.
absl::StatusOr<std::vector<DilatedRingJob>> PlanDilatedRing(const AttentionSpec& spec,
                                                            const AttentionShape& shape, int ranks,
                                                            int32_t block_size);

// The spec a job runs over `tokens` gathered positions starting at a segment boundary: dense when
// they fit in one segment, else as a ring (`for_ring`) the block-diagonal CSR at block_size, or for
// a local part the rate-1 dilated pattern of seg_len; causal and scale as in `spec`.
absl::StatusOr<AttentionSpec> DilatedJobSpec(const AttentionSpec& spec, const DilatedRingJob& job,
                                             int64_t tokens, bool for_ring, int32_t block_size);

// q [B, N, Hq, D], k/v [B, N, Hkv, D] (one dtype). Plans (so UNIMPLEMENTED comes before any
// work), then runs the jobs in order: local jobs with one thread per rank that has a part, ring
// jobs on the calling thread. A primitive's error is returned as is (the first rank's, for local
// jobs); INTERNAL when a primitive returns outputs of the wrong shape or dtype.
absl::StatusOr<AttentionOutputs> DilatedRingAttention(const AttentionSpec& spec,
                                                      const HostTensor& q, const HostTensor& k,
                                                      const HostTensor& v, int ranks,
                                                      int32_t block_size, const DilatedRingFn& ring,
                                                      const DilatedLocalFn& local,
                                                      DilatedRingStats* stats = nullptr);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_DILATED_RING_H_
