// attnbench_ring --longest-causal: the longest dense causal N on one GPU and on the ring under a
// per-GPU memory budget. See ring_bench.h for the method.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cuda/plan_launch.h"
#include "core/util/json.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/run_record.h"
#include "bench/ring/ring_bench.h"
#include "bench/ring/ring_run.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/parallel/nccl_communicator.h"
#include "core/parallel/ring_cuda.h"
#include "core/parallel/ring_cuda_plan.h"
#include "core/util/status_macros.h"
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve::bench {
namespace {

struct Attempt {
  int64_t n = 0;
  absl::Status status;
  double time_s = NAN;              // the second (timed) run
  std::vector<int64_t> peak_bytes;  // per GPU, allocator peak
  std::vector<int64_t> estimated_bytes;
  std::string engine;
  int q_chunks = 0, kv_pieces = 0;
};

// One GPU under a hard allocator limit, on the engine CudaDevice would pick.
class LimitedSingleGpu {
 public:
  explicit LimitedSingleGpu(int device) : device_(device) {}

  Attempt Try(int64_t n, int64_t budget, double cap, const RingBenchOptions& opt) {
    Attempt a;
    a.n = n;
    a.status = TryImpl(n, budget, cap, opt, a);
    return a;
  }

 private:
  absl::Status TryImpl(int64_t n, int64_t budget, double cap, const RingBenchOptions& opt, Attempt& a) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const AttentionShape shape{1, n, opt.heads, opt.heads, opt.dim};
    const AttentionSpec spec = DenseSpecOf(true);
    CachingAllocator alloc(device_);
    alloc.set_limit(budget);
    cudaStream_t stream;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    absl::Status st = [&]() -> absl::Status {
      const int64_t nq = n * shape.q_heads * shape.head_dim;
      const int64_t nkv = n * shape.kv_heads * shape.head_dim;
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Create(alloc, nq * 2));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Create(alloc, nkv * 2));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Create(alloc, nkv * 2));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Create(alloc, nq * 2));
      ATTN_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(alloc, shape.q_heads * n * 4));
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, q.get(), nq, 5, -1.f, 1.f, stream));
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, k.get(), nkv, 6, -1.f, 1.f, stream));
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, v.get(), nkv, 7, -1.f, 1.f, stream));
      std::function<absl::Status()> run;
      std::unique_ptr<CudaAttentionPlan> plan;
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
      CudnnSdpa* sdpa = Cudnn(&alloc);
      if (sdpa != nullptr) {
        absl::StatusOr<bool> has = sdpa->Supports(spec, shape, DType::kBF16);
        if (has.ok() && *has) {
          a.engine = "cudnn";
          run = [&]() {
            return sdpa->Forward(spec, shape, DType::kBF16, q.get(), k.get(), v.get(), o.get(),
                                 lse.as<float>(), stream);
          };
        }
      }
#endif
      if (!run) {
        a.engine = "flash_fwd";
        ATTN_ASSIGN_OR_RETURN(plan, MakeBenchPlan(spec, shape, DType::kBF16, alloc, stream,
                                                  opt.cuda));
        run = [&]() {
          return RunBenchPlan(*plan, q.get(), k.get(), v.get(), o.get(), lse.as<float>(), stream);
        };
      }
      for (int it = 0; it < 2; ++it) {
        const auto t0 = Clock::now();
        ATTN_RETURN_IF_ERROR(run());
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        const double t = Seconds(t0, Clock::now());
        if (t > cap) {
          return absl::DeadlineExceededError(
              absl::StrFormat("run took %.1f s > --time-cap-s %.1f", t, cap));
        }
        a.time_s = t;
      }
      return absl::OkStatus();
    }();
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    a.peak_bytes = {alloc.Stats().peak_bytes};
    current_ = nullptr;
    return st;
  }

