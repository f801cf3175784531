// Context-parallel attends on GPUs (CUDA + NCCL builds): each GPU's worker uploads the query rows
// its shard may serve, runs them against the shard's K/V in place (CudaAttentionPlan on the
// device's allocator and stream), and sends its partial O and LSE over the group's NCCL
// communicator to the GPU holding the context's first rows, which LSE-merges every partial into
// float32 accumulators (LaunchLseMergeInto) in shard order and copies the result to host memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/host_copy.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/nccl_groups.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// Bound of a rank's NCCL communicator creation and of each transfer (further bounded by the
// request's deadline): the ranks start together, so peers join within milliseconds.
constexpr absl::Duration kCommTimeout = absl::Seconds(60);

class ContextParallelGpuStrategy final : public GroupStrategy {
 public:
  ContextParallelGpuStrategy(AttentionRequest& request, std::vector<Device*> devices,
                             const GroupEnv& env)
      : request_(request), devices_(std::move(devices)), env_(env) {}

  absl::Status SetUp() override {
    const std::vector<KeyShard>& shards = request_.key_shards;
    const int ranks = static_cast<int>(devices_.size());
    if (static_cast<int>(shards.size()) != ranks) {
      return absl::InternalError(
          absl::StrCat("context parallel: ", shards.size(), " key shards on ", ranks, " GPUs"));
    }
    // Rank r is the r-th device in ascending pool order (the scheduler's rank order).
    order_.resize(shards.size());
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::sort(order_.begin(), order_.end(),
              [&](size_t a, size_t b) { return shards[a].device < shards[b].device; });
    for (int r = 0; r < ranks; ++r) {
      const KeyShard& s = shards[order_[r]];
      if (s.k_dev.empty() || s.k_dev.cuda_ordinal != devices_[r]->cuda_ordinal()) {
        return absl::InternalError(absl::StrCat("context parallel: rank ", r, " on ",
                                                devices_[r]->name(),
                                                " does not hold its shard's rows"));
      }
      ordinals_.push_back(devices_[r]->cuda_ordinal());
      if (s.start == 0) root_ = r;
    }
    for (const KeyShard& s : shards) {
      ATTN_ASSIGN_OR_RETURN(KeyShardQuery plan,
                            PlanKeyShard(request_.spec, request_.shape, s.start, s.rows));
      plans_.push_back(std::move(plan));
    }
    if (env_.nccl_groups == nullptr) {
      return absl::InternalError("context parallel: no NCCL group cache");
    }
    ATTN_ASSIGN_OR_RETURN(NcclGroups::Lease lease, env_.nccl_groups->Acquire(ordinals_));
    if (lease.created && env_.on_nccl_group_created) env_.on_nccl_group_created();
    nccl_group_ = std::move(lease.group);
    nccl_generation_ = lease.generation;
    kernel_seconds_.assign(ranks, 0.0);
    return absl::OkStatus();
  }

  absl::Status RunRank(int rank, Device& device, WorkerComms* comms,
                       RankFigures& figures) override {
    if (nccl_group_ == nullptr || comms == nullptr) {
      return absl::InternalError("context parallel: rank started without its set-up");
    }
    absl::Duration timeout = kCommTimeout;
    if (const absl::Duration left = request_.deadline - absl::Now(); left < timeout) {
      timeout = std::max(left, absl::Seconds(1));
    }
    bool created = false;
    const absl::Status st = device.RunTask(0, [&](DeviceContext& ctx) -> absl::Status {
      ATTN_ASSIGN_OR_RETURN(
          NcclCommunicator * comm,
          comms->Get(ordinals_, nccl_group_, nccl_generation_, rank, ctx, timeout, &created));
      return RunOnDevice(rank, ctx, *comm, timeout, figures);
    });
    if (created && env_.on_nccl_comm_created) env_.on_nccl_comm_created(rank);
    return st;
  }

  void Abort(const absl::Status& status) override {
    if (nccl_group_ != nullptr) nccl_group_->Abort(status);
  }

  absl::Status Collect(GroupResult& result) override {
    result.outputs = std::move(outputs_);
    result.info.engine = "flash_fwd";
    result.placement = Placement::kContextParallel;
    // The shards' kernels run at the same time: the request's kernel time is the longest.
    for (double s : kernel_seconds_) {
      result.info.kernel_seconds = std::max(result.info.kernel_seconds, s);
    }
    for (int r = 0; r < static_cast<int>(devices_.size()); ++r) result.ranks_used.push_back(r);
    return absl::OkStatus();
  }

 private:
  // The partial of one shard on this device: O [q_rows, Hq, D] in `dtype`, LSE [Hq, q_rows].
  struct Partial {
    DeviceBuffer o, lse;
  };

