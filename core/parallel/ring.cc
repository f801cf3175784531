#include "core/parallel/ring.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cpu/merge.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Copies `d` elements of row (b, pos, head) of a [B, N, H, D] tensor as raw bytes.
inline const std::byte* RowPtr(const HostTensor& t, int64_t b, int64_t pos, int64_t head) {
  const int64_t n = t.dim(1), h = t.dim(2), d = t.dim(3);
  return t.data() + static_cast<size_t>(((b * n + pos) * h + head) * d) * DTypeSize(t.dtype());
}

// The CPU ring's schedule of a job's split: (1, 1) with the consume-home slot policy (a one-shot
// run: the double buffer, P-1 transfers), or one tick against the rank's own keys.
absl::StatusOr<RingSchedule> CpuRingSchedule(std::vector<std::vector<TokenRange>> split,
                                             SplitKind kind, bool circulate) {
  RingScheduleOptions o;
  o.circulate = circulate;
  o.slots = RingSlotPolicy::kConsumeHome;
  return MakeRingSchedule(std::move(split), kind, o);
}

// Whole segments per rank, cut at the segment boundary nearest each even share of seq_len: no key
// ever leaves its rank.
std::vector<std::vector<TokenRange>> SegmentSplit(const std::vector<int64_t>& segment_starts,
                                                  int64_t seq_len, int ranks) {
  std::vector<std::vector<TokenRange>> split(ranks);
  int64_t prev = 0;
  for (int p = 0; p < ranks; ++p) {
    int64_t end = seq_len;
    if (p + 1 < ranks) {
      const int64_t target = seq_len * (p + 1) / ranks;
      auto it = std::lower_bound(segment_starts.begin(), segment_starts.end(), target);
      end = *it;
      if (it != segment_starts.begin() && target - *(it - 1) < *it - target) end = *(it - 1);
      end = std::max(end, prev);
    }
    split[p] = {{prev, end}};
    prev = end;
  }
  return split;
}

}  // namespace

SplitKind SplitKindFor(const AttentionSpec& spec) {
  return spec.causal ? SplitKind::kZigzag : SplitKind::kContiguous;
}

RingRun::~RingRun() = default;

