#include "core/parallel/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cpu/merge.h"
#include "core/engine/device.h"
#include "core/util/status_macros.h"

namespace attnserve {

absl::StatusOr<KeyShardQuery> PlanKeyShard(const AttentionSpec& spec, const AttentionShape& shape,
                                           int64_t start, int64_t rows) {
  if (IsPacked(spec) || shape.batch != 1 || IsKeyShard(spec)) {
    return absl::InvalidArgumentError(
        "key shards: the request must be one sequence (batch 1, not packed, keys not split "
        "already)");
  }
  const bool dense = std::holds_alternative<DenseSpec>(spec.pattern);
  const auto* window = std::get_if<WindowSpec>(&spec.pattern);
  if (!dense && window == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "spec.", std::string(PatternName(spec.pattern)),
        ": a context sharded over several devices runs dense and window specs only (",
        std::string(PatternName(spec.pattern)),
        " is defined over the whole sequence's blocks or segments); create the context with "
        "shards = 1 to attend it with this spec"));
  }
  const int64_t total = shape.kv_len();
  if (start < 0 || rows < 1 || start > total - rows) {
    return absl::InvalidArgumentError(absl::StrCat("key shards: rows [", start, ", ", start + rows,
                                                   ") outside the ", total, " keys"));
  }
  KeyShardQuery out;
  out.spec = spec;
  out.shape = shape;
  out.shape.kv_tokens = rows;
  const int64_t nq = shape.tokens, q0 = spec.q_offset;
  if (dense && !spec.causal) {  // positions play no part: every query sees every key
    out.q_rows = nq;
    out.spec.q_offset = 0;
    return out;
  }
  // The query positions that may admit a key in [start, end): causal ones at or after the first
  // key, a window's within w of the keys.
  const int64_t end = start + rows;
  const int64_t w = WindowWithin(spec, total + q0 + nq).value_or(0);
  const int64_t lo = spec.causal ? start : start - w;
  const int64_t hi = window != nullptr ? end - 1 + w : std::numeric_limits<int64_t>::max() / 4;
  const int64_t r0 = std::clamp<int64_t>(lo - q0, 0, nq);
  const int64_t r1 = std::clamp<int64_t>(hi - q0 + 1, 0, nq);
  if (r1 <= r0) return out;  // q_rows 0
  out.q_row0 = r0;
  out.q_rows = r1 - r0;
  out.shape.tokens = out.q_rows;
  const int64_t p0 = q0 + r0;
  const int64_t m = std::min(p0, start);
  out.spec.q_offset = p0 - m;
  out.spec.k_offset = start - m;
  out.spec.kv_total = total - m;
  return out;
}

absl::StatusOr<std::unique_ptr<KeyShardMerger>> KeyShardMerger::Create(
    const AttentionShape& shape) {
  if (shape.batch != 1) return absl::InvalidArgumentError("key shards: batch must be 1");
  std::unique_ptr<KeyShardMerger> m(new KeyShardMerger(shape));
  ATTN_ASSIGN_OR_RETURN(
      m->o_, HostTensor::Create(DType::kF32, {1, shape.tokens, shape.q_heads, shape.head_dim}));
  ATTN_ASSIGN_OR_RETURN(m->lse_, HostTensor::Create(DType::kF32, {1, shape.q_heads, shape.tokens}));
  std::fill_n(m->o_.data_as<float>(), m->o_.numel(), 0.f);
  std::fill_n(m->lse_.data_as<float>(), m->lse_.numel(), -std::numeric_limits<float>::infinity());
  return m;
}

void KeyShardMerger::MergeF32(int64_t q_row0, int64_t q_rows, const float* o, const float* lse) {
  const int64_t nq = shape_.tokens, hq = shape_.q_heads, d = shape_.head_dim;
  float* acc_o = o_.data_as<float>();
  float* acc_lse = lse_.data_as<float>();
  for (int64_t h = 0; h < hq; ++h) {
    MergePartialRows(q_rows, d, acc_o + (q_row0 * hq + h) * d, hq * d, acc_lse + h * nq + q_row0, 1,
                     o + h * d, hq * d, lse + h * q_rows, 1);
  }
}

absl::Status KeyShardMerger::Merge(int64_t q_row0, const AttentionOutputs& part) {
  const int64_t hq = shape_.q_heads, d = shape_.head_dim;
  const int64_t q_rows = part.o.numel() / std::max<int64_t>(1, hq * d);
  if (part.o.dims() != std::vector<int64_t>{1, q_rows, hq, d} ||
      part.lse.dims() != std::vector<int64_t>{1, hq, q_rows} || part.lse.dtype() != DType::kF32 ||
      q_row0 < 0 || q_row0 + q_rows > shape_.tokens) {
    return absl::InternalError(absl::StrCat("key shards: a partial of ", part.o.DebugString(),
                                            " / ", part.lse.DebugString(), " at row ", q_row0,
                                            " does not fit the request"));
  }
  if (part.o.dtype() == DType::kF32) {
    MergeF32(q_row0, q_rows, part.o.data_as<float>(), part.lse.data_as<float>());
    return absl::OkStatus();
  }
  std::vector<float> o(static_cast<size_t>(part.o.numel()));
  ConvertToFloat32(part.o.dtype(), part.o.data(), o.data(), o.size());
  MergeF32(q_row0, q_rows, o.data(), part.lse.data_as<float>());
  return absl::OkStatus();
}