  absl::StatusOr<Partial> Compute(int rank, const KeyShard& shard, const KeyShardQuery& plan,
                                  DeviceContext& ctx, RankFigures& figures) {
    const AttentionShape& s = request_.shape;
    const int64_t es = static_cast<int64_t>(DTypeSize(request_.dtype));
    const int64_t row = s.q_heads * s.head_dim * es;
    Partial p;
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Create(*ctx.allocator, plan.q_rows * row));
    ATTN_ASSIGN_OR_RETURN(p.o, DeviceBuffer::Create(*ctx.allocator, plan.q_rows * row));
    ATTN_ASSIGN_OR_RETURN(p.lse, DeviceBuffer::Create(*ctx.allocator, s.q_heads * plan.q_rows * 4));
    RunEvents events;  // the shard's kernel time, as a single-device run reports its own
    ATTN_RETURN_IF_ERROR(events.Init());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.inputs_start(), ctx.stream));
    ATTN_RETURN_IF_ERROR(CopyToDevice(q.get(), request_.q.data() + plan.q_row0 * row,
                                      static_cast<size_t>(plan.q_rows * row), ctx.stream,
                                      ctx.copies));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.inputs_done(), ctx.stream));
    CudaAttentionPlan::Options options;
    options.kernel = env_.cuda.flash;
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<CudaAttentionPlan> attention,
                          CudaAttentionPlan::Create(plan.spec, plan.shape, request_.dtype,
                                                    *ctx.allocator, ctx.stream, nullptr, options));
    ATTN_RETURN_IF_ERROR(attention->Run(q.get(), shard.k_dev.data, shard.v_dev.data, p.o.get(),
                                        p.lse.as<float>(), ctx.stream, &request_.cancel));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.kernels_done(), ctx.stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events.outputs_done(), ctx.stream));
    figures.flops = attention->flops();
    figures.tokens = static_cast<double>(plan.q_rows);
    // The plan's buffers and Q go back to the allocator only once the kernels are done.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    double copy_seconds = 0;
    events.Read(&copy_seconds, &kernel_seconds_[rank]);
    return p;
  }

  // Merges a partial into the accumulators: f32 partials (f32 requests, computed in bf16 and so
  // exactly representable there) go through a bf16 copy, as the merge kernel reads bf16/f16.
  absl::Status MergeInto(const KeyShardQuery& plan, const Partial& p, float* acc_o, float* acc_lse,
                         DeviceContext& ctx) {
    const AttentionShape& s = request_.shape;
    const void* o = p.o.get();
    DType o_dtype = request_.dtype;
    DeviceBuffer bf16;
    if (o_dtype == DType::kF32) {
      const int64_t n = plan.q_rows * s.q_heads * s.head_dim;
      ATTN_ASSIGN_OR_RETURN(bf16, DeviceBuffer::Create(*ctx.allocator, n * 2));
      CUDA_RETURN_IF_ERROR(
          LaunchConvert(DType::kF32, p.o.get(), DType::kBF16, bf16.get(), n, ctx.stream));
      o = bf16.get();
      o_dtype = DType::kBF16;
    }
    CUDA_RETURN_IF_ERROR(LaunchLseMergeInto(
        o_dtype, o, p.lse.as<float>(), acc_o + plan.q_row0 * s.q_heads * s.head_dim,
        acc_lse + plan.q_row0, 1, plan.q_rows, s.q_heads, s.head_dim,
        s.tokens * s.q_heads * s.head_dim, s.q_heads * s.tokens, s.tokens, ctx.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));  // before `bf16` is released
    return absl::OkStatus();
  }

  absl::Status RunOnDevice(int rank, DeviceContext& ctx, Communicator& comm, absl::Duration timeout,
                           RankFigures& figures) {
    const size_t index = order_[rank];
    const KeyShardQuery& plan = plans_[index];
    const AttentionShape& s = request_.shape;
    const int64_t es = static_cast<int64_t>(DTypeSize(request_.dtype));
    const WaitOptions wait{timeout, &request_.cancel};
    Partial own;
    if (plan.q_rows > 0) {
      ATTN_ASSIGN_OR_RETURN(own,
                            Compute(rank, request_.key_shards[index], plan, ctx, figures));
    }
    const auto bytes = [&](const KeyShardQuery& p) {
      return std::pair<int64_t, int64_t>{p.q_rows * s.q_heads * s.head_dim * es,
                                         s.q_heads * p.q_rows * 4};
    };
    if (rank != root_) {
      if (plan.q_rows == 0) return absl::OkStatus();
      const auto [o_bytes, lse_bytes] = bytes(plan);
      ATTN_RETURN_IF_ERROR(comm.SendRecv(own.o.get(), o_bytes, root_, nullptr, 0, kNoPeer, wait));
      ATTN_RETURN_IF_ERROR(
          comm.SendRecv(own.lse.get(), lse_bytes, root_, nullptr, 0, kNoPeer, wait));
      figures.bytes_sent += o_bytes + lse_bytes;
      return absl::OkStatus();
    }
    // The root: accumulators, every partial merged in shard (row) order, the result to host.
    const int64_t o_elems = s.tokens * s.q_heads * s.head_dim;
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer acc_o, DeviceBuffer::Create(*ctx.allocator, o_elems * 4));
    ATTN_ASSIGN_OR_RETURN(DeviceBuffer acc_lse,
                          DeviceBuffer::Create(*ctx.allocator, s.q_heads * s.tokens * 4));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(acc_o.get(), 0, static_cast<size_t>(o_elems * 4), ctx.stream));
    CUDA_RETURN_IF_ERROR(
        LaunchFillFloat(acc_lse.as<float>(), -INFINITY, s.q_heads * s.tokens, ctx.stream));
    for (size_t shard = 0; shard < plans_.size(); ++shard) {
      const KeyShardQuery& p = plans_[shard];
      if (p.q_rows == 0) continue;
      const int peer =
          static_cast<int>(std::find(order_.begin(), order_.end(), shard) - order_.begin());
      if (peer == rank) {
        ATTN_RETURN_IF_ERROR(MergeInto(p, own, acc_o.as<float>(), acc_lse.as<float>(), ctx));
        continue;
      }
      const auto [o_bytes, lse_bytes] = bytes(p);
      Partial theirs;
      ATTN_ASSIGN_OR_RETURN(theirs.o, DeviceBuffer::Create(*ctx.allocator, o_bytes));
      ATTN_ASSIGN_OR_RETURN(theirs.lse, DeviceBuffer::Create(*ctx.allocator, lse_bytes));
      ATTN_RETURN_IF_ERROR(comm.SendRecv(nullptr, 0, kNoPeer, theirs.o.get(), o_bytes, peer, wait));
      ATTN_RETURN_IF_ERROR(
          comm.SendRecv(nullptr, 0, kNoPeer, theirs.lse.get(), lse_bytes, peer, wait));
      figures.bytes_received += o_bytes + lse_bytes;
      ATTN_RETURN_IF_ERROR(MergeInto(p, theirs, acc_o.as<float>(), acc_lse.as<float>(), ctx));
    }
    AttentionOutputs out;
    ATTN_ASSIGN_OR_RETURN(
        out.o, HostTensor::Create(request_.dtype, {1, s.tokens, s.q_heads, s.head_dim}, nullptr,
                                  ctx.host_memory));
    ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, {1, s.q_heads, s.tokens},
                                                      nullptr, ctx.host_memory));
    const void* o_src = acc_o.get();
    DeviceBuffer converted;
    if (request_.dtype != DType::kF32) {
      ATTN_ASSIGN_OR_RETURN(converted, DeviceBuffer::Create(*ctx.allocator, o_elems * es));
      CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, acc_o.get(), request_.dtype, converted.get(),
                                         o_elems, ctx.stream));
      o_src = converted.get();
    }
    ATTN_RETURN_IF_ERROR(CopyToHost(out.o.data(), o_src, static_cast<size_t>(out.o.nbytes()),
                                    ctx.stream, ctx.copies));
    ATTN_RETURN_IF_ERROR(CopyToHost(out.lse.data(), acc_lse.get(),
                                    static_cast<size_t>(out.lse.nbytes()), ctx.stream, ctx.copies));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    outputs_ = std::move(out);  // only the root's worker writes it
    return absl::OkStatus();
  }

  AttentionRequest& request_;
  const std::vector<Device*> devices_;
  const GroupEnv env_;
  std::vector<size_t> order_;         // rank -> index into request_.key_shards
  std::vector<KeyShardQuery> plans_;  // by shard index
  std::vector<int> ordinals_;         // CUDA ordinals in rank order: the communicator cache key
  int root_ = 0;                      // the rank holding the context's first rows
  std::vector<double> kernel_seconds_;  // by rank, each written by that rank's worker only
  std::shared_ptr<NcclGroup> nccl_group_;
  uint64_t nccl_generation_ = 0;
  AttentionOutputs outputs_;
};

}  // namespace

std::unique_ptr<GroupStrategy> MakeContextParallelGpuStrategy(AttentionRequest& request,
                                                              std::vector<Device*> devices,
                                                              const GroupEnv& env) {
  return std::make_unique<ContextParallelGpuStrategy>(request, std::move(devices), env);
}

}  // namespace attnserve