absl::StatusOr<std::unique_ptr<RingRun>> RingRun::Create(const AttentionSpec& spec,
                                                         const HostTensor& q, const HostTensor& k,
                                                         const HostTensor& v, int ranks,
                                                         const RingOptions& options) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring: ranks must be >= 1, got ", ranks));
  }
  if (options.tile < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring: tile must be >= 1, got ", options.tile));
  }
  std::unique_ptr<RingRun> run(new RingRun());
  ATTN_ASSIGN_OR_RETURN(run->shape_, AttentionShapeOf(q, k, v));
  ATTN_DCHECK_OK(ValidateSpec(spec, run->shape_));  // validated where the request entered
  const AttentionShape& s = run->shape_;
  // Shards, schedules and merges all assume one sequence axis shared by queries and keys.
  if (!IsSquare(spec, s)) {
    return absl::UnimplementedError(absl::StrCat(
        "ring: not yet for Nq != Nkv, a query offset or packed sequences (", s.tokens,
        " queries at offset ", spec.q_offset, " against ", s.kv_len(), " keys",
        IsPacked(spec) ? ", packed" : "", "); run it on one device"));
  }
  run->spec_ = spec;
  run->dtype_ = q.dtype();
  run->ranks_ = ranks;
  run->options_ = options;
  run->q_ = &q;
  run->k_ = &k;
  run->v_ = &v;
  run->stats_.assign(ranks, {});
  const int64_t g = s.q_heads / s.kv_heads;
  const SplitKind kind = SplitKindFor(spec);

  auto all_heads_job = [&]() {
    Job job;
    job.seq_len = s.tokens;
    for (int64_t h = 0; h < s.q_heads; ++h) {
      job.q_heads.push_back(static_cast<int32_t>(h));
      job.pairs.push_back({static_cast<int32_t>(h), static_cast<int32_t>(h / g)});
    }
    for (int64_t h = 0; h < s.kv_heads; ++h) job.kv_heads.push_back(static_cast<int32_t>(h));
    job.rule.causal = spec.causal;
    return job;
  };
  auto schedule_of = [](Job& job, std::vector<std::vector<TokenRange>> split, SplitKind kind,
                        bool circulate) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(job.schedule, CpuRingSchedule(std::move(split), kind, circulate));
    return absl::OkStatus();
  };

  if (std::holds_alternative<WindowSpec>(spec.pattern)) {
    Job job = all_heads_job();
    job.rule.window = WindowWithin(spec, s.tokens);
    ATTN_RETURN_IF_ERROR(schedule_of(job, SplitSequence(s.tokens, ranks, kind), kind, ranks > 1));
    run->jobs_.push_back(std::move(job));
  } else if (std::holds_alternative<DenseSpec>(spec.pattern)) {
    Job job = all_heads_job();
    ATTN_RETURN_IF_ERROR(schedule_of(job, SplitSequence(s.tokens, ranks, kind), kind, ranks > 1));
    run->jobs_.push_back(std::move(job));
  } else if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    ATTN_ASSIGN_OR_RETURN(CompiledPattern compiled,
                          CompileValidatedPattern(spec, s.tokens, s.q_heads, options.compile));
    run->compiled_ = std::move(compiled);
    Job job = all_heads_job();
    ATTN_RETURN_IF_ERROR(schedule_of(
        job, SplitSequence(s.tokens, ranks, kind, bs->block_size), kind, ranks > 1));
    job.layout = &run->compiled_->layout;  // run is heap-allocated: the address is stable
    run->jobs_.push_back(std::move(job));
  } else {
    ATTN_ASSIGN_OR_RETURN(CompiledPattern compiled,
                          CompileValidatedPattern(spec, s.tokens, s.q_heads, options.compile));
    if (!compiled.dilated.has_value()) {
      return absl::InternalError("ring: a dilated spec compiled without a dilated plan");
    }
    for (const DilatedBranch& branch : compiled.dilated->branches) {
      for (const DilatedGroup& group : branch.groups) {
        if (group.positions.empty()) continue;
        Job job;
        job.seq_len = static_cast<int64_t>(group.positions.size());
        job.positions = group.positions;
        job.segment_starts = group.seg_start;
        for (const int64_t h : DilatedGroupHeads(s.q_heads, branch.rate, group.offset)) {
          const auto kvh = static_cast<int32_t>(h / g);
          if (job.kv_heads.empty() || job.kv_heads.back() != kvh) job.kv_heads.push_back(kvh);
          job.pairs.push_back({static_cast<int32_t>(job.q_heads.size()),
                               static_cast<int32_t>(job.kv_heads.size() - 1)});
          job.q_heads.push_back(static_cast<int32_t>(h));
        }
        job.rule.causal = spec.causal;
        const int64_t segments = static_cast<int64_t>(job.segment_starts.size()) - 1;
        if (segments >= ranks) {
          ATTN_RETURN_IF_ERROR(schedule_of(
              job, SegmentSplit(job.segment_starts, job.seq_len, ranks), SplitKind::kContiguous,
              /*circulate=*/false));
        } else {
          ATTN_RETURN_IF_ERROR(
              schedule_of(job, SplitSequence(job.seq_len, ranks, kind), kind, ranks > 1));
        }
        run->jobs_.push_back(std::move(job));
      }
    }
    // The rules point into their own job's segment list, which is final only now.
    for (Job& job : run->jobs_) job.rule.segment_starts = &job.segment_starts;
  }

  ATTN_ASSIGN_OR_RETURN(
      run->out_o_,
      HostTensor::Create(DType::kF32, {s.batch, s.tokens, s.q_heads, s.head_dim}, options.tracker));
  ATTN_ASSIGN_OR_RETURN(
      run->out_lse_,
      HostTensor::Create(DType::kF32, {s.batch, s.q_heads, s.tokens}, options.tracker));
  std::fill_n(run->out_o_.data_as<float>(), run->out_o_.numel(), 0.f);
  std::fill_n(run->out_lse_.data_as<float>(), run->out_lse_.numel(), kNegInf);
  return run;
}

WaitOptions RingRun::MakeWaitOptions() const {
  WaitOptions w;
  w.timeout = std::min(options_.transfer_timeout,
                       std::max(absl::ZeroDuration(), options_.deadline - absl::Now()));
  w.cancel = options_.cancel;
  return w;
}

absl::Status RingRun::RunRank(Communicator& comm, ThreadPool* pool) {
  absl::Status status;
  if (comm.size() != ranks_ || comm.rank() < 0 || comm.rank() >= ranks_) {
    status =
        absl::InvalidArgumentError(absl::StrCat("ring: communicator is rank ", comm.rank(), " of ",
                                                comm.size(), ", the run has ", ranks_, " ranks"));
  } else {
    RingRankStats& stats = stats_[comm.rank()];
    const int64_t sent0 = comm.bytes_sent();
    const int64_t received0 = comm.bytes_received();
    for (size_t j = 0; j < jobs_.size() && status.ok(); ++j) {
      status = RunJob(comm, pool, j, stats);
    }
    stats.bytes_sent = comm.bytes_sent() - sent0;
    stats.bytes_received = comm.bytes_received() - received0;
  }
  if (!status.ok()) {
    // Release the other ranks now (merge waits and transfers) rather than at their timeouts.
    {
      std::lock_guard<std::mutex> lock(merge_mu_);
      failed_ = true;
    }
    merge_cv_.notify_all();
    comm.Abort(absl::Status(status.code(),
                            absl::StrCat("ring rank ", comm.rank(), ": ", status.message())));
  }
  return status;
}