#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  CudnnSdpa* Cudnn(CachingAllocator* alloc) {
    current_ = alloc;
    if (sdpa_ == nullptr && !tried_) {
      tried_ = true;
      CudnnSdpa::Options options;
      options.device = device_;
      options.workspace.allocate = [this](size_t bytes) -> absl::StatusOr<void*> {
        if (current_ == nullptr) return absl::FailedPreconditionError("no allocator");
        return current_->Allocate(bytes);
      };
      options.workspace.free = [this](void* ptr) {
        if (current_ != nullptr) current_->Free(ptr);
      };
      absl::StatusOr<std::unique_ptr<CudnnSdpa>> made = CudnnSdpa::Create(options);
      if (made.ok()) {
        sdpa_ = *std::move(made);
      } else {
        std::printf("cuDNN unavailable (%s): single GPU on flash_fwd\n",
                    made.status().ToString().c_str());
      }
    }
    return sdpa_.get();
  }
  std::unique_ptr<CudnnSdpa> sdpa_;
  bool tried_ = false;
#endif
  const int device_;
  CachingAllocator* current_ = nullptr;
};


// One ring rank of an attempt: created under its allocator limit (every rank learns whether all
// could allocate before any runs), inputs filled on the device, two runs (the second timed by
// rank 0), then the rank's figures into `a`.
struct RingAttemptShared {
  const RingCudaPlan* plan = nullptr;
  AttentionShape shape;
  int64_t budget = 0;
  double cap = 0;
  std::shared_ptr<NcclGroup> group;
  RingCudaOptions options;
  Barrier* barrier = nullptr;
  std::vector<char> created;
  bool stop = false;
  double t = NAN;
  Clock::time_point t0;
};

absl::Status RunRingAttemptRank(int rank, RingAttemptShared& sh, Attempt& a) {
  const AttentionShape& shape = sh.shape;
  const int ranks = static_cast<int>(sh.created.size());
  CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  NcclCommunicator::Options copts;
  copts.group = sh.group;
  copts.rank = rank;
  copts.cuda_device = rank;
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm, NcclCommunicator::Create(copts));
  CachingAllocator alloc(rank);
  alloc.set_limit(sh.budget);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  absl::StatusOr<std::unique_ptr<RingCudaRank>> made = RingCudaRank::Create(
      *sh.plan, shape, DType::kBF16, scale, rank, rank, *comm, &alloc, nullptr, sh.options);
  sh.created[rank] = made.ok();
  if (!sh.barrier->Arrive()) return OtherRankFailed();
  for (int p = 0; p < ranks; ++p) {
    if (!sh.created[p]) {
      a.peak_bytes[rank] = alloc.Stats().peak_bytes;
      return made.ok() ? absl::AbortedError(absl::StrCat("rank ", p, " could not allocate"))
                       : made.status();
    }
  }
  std::unique_ptr<RingCudaRank> r = *std::move(made);
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, r->q(),
                                         r->shard_tokens() * shape.q_heads * shape.head_dim,
                                         11 + rank, -1.f, 1.f, r->stream()));
  int j = 0;
  for (auto [ptr, bytes] : r->HomeKv()) {
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, ptr, bytes / 2, 100 * (rank + 1) + j++,
                                           -1.f, 1.f, r->stream()));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
  for (int it = 0; it < 2; ++it) {
    if (!sh.barrier->Arrive()) return OtherRankFailed();
    if (rank == 0) sh.t0 = Clock::now();
    ATTN_RETURN_IF_ERROR(r->Run());
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
    if (!sh.barrier->Arrive()) return OtherRankFailed();
    if (rank == 0) {
      sh.t = Seconds(sh.t0, Clock::now());
      sh.stop = sh.t > sh.cap;
    }
    if (!sh.barrier->Arrive()) return OtherRankFailed();
    if (sh.stop) break;
  }
  a.peak_bytes[rank] = alloc.Stats().peak_bytes;
  a.estimated_bytes[rank] = r->stats().estimated_device_bytes;
  r.reset();
  return absl::OkStatus();
}

