#include "core/dist/ring.h"

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
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Cuts `units` into `parts` counts, as even as possible, earlier parts taking the remainder.
std::vector<int64_t> EvenCounts(int64_t units, int64_t parts) {
  std::vector<int64_t> counts(parts, units / parts);
  for (int64_t i = 0; i < units % parts; ++i) ++counts[i];
  return counts;
}

// Ranges of `parts` consecutive pieces of [0, n) cut on multiples of `unit`.
std::vector<TokenRange> CutRanges(int64_t n, int64_t parts, int64_t unit) {
  const int64_t units = (n + unit - 1) / unit;
  std::vector<TokenRange> out;
  int64_t u = 0;
  for (int64_t c : EvenCounts(units, parts)) {
    out.push_back({std::min(u * unit, n), std::min((u + c) * unit, n)});
    u += c;
  }
  return out;
}

// Copies `d` elements of row (b, pos, head) of a [B, N, H, D] tensor as raw bytes.
inline const std::byte* RowPtr(const HostTensor& t, int64_t b, int64_t pos, int64_t head) {
  const int64_t n = t.dim(1), h = t.dim(2), d = t.dim(3);
  return t.data() + static_cast<size_t>(((b * n + pos) * h + head) * d) * DTypeSize(t.dtype());
}

}  // namespace

