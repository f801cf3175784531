#include "core/parallel/dilated_ring.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/cpu/merge.h"
#include "core/util/check.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t CeilDivPos(int64_t a, int64_t b) { return a <= 0 ? 0 : (a - 1) / b + 1; }

// Row (b, pos, head) of a [B, N, H, D] tensor.
inline const std::byte* RowPtr(const HostTensor& t, int64_t b, int64_t pos, int64_t head) {
  const int64_t n = t.dim(1), h = t.dim(2), d = t.dim(3);
  return t.data() + static_cast<size_t>(((b * n + pos) * h + head) * d) * DTypeSize(t.dtype());
}

// [B, end - begin, heads.size(), D] of gathered rows [begin, end) of `job`, in t's dtype.
absl::StatusOr<HostTensor> Gather(const HostTensor& t, const DilatedRingJob& job, int64_t begin,
                                  int64_t end, const std::vector<int32_t>& heads) {
  const int64_t B = t.dim(0), D = t.dim(3), n = end - begin;
  const int64_t h = static_cast<int64_t>(heads.size());
  const size_t row = static_cast<size_t>(D) * DTypeSize(t.dtype());
  ATTN_ASSIGN_OR_RETURN(HostTensor out, HostTensor::Create(t.dtype(), {B, n, h, D}));
  std::byte* dst = out.data();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t pos = job.Position(i);
      for (int64_t j = 0; j < h; ++j, dst += row)
        std::memcpy(dst, RowPtr(t, b, pos, heads[j]), row);
    }
  }
  return out;
}

// Float32 accumulators of the final outputs, merged into job by job.
struct Accumulator {
  HostTensor o;    // [B, N, Hq, D] f32
  HostTensor lse;  // [B, Hq, N] f32
};