// The ring over devices [0, P) with device_memory_budget = budget and each rank's allocator
// limited to it; a fresh NCCL group per attempt (borrowed communicator API of RingCudaRank).
Attempt TryRing(int64_t n, int64_t budget, double cap, const RingBenchOptions& opt) {
  Attempt a;
  a.n = n;
  const int ranks = opt.devices;
  RingAttemptShared sh;
  sh.shape = AttentionShape{1, n, opt.heads, opt.heads, opt.dim};
  RingCudaPlanOptions po;
  po.device_memory_budget = budget;
  po.cudnn_pieces = RingCudnnPiecesWanted(opt.cuda);  // as RingCudaRun plans it in the service
  absl::StatusOr<RingCudaPlan> plan =
      PlanRingCuda(DenseSpecOf(true), sh.shape, DType::kBF16, ranks, po);
  if (!plan.ok()) {
    a.status = plan.status();  // no schedule fits: the plan's figures are the allocations'
    return a;
  }
  a.q_chunks = plan->q_chunks;
  a.kv_pieces = plan->kv_pieces;
  a.engine = "ring flash_fwd";
  ForceNcclNvlsOff();
  absl::StatusOr<std::shared_ptr<NcclGroup>> group = NcclGroup::Create(ranks);
  if (!group.ok()) {
    a.status = group.status();
    return a;
  }
  Barrier barrier(ranks);
  sh.plan = &*plan;
  sh.budget = budget;
  sh.cap = cap;
  sh.group = *group;
  sh.options = RingOptionsFor(opt.cuda);
  sh.barrier = &barrier;
  sh.created.assign(ranks, 0);
  a.peak_bytes.assign(ranks, 0);
  a.estimated_bytes.assign(ranks, 0);
  a.status = FirstFailure(RunRankThreads(
      ranks, [&](int rank) { return RunRingAttemptRank(rank, sh, a); }, &barrier,
      [&](const absl::Status& s) { (*group)->Abort(s); }));
  if (!a.status.ok()) return a;
  if (sh.stop) {
    a.status = absl::DeadlineExceededError(
        absl::StrFormat("run took %.1f s > --time-cap-s %.1f", sh.t, cap));
  }
  a.time_s = sh.t;
  return a;
}

Json AttemptJson(const char* mode, const Attempt& a) {
  return Json::Object()
      .Set("mode", mode)
      .Set("n", a.n)
      .Set("ok", a.status.ok())
      .Set("time_s", a.time_s)
      .Set("peak_bytes_per_gpu", Json::ArrayOf(a.peak_bytes))
      .Set("estimated_bytes_per_gpu", Json::ArrayOf(a.estimated_bytes))
      .Set("engine", a.engine)
      .Set("q_chunks", a.q_chunks)
      .Set("kv_pieces", a.kv_pieces)
      .Set("error", a.status.ok() ? "" : a.status.ToString());
}

// Doubling from `first`, then bisection on multiples of kStep, while the bench budget lasts;
// every attempt is printed and added to `attempts`. Returns the best success (n = 0: none).
Attempt Search(const char* mode, int64_t first, const std::function<Attempt(int64_t)>& try_n,
               const std::function<bool()>& budget_left, Json& attempts) {
  constexpr int64_t kStep = 4096;
  Attempt best;
  int64_t lo = 0, hi = 0;
  auto run = [&](int64_t n) {
    const Attempt a = try_n(n);
    const int64_t peak =
        a.peak_bytes.empty() ? 0 : *std::max_element(a.peak_bytes.begin(), a.peak_bytes.end());
    std::printf("  %s N=%lld: %s  %.3f s  peak %.3f GiB/GPU%s\n", mode, static_cast<long long>(n),
                a.status.ok() ? "ok" : a.status.ToString().c_str(), a.time_s, peak / kGiB,
                a.q_chunks > 0
                    ? absl::StrFormat("  (qc, c) = (%d, %d)", a.q_chunks, a.kv_pieces).c_str()
                    : "");
    std::fflush(stdout);
    attempts.Push(AttemptJson(mode, a));
    if (a.status.ok()) {
      lo = n;
      best = a;
    } else {
      hi = n;
    }
    return a.status.ok();
  };
  for (int64_t n = std::max(kStep, first / kStep * kStep); run(n); n *= 2) {
    if (!budget_left()) return best;
  }
  while (hi - lo > kStep && budget_left()) {
    int64_t mid = (lo + hi) / 2 / kStep * kStep;
    if (mid <= lo) mid = lo + kStep;
    if (mid >= hi) break;
    run(mid);
  }
  return best;
}

}  // namespace