// One rank's buffers for one job: its query shard in float32, the K/V slots of the schedule
// (input dtype; a slot holds one K/V piece packed as K [B, t, hkv, D] then V [B, t, hkv, D], which
// is also how it travels), the float32 accumulators of its query rows and a float32 copy of the
// piece being computed (only when the wire dtype is not float32).
struct RingRun::RankBuffers {
  HostTensor q_shard;
  std::vector<HostTensor> slots;
  HostTensor acc_o, acc_lse, kv_f32;
};

absl::StatusOr<RingRun::RankBuffers> RingRun::LoadShard(const Job& job, int p) const {
  const RingSchedule& sched = job.schedule;
  const int64_t B = shape_.batch, D = shape_.head_dim;
  const int64_t hq = static_cast<int64_t>(job.q_heads.size());
  const int64_t hkv = static_cast<int64_t>(job.kv_heads.size());
  const size_t esize = DTypeSize(dtype_);
  const int64_t nq = sched.shard_tokens[p];
  auto position = [&](int64_t i) { return job.positions.empty() ? i : job.positions[i]; };
  RankBuffers buf;
  ATTN_ASSIGN_OR_RETURN(buf.q_shard,
                        HostTensor::Create(DType::kF32, {B, nq, hq, D}, options_.tracker));
  for (int64_t tokens : sched.slot_tokens[p]) {
    ATTN_ASSIGN_OR_RETURN(HostTensor slot,
                          HostTensor::Create(dtype_, {2, B, tokens, hkv, D}, options_.tracker));
    buf.slots.push_back(std::move(slot));
  }
  float* qd = buf.q_shard.data_as<float>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t row = 0;
    for (const TokenRange& r : sched.split[p]) {
      for (int64_t i = r.begin; i < r.end; ++i, ++row) {
        for (int64_t h = 0; h < hq; ++h) {
          ConvertToFloat32(dtype_, RowPtr(*q_, b, position(i), job.q_heads[h]),
                           qd + ((b * nq + row) * hq + h) * D, D);
        }
      }
    }
  }
  // Every schedule starts with the rank's own K/V piece j in slot j.
  for (int j = 0; j < sched.kv_pieces; ++j) {
    const RingChunk& piece = sched.kv_piece[p][j];
    const int64_t t = piece.tokens;
    std::byte* kd = buf.slots[j].data();
    std::byte* vd = kd + static_cast<size_t>(B * t * hkv * D) * esize;
    for (int64_t b = 0; b < B; ++b) {
      int64_t row = 0;
      for (const TokenRange& r : piece.ranges) {
        for (int64_t i = r.begin; i < r.end; ++i, ++row) {
          for (int64_t h = 0; h < hkv; ++h) {
            const size_t off = static_cast<size_t>(((b * t + row) * hkv + h) * D) * esize;
            std::memcpy(kd + off, RowPtr(*k_, b, position(i), job.kv_heads[h]), D * esize);
            std::memcpy(vd + off, RowPtr(*v_, b, position(i), job.kv_heads[h]), D * esize);
          }
        }
      }
    }
  }
  // The CPU executor keeps one accumulator for the whole query shard: its schedules have
  // q_chunks = 1 (CpuRingSchedule).
  ATTN_ASSIGN_OR_RETURN(buf.acc_o,
                        HostTensor::Create(DType::kF32, {B, nq, hq, D}, options_.tracker));
  ATTN_ASSIGN_OR_RETURN(buf.acc_lse,
                        HostTensor::Create(DType::kF32, {B, hq, nq}, options_.tracker));
  std::fill_n(buf.acc_o.data_as<float>(), buf.acc_o.numel(), 0.f);
  std::fill_n(buf.acc_lse.data_as<float>(), buf.acc_lse.numel(), kNegInf);
  if (dtype_ != DType::kF32) {
    ATTN_ASSIGN_OR_RETURN(buf.kv_f32,
                          HostTensor::Create(DType::kF32, {2, B, sched.max_kv_piece_tokens, hkv, D},
                                             options_.tracker));
  }
  return buf;
}