std::vector<std::vector<TokenRange>> SplitSequence(int64_t n, int parts, SplitKind kind,
                                                   int64_t unit) {
  std::vector<std::vector<TokenRange>> out(parts);
  if (kind == SplitKind::kContiguous) {
    std::vector<TokenRange> r = CutRanges(n, parts, unit);
    for (int p = 0; p < parts; ++p) out[p] = {r[p]};
  } else {
    std::vector<TokenRange> chunks = CutRanges(n, 2 * static_cast<int64_t>(parts), unit);
    for (int p = 0; p < parts; ++p) out[p] = {chunks[p], chunks[2 * parts - 1 - p]};
  }
  return out;
}

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
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, run->shape_));
  const AttentionShape& s = run->shape_;
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

  auto all_heads_job = [&](int64_t unit) {
    Job job;
    job.seq_len = s.tokens;
    for (int64_t h = 0; h < s.q_heads; ++h) {
      job.q_heads.push_back(static_cast<int32_t>(h));
      job.pairs.push_back({static_cast<int32_t>(h), static_cast<int32_t>(h / g)});
    }
    for (int64_t h = 0; h < s.kv_heads; ++h) job.kv_heads.push_back(static_cast<int32_t>(h));
    job.split = SplitSequence(s.tokens, ranks, kind, unit);
    job.needs_ring = ranks > 1;
    job.rule.causal = spec.causal;
    return job;
  };

  if (const auto* w = std::get_if<WindowSpec>(&spec.pattern)) {
    Job job = all_heads_job(1);
    job.rule.window = w->size;
    run->jobs_.push_back(std::move(job));
  } else if (std::holds_alternative<DenseSpec>(spec.pattern)) {
    run->jobs_.push_back(all_heads_job(1));
  } else if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    ATTN_ASSIGN_OR_RETURN(CompiledPattern compiled,
                          CompilePattern(spec, s.tokens, s.q_heads, options.compile));
    run->compiled_ = std::move(compiled);
    Job job = all_heads_job(bs->block_size);
    job.layout = &run->compiled_->layout;  // run is heap-allocated: the address is stable
    run->jobs_.push_back(std::move(job));
  } else {
    ATTN_ASSIGN_OR_RETURN(CompiledPattern compiled,
                          CompilePattern(spec, s.tokens, s.q_heads, options.compile));
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
        for (int64_t h = group.offset; h < s.q_heads; h += branch.rate) {
          const auto kvh = static_cast<int32_t>(h / g);
          if (job.kv_heads.empty() || job.kv_heads.back() != kvh) job.kv_heads.push_back(kvh);
          job.pairs.push_back({static_cast<int32_t>(job.q_heads.size()),
                               static_cast<int32_t>(job.kv_heads.size() - 1)});
          job.q_heads.push_back(static_cast<int32_t>(h));
        }
        job.rule.causal = spec.causal;
        const int64_t segments = static_cast<int64_t>(job.segment_starts.size()) - 1;
        if (segments >= ranks) {
          // Whole segments per rank, cut at the segment boundary nearest each even share: no
          // key ever leaves its rank.
          job.needs_ring = false;
          job.split.resize(ranks);
          int64_t prev = 0;
          for (int p = 0; p < ranks; ++p) {
            int64_t end = job.seq_len;
            if (p + 1 < ranks) {
              const int64_t target = job.seq_len * (p + 1) / ranks;
              auto it =
                  std::lower_bound(job.segment_starts.begin(), job.segment_starts.end(), target);
              end = *it;
              if (it != job.segment_starts.begin() && target - *(it - 1) < *it - target) {
                end = *(it - 1);
              }
              end = std::max(end, prev);
            }
            job.split[p] = {{prev, end}};
            prev = end;
          }
        } else {
          job.needs_ring = ranks > 1;
          job.split = SplitSequence(job.seq_len, ranks, kind, 1);
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

absl::Status RingRun::RunJob(Communicator& comm, ThreadPool* pool, size_t job_index,
                             RingRankStats& stats) {
  const Job& job = jobs_[job_index];
  const AttentionShape& s = shape_;
  const int p = comm.rank();
  const int P = ranks_;
  const int64_t B = s.batch, D = s.head_dim;
  const int64_t hq = static_cast<int64_t>(job.q_heads.size());
  const int64_t hkv = static_cast<int64_t>(job.kv_heads.size());
  const size_t esize = DTypeSize(dtype_);
  auto rows_of = [&](int rank) {
    int64_t n = 0;
    for (const TokenRange& r : job.split[rank]) n += r.size();
    return n;
  };
  auto position = [&](int64_t i) { return job.positions.empty() ? i : job.positions[i]; };
  const int64_t nq = rows_of(p);
  int64_t max_kv_rows = 0;
  for (int r = 0; r < P; ++r) max_kv_rows = std::max(max_kv_rows, rows_of(r));
  // One K/V shard travels as one message: K [B, n, hkv, D] then V [B, n, hkv, D], input dtype.
  auto shard_bytes = [&](int rank) {
    return static_cast<int64_t>(2 * B * rows_of(rank) * hkv * D * esize);
  };

  // This rank's query shard in float32, and its own K/V shard (the first "visiting" one).
  ATTN_ASSIGN_OR_RETURN(HostTensor q_shard,
                        HostTensor::Create(DType::kF32, {B, nq, hq, D}, options_.tracker));
  ATTN_ASSIGN_OR_RETURN(HostTensor kv_cur,
                        HostTensor::Create(dtype_, {2, B, max_kv_rows, hkv, D}, options_.tracker));
  ATTN_ASSIGN_OR_RETURN(HostTensor kv_next,
                        HostTensor::Create(dtype_, {job.needs_ring ? 2 : 0, B, max_kv_rows, hkv, D},
                                           options_.tracker));
  {
    float* qd = q_shard.data_as<float>();
    std::byte* kd = kv_cur.data();
    std::byte* vd = kd + static_cast<size_t>(B * nq * hkv * D) * esize;
    for (int64_t b = 0; b < B; ++b) {
      int64_t row = 0;
      for (const TokenRange& r : job.split[p]) {
        for (int64_t i = r.begin; i < r.end; ++i, ++row) {
          const int64_t pos = position(i);
          for (int64_t h = 0; h < hq; ++h) {
            ConvertToFloat32(dtype_, RowPtr(*q_, b, pos, job.q_heads[h]),
                             qd + ((b * nq + row) * hq + h) * D, D);
          }
          for (int64_t h = 0; h < hkv; ++h) {
            const size_t off = static_cast<size_t>(((b * nq + row) * hkv + h) * D) * esize;
            std::memcpy(kd + off, RowPtr(*k_, b, pos, job.kv_heads[h]), D * esize);
            std::memcpy(vd + off, RowPtr(*v_, b, pos, job.kv_heads[h]), D * esize);
          }
        }
      }
    }
  }
  ATTN_ASSIGN_OR_RETURN(HostTensor acc_o,
                        HostTensor::Create(DType::kF32, {B, nq, hq, D}, options_.tracker));
  ATTN_ASSIGN_OR_RETURN(HostTensor acc_lse,
                        HostTensor::Create(DType::kF32, {B, hq, nq}, options_.tracker));
  std::fill_n(acc_o.data_as<float>(), acc_o.numel(), 0.f);
  std::fill_n(acc_lse.data_as<float>(), acc_lse.numel(), kNegInf);
  // Float32 copy of a visiting shard (only when the wire dtype is not float32).
  HostTensor kv_f32;
  if (dtype_ != DType::kF32) {
    ATTN_ASSIGN_OR_RETURN(
        kv_f32, HostTensor::Create(DType::kF32, {2, B, max_kv_rows, hkv, D}, options_.tracker));
  }

  CpuRunOptions piece_options;
  piece_options.pool = pool;
  piece_options.cancel = options_.cancel;

  const int steps = job.needs_ring ? P : 1;
  for (int t = 0; t < steps; ++t) {
    const int src = (p - t + P) % P;  // whose K/V shard kv_cur holds
    PendingTransfer pending;
    if (t + 1 < steps) {
      // Started before this step's compute, waited for after it: the transfer overlaps compute.
      const int next_src = (p - t - 1 + P) % P;
      ATTN_ASSIGN_OR_RETURN(
          pending, comm.StartSendRecv(kv_cur.data(), shard_bytes(src), (p + 1) % P, kv_next.data(),
                                      shard_bytes(next_src), (p - 1 + P) % P));
    }
    const int64_t nkv = rows_of(src);
    const float* kf;
    if (dtype_ == DType::kF32) {
      kf = kv_cur.data_as<float>();
    } else {
      ConvertToFloat32(dtype_, kv_cur.data(), kv_f32.data_as<float>(),
                       static_cast<size_t>(2 * B * nkv * hkv * D));
      kf = kv_f32.data_as<float>();
    }
    CpuPieceArgs args;
    args.batch = B;
    args.head_dim = D;
    args.q = q_shard.data_as<float>();
    args.q_rows = nq;
    args.q_heads = hq;
    args.k = kf;
    args.v = kf + B * nkv * hkv * D;
    args.kv_rows = nkv;
    args.kv_heads = hkv;
    args.heads = job.pairs;
    args.acc_o = acc_o.data_as<float>();
    args.acc_lse = acc_lse.data_as<float>();
    int64_t q_row0 = 0;
    for (const TokenRange& qr : job.split[p]) {
      int64_t k_row0 = 0;
      for (const TokenRange& kr : job.split[src]) {
        if (qr.size() > 0 && kr.size() > 0) {
          RectLayout layout;
          if (job.layout != nullptr) {
            ATTN_ASSIGN_OR_RETURN(
                layout, SliceBlockLayout(*job.layout, qr.begin, qr.end, kr.begin, kr.end));
          } else {
            layout =
                RectLayoutFromRule(job.rule, qr.begin, qr.end, kr.begin, kr.end, options_.tile);
          }
          if (layout.kept_tiles() == 0) {
            ++stats.skipped_pieces;
          } else {
            stats.kept_tiles += layout.kept_tiles();
            stats.admitted_pairs +=
                layout.AdmittedPairs() * B * static_cast<int64_t>(job.pairs.size());
            args.q_row0 = q_row0;
            args.k_row0 = k_row0;
            ATTN_RETURN_IF_ERROR(CpuAttentionPiece(spec_, layout, args, piece_options));
          }
        }
        k_row0 += kr.size();
      }
      q_row0 += qr.size();
    }
    ++stats.steps;
    if (absl::Now() >= options_.deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("ring rank ", p, ": deadline passed at step ", t, " of ", steps));
    }
    if (pending.valid()) {
      ATTN_RETURN_IF_ERROR(comm.Wait(std::move(pending), MakeWaitOptions()));
      std::swap(kv_cur, kv_next);
    }
  }

  ATTN_RETURN_IF_ERROR(WaitForMergeTurn(job_index));
  ATTN_RETURN_IF_ERROR(MergeJobRows(job_index, p, acc_o, acc_lse, nq));
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
    for (const TokenRange& r : job.split[rank]) {
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

// ---------------------------------------------------------------------------------------------

DataParallelSplit SplitDataParallel(const AttentionSpec& spec, const AttentionShape& shape,
                                    int devices) {
  DataParallelSplit split;
  const int64_t g = shape.q_heads / std::max<int64_t>(1, shape.kv_heads);
  int64_t c = 1;
  if (const auto* d = std::get_if<DilatedSpec>(&spec.pattern)) {
    c = shape.kv_heads;
    for (int64_t cand = 1; cand <= shape.kv_heads; ++cand) {
      if (shape.kv_heads % cand != 0) continue;
      bool ok = true;
      for (int64_t r : d->dilation_rates) ok = ok && r > 0 && (cand * g) % r == 0;
      if (ok) {
        c = cand;
        break;
      }
    }
  }
  split.kv_heads_per_unit = c;
  split.units = shape.batch * (shape.kv_heads / c);
  if (devices >= 1) {
    std::vector<TokenRange> r = CutRanges(split.units, devices, 1);
    split.per_device = std::move(r);
  }
  return split;
}

absl::StatusOr<AttentionOutputs> DataParallelAttention(const AttentionSpec& spec,
                                                       const HostTensor& q, const HostTensor& k,
                                                       const HostTensor& v, int devices,
                                                       const DeviceAttentionFn& fn,
                                                       MemoryTracker* tracker) {
  if (devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data parallel: devices must be >= 1, got ", devices));
  }
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, s));
  const DataParallelSplit split = SplitDataParallel(spec, s, devices);
  const int64_t c = split.kv_heads_per_unit;
  const int64_t g = s.q_heads / s.kv_heads;
  const int64_t blocks = s.kv_heads / c;  // units per batch item
  const int64_t N = s.tokens, D = s.head_dim;
  const size_t esize = DTypeSize(q.dtype());
  const size_t q_row_bytes = static_cast<size_t>(c * g * D) * esize;
  const size_t kv_row_bytes = static_cast<size_t>(c * D) * esize;

  ATTN_ASSIGN_OR_RETURN(HostTensor o,
                        HostTensor::Create(q.dtype(), {s.batch, N, s.q_heads, D}, tracker));
  ATTN_ASSIGN_OR_RETURN(HostTensor lse,
                        HostTensor::Create(DType::kF32, {s.batch, s.q_heads, N}, tracker));
  std::vector<absl::Status> status(devices);
  std::vector<std::thread> workers;
  for (int dev = 0; dev < devices; ++dev) {
    const TokenRange units = split.per_device[dev];
    if (units.size() == 0) continue;
    workers.emplace_back([&, dev, units] {
      status[dev] = [&]() -> absl::Status {
        const int64_t U = units.size();
        ATTN_ASSIGN_OR_RETURN(HostTensor qs,
                              HostTensor::Create(q.dtype(), {U, N, c * g, D}, tracker));
        ATTN_ASSIGN_OR_RETURN(HostTensor ks, HostTensor::Create(q.dtype(), {U, N, c, D}, tracker));
        ATTN_ASSIGN_OR_RETURN(HostTensor vs, HostTensor::Create(q.dtype(), {U, N, c, D}, tracker));
        for (int64_t u = 0; u < U; ++u) {
          const int64_t b = (units.begin + u) / blocks;
          const int64_t kv0 = (units.begin + u) % blocks * c;
          for (int64_t n = 0; n < N; ++n) {
            std::memcpy(qs.data() + (u * N + n) * q_row_bytes, RowPtr(q, b, n, kv0 * g),
                        q_row_bytes);
            std::memcpy(ks.data() + (u * N + n) * kv_row_bytes, RowPtr(k, b, n, kv0), kv_row_bytes);
            std::memcpy(vs.data() + (u * N + n) * kv_row_bytes, RowPtr(v, b, n, kv0), kv_row_bytes);
          }
        }
        ATTN_ASSIGN_OR_RETURN(AttentionOutputs part, fn(dev, spec, qs, ks, vs));
        if (part.o.dims() != qs.dims() || part.o.dtype() != q.dtype() ||
            part.lse.dims() != std::vector<int64_t>{U, c * g, N}) {
          return absl::InternalError(absl::StrCat("data parallel: device ", dev, " returned O ",
                                                  part.o.DebugString(), " and LSE ",
                                                  part.lse.DebugString()));
        }
        for (int64_t u = 0; u < U; ++u) {
          const int64_t b = (units.begin + u) / blocks;
          const int64_t h0 = (units.begin + u) % blocks * c * g;
          for (int64_t n = 0; n < N; ++n) {
            std::memcpy(const_cast<std::byte*>(RowPtr(o, b, n, h0)),
                        part.o.data() + (u * N + n) * q_row_bytes, q_row_bytes);
          }
          for (int64_t h = 0; h < c * g; ++h) {
            std::memcpy(lse.data_as<float>() + (b * s.q_heads + h0 + h) * N,
                        part.lse.data_as<float>() + (u * c * g + h) * N, N * sizeof(float));
          }
        }
        return absl::OkStatus();
      }();
    });
  }
  for (std::thread& w : workers) w.join();
  for (const absl::Status& st : status) ATTN_RETURN_IF_ERROR(st);
  return AttentionOutputs{std::move(o), std::move(lse)};
}

}  // namespace attnserve