int RunLongestCausalBench(const RingBenchOptions& opt) {
  const auto start = Clock::now();
  auto elapsed = [&] { return Seconds(start, Clock::now()); };
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaDeviceProp prop{};
  if (count > 0) cudaGetDeviceProperties(&prop, 0);
  if (count < opt.devices) {
    std::printf("need %d GPUs, found %d\n", opt.devices, count);
    return 2;
  }
  const int64_t budget = static_cast<int64_t>(opt.memory_budget_gib * kGiB);
  std::printf("attnbench_ring --longest-causal: %s, budget %.2f GiB per GPU, ring over %d, "
              "time cap %.0f s\n",
              prop.name, opt.memory_budget_gib, opt.devices, opt.time_cap_s);
  Json attempts = Json::Array();
  auto budget_left = [&] { return elapsed() <= opt.budget_s; };
  LimitedSingleGpu single(0);
  const Attempt a1 = Search(
      "1gpu", 65536, [&](int64_t n) { return single.Try(n, budget, opt.time_cap_s, opt); },
      budget_left, attempts);
  const Attempt a2 = Search(
      "ring", std::max<int64_t>(a1.n, 65536),
      [&](int64_t n) { return TryRing(n, budget, opt.time_cap_s, opt); }, budget_left, attempts);
  const double ratio = a1.n > 0 ? static_cast<double>(a2.n) / a1.n : NAN;
  std::printf("longest dense causal under %.2f GiB/GPU: 1 GPU N1=%lld (%s, %.3f s), ring x%d "
              "N2=%lld ((qc, c) = (%d, %d), %.3f s), N2/N1 = %.3f\n",
              opt.memory_budget_gib, static_cast<long long>(a1.n), a1.engine.c_str(), a1.time_s,
              opt.devices, static_cast<long long>(a2.n), a2.q_chunks, a2.kv_pieces, a2.time_s,
              ratio);
  if (!opt.json.empty()) {
    Json j = Json::Object();
    j.Set("bench", "attnbench_ring_longest_causal");
    AddRunRecord(MakeRunRecord(prop.name, opt.commit), j);
    j.Set("gpus", opt.devices)
        .Set("dtype", "bf16")
        .Set("batch", 1)
        .Set("heads", opt.heads)
        .Set("head_dim", opt.dim)
        .Set("memory_budget_bytes", budget)
        .Set("budget_enforcement",
             "CachingAllocator::set_limit (rounded sizes; CUDA context, cuDNN handle and NCCL "
             "buffers not counted)")
        .Set("time_cap_s", opt.time_cap_s)
        .Set("n1", a1.n)
        .Set("n2", a2.n)
        .Set("ratio", ratio)
        .Set("single", AttemptJson("1gpu", a1))
        .Set("ring", AttemptJson("ring", a2))
        .Set("attempts", std::move(attempts))
        .Set("wall_s", elapsed());
    const absl::Status st = WriteJsonFile(opt.json, j, 1);
    std::printf("%s\n", st.ok() ? absl::StrCat("wrote ", opt.json).c_str() : st.ToString().c_str());
  }
  return a1.n > 0 && a2.n > 0 ? 0 : 1;
}

}  // namespace attnserve::bench