absl::Status RingRun::ComputeTick(const Job& job, const RingTick& tick, RankBuffers& buf,
                                  ThreadPool* pool, RingRankStats& stats) const {
  const int64_t B = shape_.batch, D = shape_.head_dim;
  const int64_t hkv = static_cast<int64_t>(job.kv_heads.size());
  const int64_t nkv = job.schedule.kv_piece[tick.source][tick.kv_piece].tokens;
  const HostTensor& slot = buf.slots[tick.slot];
  const float* kf;
  if (dtype_ == DType::kF32) {
    kf = slot.data_as<float>();
  } else {
    ConvertToFloat32(dtype_, slot.data(), buf.kv_f32.data_as<float>(),
                     static_cast<size_t>(2 * B * nkv * hkv * D));
    kf = buf.kv_f32.data_as<float>();
  }
  CpuPieceArgs args;
  args.batch = B;
  args.head_dim = D;
  args.q = buf.q_shard.data_as<float>();
  args.q_rows = buf.q_shard.dim(1);
  args.q_heads = static_cast<int64_t>(job.q_heads.size());
  args.k = kf;
  args.v = kf + B * nkv * hkv * D;
  args.kv_rows = nkv;
  args.kv_heads = hkv;
  args.heads = job.pairs;
  args.acc_o = buf.acc_o.data_as<float>();
  args.acc_lse = buf.acc_lse.data_as<float>();
  CpuRunOptions piece_options;
  piece_options.pool = pool;
  piece_options.cancel = options_.cancel;
  for (const RingPair& pair : tick.pairs) {
    RectLayout layout;
    if (job.layout != nullptr) {
      ATTN_ASSIGN_OR_RETURN(layout, SliceBlockLayout(*job.layout, pair.q.begin, pair.q.end,
                                                     pair.k.begin, pair.k.end));
    } else {
      layout = RectLayoutFromRule(job.rule, pair.q.begin, pair.q.end, pair.k.begin, pair.k.end,
                                  options_.tile);
    }
    if (layout.kept_tiles() == 0) {
      ++stats.skipped_pieces;
      continue;
    }
    stats.kept_tiles += layout.kept_tiles();
    stats.admitted_pairs += layout.AdmittedPairs() * B * static_cast<int64_t>(job.pairs.size());
    args.q_row0 = pair.q_row;
    args.k_row0 = pair.k_row;
    ATTN_RETURN_IF_ERROR(CpuAttentionPiece(spec_, layout, args, piece_options));
  }
  return absl::OkStatus();
}

absl::Status RingRun::RunJob(Communicator& comm, ThreadPool* pool, size_t job_index,
                             RingRankStats& stats) {
  const Job& job = jobs_[job_index];
  const RingSchedule& sched = job.schedule;
  const int p = comm.rank();
  // A packed K/V piece of t tokens: K [B, t, hkv, D] then V, input dtype.
  const int64_t token_bytes = static_cast<int64_t>(2 * shape_.batch * job.kv_heads.size() *
                                                   shape_.head_dim * DTypeSize(dtype_));
  ATTN_ASSIGN_OR_RETURN(RankBuffers buf, LoadShard(job, p));
  const std::vector<RingTick>& ticks = sched.rank_ticks[p];
  for (size_t t = 0; t < ticks.size(); ++t) {
    const RingTick& tick = ticks[t];
    PendingTransfer pending;
    if (tick.send.valid()) {
      // Started before this tick's compute, waited for after it: the transfer overlaps compute.
      ATTN_ASSIGN_OR_RETURN(
          pending, comm.StartSendRecv(buf.slots[tick.send.slot].data(),
                                      tick.send.tokens * token_bytes, tick.send.peer,
                                      buf.slots[tick.recv.slot].data(),
                                      tick.recv.tokens * token_bytes, tick.recv.peer));
    }
    ATTN_RETURN_IF_ERROR(ComputeTick(job, tick, buf, pool, stats));
    ++stats.steps;
    if (absl::Now() >= options_.deadline) {
      return absl::DeadlineExceededError(absl::StrCat("ring rank ", p, ": deadline passed at step ",
                                                      t, " of ", ticks.size()));
    }
    if (pending.valid()) ATTN_RETURN_IF_ERROR(comm.Wait(std::move(pending), MakeWaitOptions()));
  }

  ATTN_RETURN_IF_ERROR(WaitForMergeTurn(job_index));
  ATTN_RETURN_IF_ERROR(MergeJobRows(job_index, p, buf.acc_o, buf.acc_lse, sched.shard_tokens[p]));
  {
    std::lock_guard<std::mutex> lock(merge_mu_);
    ++merges_done_;
  }
  merge_cv_.notify_all();
  return absl::OkStatus();
}