// Checks `part` (the outputs of gathered rows [begin, end) of `job`) and LSE-merges it into acc.
// Rows of one job are distinct (position, head) pairs, so parts of one job may merge concurrently.
absl::Status MergeJob(const DilatedRingJob& job, int64_t begin, int64_t end,
                      const AttentionOutputs& part, DType dtype, Accumulator& acc,
                      std::string_view who) {
  const int64_t B = acc.o.dim(0), N = acc.o.dim(1), H = acc.o.dim(2), D = acc.o.dim(3);
  const int64_t n = end - begin;
  const int64_t hq = static_cast<int64_t>(job.q_heads.size());
  if (part.o.dtype() != dtype || part.o.dims() != std::vector<int64_t>{B, n, hq, D} ||
      part.lse.dtype() != DType::kF32 || part.lse.dims() != std::vector<int64_t>{B, hq, n}) {
    return absl::InternalError(absl::StrCat(
        "dilated ring: ", std::string(who), " returned O ", part.o.DebugString(), " and LSE ",
        part.lse.DebugString(), " for ", n, " gathered positions of branch ", job.branch,
        " offset ", job.offset, " (", hq, " query heads, ", std::string(DTypeName(dtype)), ")"));
  }
  std::vector<float> row(D);
  const size_t esize = DTypeSize(dtype);
  float* out_o = acc.o.data_as<float>();
  float* out_lse = acc.lse.data_as<float>();
  const float* in_lse = part.lse.data_as<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = job.Position(begin + i);
      for (int64_t j = 0; j < hq; ++j) {
        const int64_t gh = job.q_heads[j];
        ConvertToFloat32(dtype,
                         part.o.data() + static_cast<size_t>(((b * n + i) * hq + j) * D) * esize,
                         row.data(), D);
        MergePartialRows(1, D, out_o + ((b * N + pos) * H + gh) * D, D,
                         out_lse + (b * H + gh) * N + pos, 1, row.data(), D,
                         in_lse + (b * hq + j) * n + i, 1);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<DilatedRingJob>> PlanDilatedRing(const AttentionSpec& spec,
                                                            const AttentionShape& shape, int ranks,
                                                            int32_t block_size) {
  ATTN_DCHECK_OK(ValidateSpec(spec, shape));  // validated where the request entered
  // Jobs gather one position list for queries and keys alike.
  if (!IsSquare(spec, shape)) {
    return absl::UnimplementedError(absl::StrCat(
        "dilated ring: not yet for Nq != Nkv, a query offset or packed sequences (", shape.tokens,
        " queries at offset ", spec.q_offset, " against ", shape.kv_len(), " keys",
        IsPacked(spec) ? ", packed" : "", "); run it on one device"));
  }
  const auto* dil = std::get_if<DilatedSpec>(&spec.pattern);
  if (dil == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dilated ring: spec.pattern is ", std::string(PatternName(spec.pattern)), ", not dilated"));
  }
  if (ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dilated ring: ranks must be >= 1, got ", ranks));
  }
  if (std::find(std::begin(kSupportedBlockSizes), std::end(kSupportedBlockSizes), block_size) ==
      std::end(kSupportedBlockSizes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dilated ring: block_size must be 64 or 128, got ", block_size));
  }
  const int64_t N = shape.tokens, Hq = shape.q_heads, g = shape.q_heads / shape.kv_heads;
  std::vector<DilatedRingJob> jobs;
  int64_t short_jobs = 0;  // jobs too short for a ring, run whole on rank short_jobs % ranks
  for (size_t k = 0; k < dil->segment_lengths.size(); ++k) {
    const int64_t w = dil->segment_lengths[k], r = dil->dilation_rates[k];
    const int64_t T = CeilDivPos(N, w);  // segments, the last possibly short
    for (int64_t o = 0; o < std::min(r, Hq); ++o) {
      DilatedRingJob base;
      base.branch = static_cast<int>(k);
      base.segment_length = w;
      base.rate = r;
      base.offset = o;
      base.seg_len = CeilDivPos(w - o, r);  // >= 1: validation keeps r <= w, so o < w
      const int64_t last_len = N - (T - 1) * w;
      const int64_t last_count = CeilDivPos(last_len - o, r);
      base.seq_len = (T - 1) * base.seg_len + last_count;
      base.segments = (T - 1) + (last_count > 0 ? 1 : 0);
      if (base.seq_len == 0) continue;  // N <= o: nothing to gather

      // The group's query heads as runs sharing one KV head; a job needs every run equally long
      // (plain GQA after renumbering), so runs are bucketed by length, first appearance first.
      std::vector<std::pair<int64_t, std::vector<int32_t>>> runs;  // (kv head, q heads)
      for (const int64_t h : DilatedGroupHeads(Hq, r, o)) {
        const int64_t kv = h / g;
        if (runs.empty() || runs.back().first != kv) runs.push_back({kv, {}});
        runs.back().second.push_back(static_cast<int32_t>(h));
      }
      std::vector<size_t> lengths;
      for (const auto& run : runs) {
        if (std::find(lengths.begin(), lengths.end(), run.second.size()) == lengths.end()) {
          lengths.push_back(run.second.size());
        }
      }
      for (size_t len : lengths) {
        DilatedRingJob job = base;
        for (const auto& run : runs) {
          if (run.second.size() != len) continue;
          job.kv_heads.push_back(static_cast<int32_t>(run.first));
          job.q_heads.insert(job.q_heads.end(), run.second.begin(), run.second.end());
        }
        // q_heads ascend (runs ascend by KV head), so q_heads[i] reads kv_heads[i / len].
        job.local = job.segments >= ranks;
        if (job.local) {
          int64_t seg = 0;
          for (int p = 0; p < ranks; ++p) {
            const int64_t count = job.segments / ranks + (p < job.segments % ranks ? 1 : 0);
            job.parts.push_back({std::min(seg * job.seg_len, job.seq_len),
                                 std::min((seg + count) * job.seg_len, job.seq_len)});
            seg += count;
          }
        } else if (NumBlocks(job.seq_len, block_size) < ranks) {
          // Fewer blocks than ranks: a ring would leave ranks without a single token, so the
          // whole job runs on one rank, the short jobs taking the ranks in turn.
          job.local = true;
          job.parts.assign(ranks, TokenRange{});
          job.parts[short_jobs++ % ranks] = {0, job.seq_len};
        } else if (job.segments > 1 && job.seg_len % block_size != 0) {
          return absl::UnimplementedError(absl::StrCat(
              "dilated ring: spec.dilated.segment_lengths[", k, "] = ", w, " with dilation_rates[",
              k, "] = ", r, " gathers segments of ", job.seg_len, " positions for head offset ", o,
              "; its ", job.segments, " segments are fewer than the ", ranks,
              " ranks, so they run as one ring whose block-diagonal layout needs segment "
              "boundaries on multiples of block_size ",
              block_size, " (choose segment_lengths / dilation_rates a multiple of ", block_size,
              ", or fewer ranks)"));
        }
        jobs.push_back(std::move(job));
      }
    }
  }
  return jobs;
}

absl::StatusOr<AttentionSpec> DilatedJobSpec(const AttentionSpec& spec, const DilatedRingJob& job,
                                             int64_t tokens, bool for_ring, int32_t block_size) {
  AttentionSpec out;
  out.causal = spec.causal;
  out.scale = spec.scale;
  if (tokens <= job.seg_len) {
    out.pattern = DenseSpec{};
  } else if (!for_ring) {
    out.pattern = DilatedSpec{{job.seg_len}, {1}};
  } else {
    if (job.seg_len % block_size != 0) {
      return absl::UnimplementedError(
          absl::StrCat("dilated ring: gathered segments of ", job.seg_len,
                       " positions are not a multiple of block_size ", block_size));
    }
    // Block-diagonal: query block i keeps the key blocks of its own segment (only those up to i
    // when causal; the token-level causal mask does the rest on the diagonal).
    const int64_t nb = NumBlocks(tokens, block_size);
    const int64_t per_seg = job.seg_len / block_size;
    CsrGen csr;
    csr.row_ptr.reserve(nb + 1);
    csr.row_ptr.push_back(0);
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t first = i / per_seg * per_seg;
      const int64_t last = spec.causal ? i : std::min(first + per_seg, nb) - 1;
      for (int64_t j = first; j <= last; ++j) csr.col_idx.push_back(j);
      csr.row_ptr.push_back(static_cast<int64_t>(csr.col_idx.size()));
    }
    BlockSparseSpec bs;
    bs.block_size = block_size;
    bs.generator = std::move(csr);
    out.pattern = std::move(bs);
  }
  return out;
}

absl::StatusOr<AttentionOutputs> DilatedRingAttention(const AttentionSpec& spec,
                                                      const HostTensor& q, const HostTensor& k,
                                                      const HostTensor& v, int ranks,
                                                      int32_t block_size, const DilatedRingFn& ring,
                                                      const DilatedLocalFn& local,
                                                      DilatedRingStats* stats) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  ATTN_ASSIGN_OR_RETURN(const std::vector<DilatedRingJob> jobs,
                        PlanDilatedRing(spec, s, ranks, block_size));
  if (!ring || !local) {
    return absl::InvalidArgumentError("dilated ring: the ring and local functions must be set");
  }
  const DType dtype = q.dtype();
  const int64_t B = s.batch, N = s.tokens, H = s.q_heads, D = s.head_dim;
  Accumulator acc;
  ATTN_ASSIGN_OR_RETURN(acc.o, HostTensor::Create(DType::kF32, {B, N, H, D}));
  ATTN_ASSIGN_OR_RETURN(acc.lse, HostTensor::Create(DType::kF32, {B, H, N}));
  std::fill_n(acc.o.data_as<float>(), acc.o.numel(), 0.f);
  std::fill_n(acc.lse.data_as<float>(), acc.lse.numel(), kNegInf);
  DilatedRingStats st;

  for (const DilatedRingJob& job : jobs) {
    if (job.local) {
      ++st.local_jobs;
      std::vector<absl::Status> status(ranks);
      auto run_part = [&](int p) -> absl::Status {
        const TokenRange part = job.parts[p];
        ATTN_ASSIGN_OR_RETURN(AttentionSpec part_spec,
                              DilatedJobSpec(spec, job, part.size(), false, block_size));
        ATTN_ASSIGN_OR_RETURN(HostTensor qs, Gather(q, job, part.begin, part.end, job.q_heads));
        ATTN_ASSIGN_OR_RETURN(HostTensor ks, Gather(k, job, part.begin, part.end, job.kv_heads));
        ATTN_ASSIGN_OR_RETURN(HostTensor vs, Gather(v, job, part.begin, part.end, job.kv_heads));
        ATTN_ASSIGN_OR_RETURN(AttentionOutputs out, local(p, part_spec, qs, ks, vs));
        return MergeJob(job, part.begin, part.end, out, dtype, acc,
                        absl::StrCat("local run of rank ", p));
      };
      std::vector<std::thread> workers;
      for (int p = 1; p < ranks; ++p) {
        if (job.parts[p].size() > 0) workers.emplace_back([&, p] { status[p] = run_part(p); });
      }
      if (job.parts[0].size() > 0) status[0] = run_part(0);  // rank 0 on the calling thread
      for (std::thread& w : workers) w.join();
      for (const absl::Status& r : status) ATTN_RETURN_IF_ERROR(r);
    } else {
      ++st.ring_jobs;
      ATTN_ASSIGN_OR_RETURN(AttentionSpec job_spec,
                            DilatedJobSpec(spec, job, job.seq_len, true, block_size));
      ATTN_ASSIGN_OR_RETURN(HostTensor qs, Gather(q, job, 0, job.seq_len, job.q_heads));
      ATTN_ASSIGN_OR_RETURN(HostTensor ks, Gather(k, job, 0, job.seq_len, job.kv_heads));
      ATTN_ASSIGN_OR_RETURN(HostTensor vs, Gather(v, job, 0, job.seq_len, job.kv_heads));
      ATTN_ASSIGN_OR_RETURN(AttentionOutputs out, ring(job_spec, qs, ks, vs));
      ATTN_RETURN_IF_ERROR(MergeJob(job, 0, job.seq_len, out, dtype, acc, "the ring"));
      st.ring_bytes_moved += static_cast<int64_t>(ks.nbytes() + vs.nbytes()) * (ranks - 1);
    }
  }

  if (stats != nullptr) *stats = st;
  AttentionOutputs result;
  if (dtype == DType::kF32) {
    result.o = std::move(acc.o);
  } else {
    ATTN_ASSIGN_OR_RETURN(result.o, HostTensor::Create(dtype, {B, N, H, D}));
    result.o.FromFloat32(acc.o.data_as<float>());
  }
  result.lse = std::move(acc.lse);
  return result;
}

}  // namespace attnserve
