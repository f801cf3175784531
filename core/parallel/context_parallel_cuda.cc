// Context-parallel attends on GPUs (CUDA + NCCL builds): each GPU's worker uploads the query rows
// its shard may serve, runs them against the shard's K/V in place (CudaAttentionPlan on the
// device's allocator and stream), and sends its partial O and LSE (one buffer, one transfer) over
// the group's NCCL communicator to the GPU holding the context's first rows, which LSE-merges
// every partial into float32 accumulators (LaunchLseMergeInto) in shard order and copies the
// result to host memory. Everything else is ordered on the streams: a rank waits on the host for
// its partial, for its transfer and, on the root, for the final copy (a decode step is about a
// millisecond, so each host round trip shows).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
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
  // Sizes of one shard's partial: O [q_rows, Hq, D] in the request's dtype, then LSE [Hq, q_rows]
  // float32 at a 256-byte aligned offset, in one buffer, so that a rank sends it in one transfer.
  struct PartialBytes {
    int64_t o = 0, lse_offset = 0, total = 0;
  };
  PartialBytes BytesOf(const KeyShardQuery& plan) const {
    const AttentionShape& s = request_.shape;
    PartialBytes b;
    b.o = plan.q_rows * s.q_heads * s.head_dim * static_cast<int64_t>(DTypeSize(request_.dtype));
    b.lse_offset = (b.o + 255) / 256 * 256;
    b.total = b.lse_offset + s.q_heads * plan.q_rows * 4;
    return b;
  }

  // Everything a rank's run holds on its device. Work on the stream may still read or write these
  // buffers when a step fails, so the destructor waits for the stream before they go back to the
  // allocator; on success the stream is idle by then (the last transfer or copy was waited for).
  struct RankState {
    explicit RankState(cudaStream_t s) : stream(s) {}
    ~RankState() { (void)cudaStreamSynchronize(stream); }
    RankState(const RankState&) = delete;
    RankState& operator=(const RankState&) = delete;

    const cudaStream_t stream;
    DeviceBuffer q;
    DeviceBuffer partial;  // this shard's O and LSE (PartialBytes)
    std::unique_ptr<CudaAttentionPlan> attention;
    RunEvents events;  // the shard's kernel time, as a single-device run reports its own
    // The root only: another shard's partial, the float32 accumulators, temporaries.
    DeviceBuffer theirs, acc_o, acc_lse, converted;
    std::vector<DeviceBuffer> bf16;
  };

  // Launches this shard's partial into st.partial: Q rows up, the attention plan run in place on
  // the shard's rows (queued on the stream, not waited for).
  absl::Status Compute(const KeyShard& shard, const KeyShardQuery& plan, DeviceContext& ctx,
                       RankState& st, RankFigures& figures) {
    const AttentionShape& s = request_.shape;
    const int64_t row = s.q_heads * s.head_dim * static_cast<int64_t>(DTypeSize(request_.dtype));
    const PartialBytes b = BytesOf(plan);
    ATTN_ASSIGN_OR_RETURN(st.q, DeviceBuffer::Create(*ctx.allocator, plan.q_rows * row));
    ATTN_ASSIGN_OR_RETURN(st.partial, DeviceBuffer::Create(*ctx.allocator, b.total));
    ATTN_RETURN_IF_ERROR(st.events.Init());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events.inputs_start(), ctx.stream));
    ATTN_RETURN_IF_ERROR(CopyToDevice(st.q.get(), request_.q.data() + plan.q_row0 * row,
                                      static_cast<size_t>(plan.q_rows * row), ctx.stream,
                                      ctx.copies));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events.inputs_done(), ctx.stream));
    CudaAttentionPlan::Options options;
    options.kernel = env_.cuda.flash;
    ATTN_ASSIGN_OR_RETURN(st.attention,
                          CudaAttentionPlan::Create(plan.spec, plan.shape, request_.dtype,
                                                    *ctx.allocator, ctx.stream, nullptr, options));
    char* const partial = st.partial.as<char>();
    ATTN_RETURN_IF_ERROR(st.attention->Run(st.q.get(), shard.k_dev.data, shard.v_dev.data,
                                           partial, reinterpret_cast<float*>(partial + b.lse_offset),
                                           ctx.stream, &request_.cancel));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events.kernels_done(), ctx.stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events.outputs_done(), ctx.stream));
    figures.flops = st.attention->flops();
    figures.tokens = static_cast<double>(plan.q_rows);
    return absl::OkStatus();
  }

  // Reads the kernel time of this rank's partial; the stream has passed its events.
  void ReadKernelTime(int rank, const RankState& st) {
    double copy_seconds = 0;
    st.events.Read(&copy_seconds, &kernel_seconds_[rank]);
  }

  // Merges a partial (PartialBytes layout at `partial`) into the accumulators: f32 partials (f32
  // requests, computed in bf16 and so exactly representable there) go through a bf16 copy, as the
  // merge kernel reads bf16/f16; the copy lives in st until the stream is done with it.
  absl::Status MergeInto(const KeyShardQuery& plan, const char* partial, DeviceContext& ctx,
                         RankState& st) {
    const AttentionShape& s = request_.shape;
    const PartialBytes b = BytesOf(plan);
    const void* o = partial;
    DType o_dtype = request_.dtype;
    if (o_dtype == DType::kF32) {
      const int64_t n = plan.q_rows * s.q_heads * s.head_dim;
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer bf16, DeviceBuffer::Create(*ctx.allocator, n * 2));
      CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, partial, DType::kBF16, bf16.get(), n,
                                         ctx.stream));
      o = bf16.get();
      o_dtype = DType::kBF16;
      st.bf16.push_back(std::move(bf16));
    }
    CUDA_RETURN_IF_ERROR(LaunchLseMergeInto(
        o_dtype, o, reinterpret_cast<const float*>(partial + b.lse_offset),
        st.acc_o.as<float>() + plan.q_row0 * s.q_heads * s.head_dim,
        st.acc_lse.as<float>() + plan.q_row0, 1, plan.q_rows, s.q_heads, s.head_dim,
        s.tokens * s.q_heads * s.head_dim, s.q_heads * s.tokens, s.tokens, ctx.stream));
    return absl::OkStatus();
  }

  // One rank's part. A shard rank sends its partial (one transfer) to the root; the root merges
  // its own and every other partial in shard (row) order and copies the result out.
  absl::Status RunOnDevice(int rank, DeviceContext& ctx, Communicator& comm, absl::Duration timeout,
                           RankFigures& figures) {
    const size_t index = order_[rank];
    const KeyShardQuery& plan = plans_[index];
    const AttentionShape& s = request_.shape;
    const int64_t es = static_cast<int64_t>(DTypeSize(request_.dtype));
    const WaitOptions wait{timeout, &request_.cancel};
    RankState st(ctx.stream);
    if (plan.q_rows > 0) {
      ATTN_RETURN_IF_ERROR(Compute(request_.key_shards[index], plan, ctx, st, figures));
      // Wait for the partial here, where the CUDA runtime wakes this thread as soon as the kernels
      // end: the transfer's own wait polls with back-off (it also serves long ring transfers),
      // and started a kernel's length early it overslept the end by ~0.3 ms (measured on 2 x
      // H200, bench/results/h200x2-2026-11-27-sharded/trace).
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    }
    if (rank != root_) {
      if (plan.q_rows == 0) return absl::OkStatus();
      const int64_t bytes = BytesOf(plan).total;
      ATTN_RETURN_IF_ERROR(comm.SendRecv(st.partial.get(), bytes, root_, nullptr, 0, kNoPeer, wait));
      figures.bytes_sent += bytes;
      ReadKernelTime(rank, st);
      return absl::OkStatus();
    }
    const int64_t o_elems = s.tokens * s.q_heads * s.head_dim;
    ATTN_ASSIGN_OR_RETURN(st.acc_o, DeviceBuffer::Create(*ctx.allocator, o_elems * 4));
    ATTN_ASSIGN_OR_RETURN(st.acc_lse, DeviceBuffer::Create(*ctx.allocator, s.q_heads * s.tokens * 4));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(st.acc_o.get(), 0, static_cast<size_t>(o_elems * 4), ctx.stream));
    CUDA_RETURN_IF_ERROR(
        LaunchFillFloat(st.acc_lse.as<float>(), -INFINITY, s.q_heads * s.tokens, ctx.stream));
    for (size_t shard = 0; shard < plans_.size(); ++shard) {
      const KeyShardQuery& p = plans_[shard];
      if (p.q_rows == 0) continue;
      const int peer =
          static_cast<int>(std::find(order_.begin(), order_.end(), shard) - order_.begin());
      if (peer == rank) {
        ATTN_RETURN_IF_ERROR(MergeInto(p, st.partial.as<char>(), ctx, st));
        continue;
      }
      const int64_t bytes = BytesOf(p).total;
      // One receive buffer, as large as the largest partial, serves every peer in turn: each
      // receive is queued behind the merge of the previous one (the communicator's stream waits
      // for the compute stream), so no partial is overwritten before it was merged.
      if (st.theirs.get() == nullptr) {
        int64_t largest = 0;
        for (const KeyShardQuery& q : plans_) largest = std::max(largest, BytesOf(q).total);
        ATTN_ASSIGN_OR_RETURN(st.theirs, DeviceBuffer::Create(*ctx.allocator, largest));
      }
      ATTN_RETURN_IF_ERROR(comm.SendRecv(nullptr, 0, kNoPeer, st.theirs.get(), bytes, peer, wait));
      figures.bytes_received += bytes;
      ATTN_RETURN_IF_ERROR(MergeInto(p, st.theirs.as<char>(), ctx, st));
    }
    AttentionOutputs out;
    ATTN_ASSIGN_OR_RETURN(
        out.o, HostTensor::Create(request_.dtype, {1, s.tokens, s.q_heads, s.head_dim}, nullptr,
                                  ctx.host_memory));
    ATTN_ASSIGN_OR_RETURN(out.lse, HostTensor::Create(DType::kF32, {1, s.q_heads, s.tokens},
                                                      nullptr, ctx.host_memory));
    const void* o_src = st.acc_o.get();
    if (request_.dtype != DType::kF32) {
      ATTN_ASSIGN_OR_RETURN(st.converted, DeviceBuffer::Create(*ctx.allocator, o_elems * es));
      CUDA_RETURN_IF_ERROR(LaunchConvert(DType::kF32, st.acc_o.get(), request_.dtype,
                                         st.converted.get(), o_elems, ctx.stream));
      o_src = st.converted.get();
    }
    ATTN_RETURN_IF_ERROR(CopyToHost(out.o.data(), o_src, static_cast<size_t>(out.o.nbytes()),
                                    ctx.stream, ctx.copies));
    ATTN_RETURN_IF_ERROR(CopyToHost(out.lse.data(), st.acc_lse.get(),
                                    static_cast<size_t>(out.lse.nbytes()), ctx.stream, ctx.copies));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    if (plan.q_rows > 0) ReadKernelTime(rank, st);
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
