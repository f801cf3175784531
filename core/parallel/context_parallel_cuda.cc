// Context-parallel attends on GPUs (CUDA builds): each GPU's worker uploads the query rows its
// shard may serve and runs them against the shard's K/V in place (CudaAttentionPlan on the
// device's allocator and the stream of the one lane it holds: Device::RunLaneTask) into one buffer
// holding its partial O and LSE. The GPU holding
// the context's first rows (the root) copies every other shard's partial from that shard's GPU
// (a CUDA peer copy on its own stream, ordered after the shard's kernels by an event the shard
// records) and LSE-merges the partials into float32 accumulators (LaunchLseMergeInto) in shard
// order, then copies the result to host memory.
//
// Why not NCCL: the ranks are threads of one process, and a decode step's partial is kilobytes.
// On 2 x H200 an NCCL send/recv of it on the group's non-blocking communicator completed
// 160-200 us after the later kernel ended (bench/results/h200x2-2026-11-27-sharded/trace3), a
// sixth of the step; the peer copy needs no host hand-shake after the kernels at all: the shard
// publishes its buffer and event right after launching, and the root's stream waits for the
// event. The only host waits are the root's final copy and a shard's wait (bounded, abortable)
// until the root's copy of its partial is done, before the shard's buffers go back.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/host_copy.h"
#include "core/parallel/context_parallel.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// Bound of a rank's wait for its peers (further bounded by the request's deadline): the ranks
// start together, so a partial is published within milliseconds.
constexpr absl::Duration kPeerTimeout = absl::Seconds(60);

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
    kernel_seconds_.assign(ranks, 0.0);
    handoffs_.assign(ranks, Handoff{});
    set_up_ = true;
    return absl::OkStatus();
  }

  absl::Status RunRank(int rank, Device& device, WorkerComms*, RankFigures& figures) override {
    if (!set_up_) return absl::InternalError("context parallel: rank started without its set-up");
    const absl::Time give_up = std::min(request_.deadline, absl::Now() + kPeerTimeout);
    // One lane of each GPU: no NCCL, and every buffer (the plan's workspaces too) goes back only
    // once the lane's stream is idle, so the other lanes keep running meanwhile, the next decode
    // step's ranks included.
    return device.RunLaneTask(0, [&](DeviceContext& ctx) -> absl::Status {
      return RunOnDevice(rank, ctx, give_up, figures);
    });
  }

  void Abort(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (abort_.ok()) abort_ = status;
    peers_cv_.SignalAll();
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

  // A shard's partial as the root reads it: published by the shard's worker right after it
  // launched its kernels; `ready` completes on the shard's stream once the partial is written.
  struct Handoff {
    const char* partial = nullptr;  // on the shard's GPU, PartialBytes layout
    int device = -1;                // its CUDA ordinal
    cudaEvent_t ready = nullptr;
    bool published = false;
    bool consumed = false;  // the root's copy of it has completed
  };

  // Waits (bounded by `give_up`, the request's cancel flag and Abort) until `done` holds.
  absl::Status AwaitPeers(absl::Time give_up, const std::function<bool()>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!done()) {
      if (!abort_.ok()) return abort_;
      if (request_.cancel.load(std::memory_order_relaxed)) {
        return absl::CancelledError("context parallel: cancelled while waiting for a peer GPU");
      }
      if (absl::Now() >= give_up) {
        return absl::DeadlineExceededError(
            "context parallel: a peer GPU's partial did not arrive in time");
      }
      // Short slices: the cancel flag has no notification of its own.
      peers_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(1));
    }
    return absl::OkStatus();
  }

  // Everything a rank's run holds on its device. Work on the stream may still read or write these
  // buffers when a step fails, so the destructor waits for the stream before they go back to the
  // allocator; on success the stream is idle by then (the last transfer or copy was waited for).
  struct RankState {
    explicit RankState(cudaStream_t s) : stream(s) {}
    ~RankState() {
      (void)cudaStreamSynchronize(stream);
      if (ready != nullptr) (void)cudaEventDestroy(ready);
    }
    RankState(const RankState&) = delete;
    RankState& operator=(const RankState&) = delete;

    const cudaStream_t stream;
    DeviceBuffer q;
    DeviceBuffer partial;  // this shard's O and LSE (PartialBytes)
    std::unique_ptr<CudaAttentionPlan> attention;
    RunEvents events;             // the shard's kernel time, as a single-device run reports its own
    cudaEvent_t ready = nullptr;  // a shard rank's partial written (destroyed with the state)
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
    ATTN_RETURN_IF_ERROR(st.attention->Run(st.q.get(), shard.k_dev.data, shard.v_dev.data, partial,
                                           reinterpret_cast<float*>(partial + b.lse_offset),
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
      CUDA_RETURN_IF_ERROR(
          LaunchConvert(DType::kF32, partial, DType::kBF16, bf16.get(), n, ctx.stream));
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

  // One rank's part. A shard rank publishes its partial and waits until the root has copied it;
  // the root merges its own and every other partial in shard (row) order and copies the result
  // out.
  absl::Status RunOnDevice(int rank, DeviceContext& ctx, absl::Time give_up, RankFigures& figures) {
    const size_t index = order_[rank];
    const KeyShardQuery& plan = plans_[index];
    const AttentionShape& s = request_.shape;
    const int64_t es = static_cast<int64_t>(DTypeSize(request_.dtype));
    RankState st(ctx.stream);
    if (plan.q_rows > 0) {
      ATTN_RETURN_IF_ERROR(Compute(request_.key_shards[index], plan, ctx, st, figures));
    }
    if (rank != root_) {
      if (plan.q_rows == 0) return absl::OkStatus();
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&st.ready, cudaEventDisableTiming));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(st.ready, ctx.stream));
      {
        absl::MutexLock lock(&mu_);
        handoffs_[rank] = Handoff{st.partial.as<char>(), ordinals_[rank], st.ready, true, false};
        peers_cv_.SignalAll();
        ATTN_RETURN_IF_ERROR(AwaitPeers(give_up, [&] { return handoffs_[rank].consumed; }));
      }
      figures.bytes_sent += BytesOf(plan).total;
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));  // its events, for the timing
      ReadKernelTime(rank, st);
      return absl::OkStatus();
    }
    const int64_t o_elems = s.tokens * s.q_heads * s.head_dim;
    ATTN_ASSIGN_OR_RETURN(st.acc_o, DeviceBuffer::Create(*ctx.allocator, o_elems * 4));
    ATTN_ASSIGN_OR_RETURN(st.acc_lse,
                          DeviceBuffer::Create(*ctx.allocator, s.q_heads * s.tokens * 4));
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
      // One receive buffer, as large as the largest partial, serves every peer in turn: the
      // copies and merges are ordered on this stream.
      if (st.theirs.get() == nullptr) {
        int64_t largest = 0;
        for (const KeyShardQuery& q : plans_) largest = std::max(largest, BytesOf(q).total);
        ATTN_ASSIGN_OR_RETURN(st.theirs, DeviceBuffer::Create(*ctx.allocator, largest));
      }
      Handoff h;
      {
        absl::MutexLock lock(&mu_);
        ATTN_RETURN_IF_ERROR(AwaitPeers(give_up, [&] { return handoffs_[peer].published; }));
        h = handoffs_[peer];
      }
      ATTN_RETURN_IF_ERROR(EnablePeerAccess(ordinals_[rank], h.device));
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ctx.stream, h.ready, 0));
      CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(st.theirs.get(), ordinals_[rank], h.partial,
                                               h.device, static_cast<size_t>(bytes), ctx.stream));
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
    {
      absl::MutexLock lock(&mu_);  // every peer copy is done: the shards may free their buffers
      for (Handoff& h : handoffs_) h.consumed = true;
      peers_cv_.SignalAll();
    }
    if (plan.q_rows > 0) ReadKernelTime(rank, st);
    outputs_ = std::move(out);  // only the root's worker writes it
    return absl::OkStatus();
  }

  // Lets `device` read `peer`'s memory directly (NVLink or PCIe peer-to-peer) where the two can;
  // elsewhere the peer copies go through host memory, slower but correct. Once per process and
  // pair: the CUDA runtime keeps it for the device's context.
  static absl::Status EnablePeerAccess(int device, int peer) {
    static absl::Mutex mu(absl::kConstInit);
    static auto* done = new std::vector<std::pair<int, int>>();
    absl::MutexLock lock(&mu);
    if (std::find(done->begin(), done->end(), std::pair{device, peer}) != done->end()) {
      return absl::OkStatus();
    }
    int can = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device, peer));
    if (can) {
      CUDA_RETURN_IF_ERROR(cudaSetDevice(device));  // the worker's own device: enabled for it
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // NCCL may have enabled it: not an error, and not left pending
      } else {
        CUDA_RETURN_IF_ERROR(e);
      }
    }
    done->emplace_back(device, peer);
    return absl::OkStatus();
  }

  AttentionRequest& request_;
  const std::vector<Device*> devices_;
  const GroupEnv env_;
  std::vector<size_t> order_;           // rank -> index into request_.key_shards
  std::vector<KeyShardQuery> plans_;    // by shard index
  std::vector<int> ordinals_;           // CUDA ordinals in rank order
  int root_ = 0;                        // the rank holding the context's first rows
  std::vector<double> kernel_seconds_;  // by rank, each written by that rank's worker only
  bool set_up_ = false;
  absl::Mutex mu_;
  absl::CondVar peers_cv_;
  std::vector<Handoff> handoffs_ ABSL_GUARDED_BY(mu_);  // by rank
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  AttentionOutputs outputs_;
};

}  // namespace

std::unique_ptr<GroupStrategy> MakeContextParallelGpuStrategy(AttentionRequest& request,
                                                              std::vector<Device*> devices,
                                                              const GroupEnv& env) {
  return std::make_unique<ContextParallelGpuStrategy>(request, std::move(devices), env);
}

}  // namespace attnserve