absl::Status RingRun::WaitForMergeTurn(size_t job_index) {
  const int64_t needed = static_cast<int64_t>(job_index) * ranks_;
  const WaitOptions w = MakeWaitOptions();
  const absl::Time deadline = absl::Now() + w.timeout;
  std::unique_lock<std::mutex> lock(merge_mu_);
  while (merges_done_ < needed) {
    if (failed_) return absl::AbortedError("ring: another rank failed");
    if (w.cancel != nullptr && w.cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError("ring: cancelled while waiting to merge");
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("ring: job ", job_index, " waited ", absl::FormatDuration(w.timeout),
                       " for the other ranks to merge job ", job_index - 1));
    }
    merge_cv_.wait_until(lock,
                         absl::ToChronoTime(std::min(deadline, now + absl::Milliseconds(10))));
  }
  return absl::OkStatus();
}

absl::Status RingRun::MergeJobRows(size_t job_index, int rank, const HostTensor& acc_o,
                                   const HostTensor& acc_lse, int64_t rows) {
  const Job& job = jobs_[job_index];
  const AttentionShape& s = shape_;
  const int64_t B = s.batch, N = s.tokens, H = s.q_heads, D = s.head_dim;
  const int64_t hq = static_cast<int64_t>(job.q_heads.size());
  float* out_o = out_o_.data_as<float>();
  float* out_lse = out_lse_.data_as<float>();
  const float* in_o = acc_o.data_as<float>();
  const float* in_lse = acc_lse.data_as<float>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t row = 0;
    for (const TokenRange& r : job.schedule.split[rank]) {
      for (int64_t i = r.begin; i < r.end; ++i, ++row) {
        const int64_t pos = job.positions.empty() ? i : job.positions[i];
        for (int64_t h = 0; h < hq; ++h) {
          const int64_t gh = job.q_heads[h];
          MergePartialRows(
              1, D, out_o + ((b * N + pos) * H + gh) * D, D, out_lse + (b * H + gh) * N + pos, 1,
              in_o + ((b * rows + row) * hq + h) * D, D, in_lse + (b * hq + h) * rows + row, 1);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionOutputs> RingRun::TakeOutputs() {
  if (out_o_.empty() && out_lse_.empty()) {
    return absl::FailedPreconditionError("ring: outputs already taken");
  }
  {
    std::lock_guard<std::mutex> lock(merge_mu_);
    if (failed_ || merges_done_ != static_cast<int64_t>(jobs_.size()) * ranks_) {
      return absl::FailedPreconditionError("ring: not every rank completed");
    }
  }
  AttentionOutputs out;
  if (dtype_ == DType::kF32) {
    out.o = std::move(out_o_);
  } else {
    ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(dtype_, out_o_.dims(), options_.tracker));
    out.o.FromFloat32(out_o_.data_as<float>());
    out_o_ = HostTensor();
  }
  out.lse = std::move(out_lse_);
  return out;
}

absl::StatusOr<AttentionOutputs> RingAttentionInProcess(const AttentionSpec& spec,
                                                        const HostTensor& q, const HostTensor& k,
                                                        const HostTensor& v, int ranks,
                                                        const RingOptions& options,
                                                        int threads_per_rank,
                                                        std::vector<RingRankStats>* stats) {
  // A library entry point: validate here; RingRun::Create asserts.
  ATTN_ASSIGN_OR_RETURN(const AttentionShape shape, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, shape));
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<RingRun> run,
                        RingRun::Create(spec, q, k, v, ranks, options));
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<InProcessCommGroup> group,
                        InProcessCommGroup::Create(ranks));
  std::vector<absl::Status> status(ranks);
  {
    std::vector<std::thread> workers;
    workers.reserve(ranks);
    for (int r = 0; r < ranks; ++r) {
      workers.emplace_back([&, r] {
        std::unique_ptr<ThreadPool> pool;
        if (threads_per_rank > 0) pool = std::make_unique<ThreadPool>(threads_per_rank);
        status[r] = run->RunRank(*group->comm(r), pool.get());
      });
    }
    for (std::thread& w : workers) w.join();
  }
  if (stats != nullptr) *stats = run->stats();
  // The rank that failed first reports its own error; the others report the abort it caused,
  // which is the same error prefixed by that rank, or ABORTED from the merge wait.
  for (const absl::Status& s : status) {
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) return s;
  }
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return run->TakeOutputs();
}

}  // namespace attnserve