absl::StatusOr<AttentionOutputs> KeyShardMerger::Finish(DType dtype, HostMemory* memory) const {
  AttentionOutputs out;
  ATTN_ASSIGN_OR_RETURN(out.o, HostTensor::Create(dtype, o_.dims(), nullptr, memory));
  ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, lse_.dims(), nullptr, memory));
  ConvertFromFloat32(dtype, o_.data_as<float>(), out.o.data(), static_cast<size_t>(o_.numel()));
  std::memcpy(out.lse.data(), lse_.data(), static_cast<size_t>(lse_.nbytes()));
  return out;
}

namespace {

class ContextParallelStrategy final : public GroupStrategy {
 public:
  ContextParallelStrategy(AttentionRequest& request, int ranks)
      : request_(request), ranks_(ranks), parts_(ranks), infos_(ranks) {}

  absl::Status SetUp() override {
    const std::vector<KeyShard>& shards = request_.key_shards;
    if (static_cast<int>(shards.size()) != ranks_) {
      return absl::InternalError(
          absl::StrCat("context parallel: ", shards.size(), " key shards on ", ranks_, " devices"));
    }
    // Rank r is the r-th device in ascending pool order (the scheduler's rank order).
    order_.resize(shards.size());
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::sort(order_.begin(), order_.end(),
              [&](size_t a, size_t b) { return shards[a].device < shards[b].device; });
    for (const KeyShard& s : shards) {
      ATTN_ASSIGN_OR_RETURN(KeyShardQuery plan,
                            PlanKeyShard(request_.spec, request_.shape, s.start, s.rows));
      plans_.push_back(std::move(plan));
    }
    ATTN_ASSIGN_OR_RETURN(merger_, KeyShardMerger::Create(request_.shape));
    return absl::OkStatus();
  }

  absl::Status RunRank(int rank, Device& device, WorkerComms*, RankFigures& figures) override {
    const size_t index = order_[rank];
    const KeyShard& shard = request_.key_shards[index];
    const KeyShardQuery& plan = plans_[index];
    if (plan.q_rows == 0) return absl::OkStatus();  // no query admits a key of this shard
    // The query rows the shard may serve: the request's Q itself, or a copy of those rows.
    HostTensor q;
    const AttentionShape& s = request_.shape;
    const std::vector<int64_t> dims = {1, plan.q_rows, s.q_heads, s.head_dim};
    const int64_t row_bytes =
        s.q_heads * s.head_dim * static_cast<int64_t>(DTypeSize(request_.dtype));
    if (plan.q_rows == s.tokens) {
      ATTN_ASSIGN_OR_RETURN(q, HostTensor::Wrap(request_.dtype, dims, request_.q.data(),
                                                static_cast<size_t>(request_.q.nbytes()), nullptr));
    } else {
      ATTN_ASSIGN_OR_RETURN(
          q, HostTensor::Create(request_.dtype, dims, nullptr, &device.host_memory()));
      std::memcpy(q.data(), request_.q.data() + plan.q_row0 * row_bytes,
                  static_cast<size_t>(plan.q_rows * row_bytes));
    }
    RunInfo& info = infos_[rank];
    if (shard.k_dev.empty()) {
      ATTN_ASSIGN_OR_RETURN(parts_[rank],
                            device.Run(plan.spec, q, shard.k, shard.v, request_.control(), &info));
    } else {
      DeviceIo io;
      io.k = shard.k_dev;
      io.v = shard.v_dev;
      ATTN_ASSIGN_OR_RETURN(
          parts_[rank],
          device.RunWithDeviceIo(plan.spec, plan.shape, request_.dtype, q, HostTensor(),
                                 HostTensor(), io, request_.control(), &info, nullptr));
    }
    figures.tokens = static_cast<double>(plan.q_rows);
    figures.flops = info.flops;
    return absl::OkStatus();
  }

  absl::Status Collect(GroupResult& result) override {
    // In row order, so the sum is the same whichever device finished first.
    for (size_t index = 0; index < plans_.size(); ++index) {
      const int rank =
          static_cast<int>(std::find(order_.begin(), order_.end(), index) - order_.begin());
      if (plans_[index].q_rows == 0) continue;
      ATTN_RETURN_IF_ERROR(merger_->Merge(plans_[index].q_row0, parts_[rank]));
      parts_[rank] = AttentionOutputs();
      if (result.info.engine.empty()) {
        result.info.engine = infos_[rank].engine;
        result.info.kernel = infos_[rank].kernel;
      }
    }
    ATTN_ASSIGN_OR_RETURN(result.outputs, merger_->Finish(request_.dtype, nullptr));
    result.placement = Placement::kContextParallel;
    for (int r = 0; r < ranks_; ++r) result.ranks_used.push_back(r);
    return absl::OkStatus();
  }

 private:
  AttentionRequest& request_;
  const int ranks_;
  std::vector<size_t> order_;            // rank -> index into request_.key_shards
  std::vector<KeyShardQuery> plans_;     // by shard index
  std::vector<AttentionOutputs> parts_;  // by rank, each written by its own worker
  std::vector<RunInfo> infos_;
  std::unique_ptr<KeyShardMerger> merger_;
};

}  // namespace

std::unique_ptr<GroupStrategy> MakeContextParallelHostStrategy(AttentionRequest& request,
                                                               int ranks) {
  return std::make_unique<ContextParallelStrategy>(request, ranks);
}

std::unique_ptr<GroupStrategy> MakeContextParallelStrategy(AttentionRequest& request,
                                                           std::vector<Device*> devices,
                                                           const GroupEnv& env) {
  if (!devices.empty() && devices.front()->kind() == BackendKind::kCuda) {
    return MakeContextParallelGpuStrategy(request, std::move(devices), env);
  }
  return MakeContextParallelHostStrategy(request, static_cast<int>(devices.size()));
}

}  // namespace attnserve
