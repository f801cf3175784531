// attnbench_ring: ring attention over GPUs (core/dist/ring_cuda) against the same flash_fwd kernel
// on one GPU, and the per-GPU memory of ring vs data-parallel (heads split over the GPUs).
//
//   attnbench_ring [--json=PATH] [--ns=262144,524288] [--reps=5] [--warmup=1] [--heads=8]
//                  [--dim=128] [--devices=2] [--longest=1048576,2097152,4194304]
//                  [--max_run_s=60] [--budget_s=220] [--commit=SHA] [--engine=own|cudnn|both]
//
// Timing: every rank (host thread) passes a barrier, rank 0 takes the host clock, each rank runs
// and synchronizes its stream, a second barrier, rank 0 takes the clock: wall time of the whole
// ring including every transfer. Median of --reps runs after --warmup runs. T1 is one GPU on the
// full sequence with the same engine, timed the same way: --engine=own runs flash_fwd on one GPU
// and in every ring piece; --engine=cudnn runs cuDNN's fused attention on one GPU (what the
// service runs there) and in the ring's unmasked and diagonal pieces (RingCudaPlanOptions::
// cudnn_pieces); both (the default) runs each case twice.
// FLOPs: 4 * B * Hq * D * admitted pairs (causal: the kept triangle N(N+1)/2).
// Efficiency: T1 / (P * T2) (1.0 = perfect scaling).
// Correctness: the ring's O/LSE are compared with T1's on every 509th query row of each range (max
// |dO| / max|O| and max |dLSE|), printed and recorded. Data parallel (heads split over the GPUs,
// full sequence each): one run, for its memory and a rough time. Longest sequence: dense causal,
// one run per N on 1 GPU and on the ring, ascending; a mode stops at its first failure or when the
// run predicted from the previous one (time ~ N^2) exceeds
// --max_run_s. The whole bench skips stages that would start after --budget_s.
//
// Longest dense causal under a per-GPU memory budget (issue 5):
//   attnbench_ring --longest-causal --memory-budget-gib=4 [--time-cap-s=20] [--json=PATH]
// bf16, D = --dim (128), Hq = Hkv = --heads (8), B = 1. N1: the longest N (multiple of 4096) the
// single-GPU path runs with at most X GiB of device memory: cuDNN's fused attention when the build
// and host have it (as CudaDevice runs one GPU in its default mode), else CudaAttentionPlan. N2:
// the longest for the ring over --devices GPUs with device_memory_budget = X per GPU (the plan
// picks the schedule). Budget enforcement: every device buffer of an attempt (inputs, outputs,
// ring buffers and layouts, cuDNN workspace) comes from a fresh CachingAllocator whose hard limit
// (set_limit) is X, so an attempt that would hold more fails with RESOURCE_EXHAUSTED; sizes are
// the allocator's rounded ones. Not counted on either side: the CUDA context, cuDNN's handle and
// NCCL's own buffers. Search: doubling from 65536 (ring: from N1), then bisection to 4096 tokens;
// each attempt runs twice (the first also builds graphs / connects NCCL, the second is timed) and
// fails when a run exceeds --time-cap-s. The ring's K/V are filled on the device in its home
// pieces (RingCudaRank::HomeKv), and Run restores them, so nothing is re-uploaded between runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/cuda/attention_ops.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_status.h"
#include "core/dist/nccl_communicator.h"
#include "core/dist/ring_cuda.h"
#include "core/dist/ring_cuda_plan.h"
#include "core/util/status_macros.h"
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
#include "core/cuda/cudnn_sdpa/cudnn_sdpa.h"
#endif

namespace attnserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string json;
  std::vector<int64_t> ns = {262144, 524288};
  std::vector<int64_t> longest = {1048576, 2097152, 4194304};
  int reps = 5;
  int warmup = 1;
  int64_t heads = 8;
  int64_t dim = 128;
  int devices = 2;
  double max_run_s = 60;
  double budget_s = 220;
  std::string commit = "unknown";
  std::string command;
  bool longest_causal = false;
  // Scaling cases: "own" (flash_fwd on one GPU and in every ring piece), "cudnn" (cuDNN fused
  // attention on one GPU and in the ring's unmasked/diagonal pieces), or "both".
  std::string engine = "both";
  double memory_budget_gib = 4;
  double time_cap_s = 20;
};

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A barrier that can be aborted, so that a failing rank never leaves the others blocked.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return false;
    const int64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return gen_ != gen || aborted_; });
    return !aborted_;
  }
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  int64_t gen_ = 0;
  bool aborted_ = false;
};

AttentionSpec DenseSpecOf(bool causal) {
  AttentionSpec s;
  s.pattern = DenseSpec{};
  s.causal = causal;
  return s;
}

double DenseFlops(const AttentionShape& s, bool causal) {
  const double n = static_cast<double>(s.tokens);
  const double pairs = causal ? n * (n + 1) / 2 : n * n;
  return 4.0 * s.batch * s.q_heads * s.head_dim * pairs;
}

// Single-GPU problem on one device: inputs filled on the device, the plan, outputs.
struct SingleGpu {
  int device = 0;
  std::unique_ptr<CachingAllocator> alloc;
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudaAttentionPlan> plan;
  CudnnSdpa* sdpa = nullptr;  // set: T1 runs cuDNN's fused attention instead of `plan`
  bool causal = false;
  DeviceBuffer q, k, v, o, lse;
  AttentionShape shape;
  ~SingleGpu() {
    if (stream == nullptr) return;
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    plan.reset();
    for (DeviceBuffer* b : {&q, &k, &v, &o, &lse}) b->Reset();
    cudaStreamDestroy(stream);
  }
};

// One cuDNN engine per device for the scaling cases (null without the cuDNN path or libcudnn).
CudnnSdpa* ScalingCudnn(int device) {
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  static std::map<int, CudnnSdpa*>* engines = new std::map<int, CudnnSdpa*>;
  auto it = engines->find(device);
  if (it != engines->end()) return it->second;
  CudnnSdpa::Options o;
  o.device = device;
  absl::StatusOr<std::unique_ptr<CudnnSdpa>> e = CudnnSdpa::Create(o);
  if (!e.ok()) std::printf("cuDNN unavailable on cuda:%d: %s\n", device, e.status().ToString().c_str());
  return (*engines)[device] = e.ok() ? e->release() : nullptr;
#else
  (void)device;
  return nullptr;
#endif
}

absl::StatusOr<std::unique_ptr<SingleGpu>> MakeSingleGpu(int device, const AttentionShape& shape,
                                                         bool causal, uint64_t seed,
                                                         bool cudnn = false) {
  auto g = std::make_unique<SingleGpu>();
  g->device = device;
  g->shape = shape;
  g->causal = causal;
  if (cudnn) {
    g->sdpa = ScalingCudnn(device);
    if (g->sdpa == nullptr) return absl::UnavailableError("engine cudnn: no cuDNN on this host");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  g->alloc = std::make_unique<CachingAllocator>(device);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
  const int64_t nq = shape.batch * shape.tokens * shape.q_heads * shape.head_dim;
  const int64_t nkv = shape.batch * shape.tokens * shape.kv_heads * shape.head_dim;
  ATTN_ASSIGN_OR_RETURN(g->q, DeviceBuffer::Create(*g->alloc, nq * 2));
  ATTN_ASSIGN_OR_RETURN(g->k, DeviceBuffer::Create(*g->alloc, nkv * 2));
  ATTN_ASSIGN_OR_RETURN(g->v, DeviceBuffer::Create(*g->alloc, nkv * 2));
  ATTN_ASSIGN_OR_RETURN(g->o, DeviceBuffer::Create(*g->alloc, nq * 2));
  ATTN_ASSIGN_OR_RETURN(
      g->lse, DeviceBuffer::Create(*g->alloc, shape.batch * shape.q_heads * shape.tokens * 4));
  CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, g->q.get(), nq, seed, -1.f, 1.f, g->stream));
  CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(DType::kBF16, g->k.get(), nkv, seed + 1, -1.f, 1.f, g->stream));
  CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(DType::kBF16, g->v.get(), nkv, seed + 2, -1.f, 1.f, g->stream));
  ATTN_ASSIGN_OR_RETURN(g->plan, CudaAttentionPlan::Create(DenseSpecOf(causal), shape, DType::kBF16,
                                                           *g->alloc, g->stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g->stream));
  return g;
}

absl::StatusOr<double> RunSingleOnce(SingleGpu& g) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(g.device));
  const auto t0 = Clock::now();
#ifdef ATTNSERVE_HAVE_CUDNN_FRONTEND
  if (g.sdpa != nullptr) {
    ATTN_RETURN_IF_ERROR(g.sdpa->Forward(DenseSpecOf(g.causal), g.shape, DType::kBF16, g.q.get(),
                                         g.k.get(), g.v.get(), g.o.get(), g.lse.as<float>(),
                                         g.stream));
  } else
#endif
  {
    ATTN_RETURN_IF_ERROR(
        g.plan->Run(g.q.get(), g.k.get(), g.v.get(), g.o.get(), g.lse.as<float>(), g.stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  return Seconds(t0, Clock::now());
}

struct RingResult {
  absl::Status status;
  std::vector<double> times;
  std::vector<RingCudaRankStats> stats;
  double check_o_rel = NAN;  // vs the single-GPU output on sampled rows
  double check_lse_abs = NAN;
};

// Runs a P-rank ring on devices [0, P) over `shape`, `runs` times (the first `warmup` untimed).
// Inputs: copied from `source` (device 0's full tensors) when given, else filled on each device.
// When `source` is given, O/LSE are compared with source->o / source->lse on sampled rows.
RingResult RunRing(const AttentionShape& shape, bool causal, int devices, int warmup, int reps,
                   SingleGpu* source, uint64_t seed, bool cudnn = false) {
  RingResult res;
  const AttentionSpec spec = DenseSpecOf(causal);
  RingCudaPlanOptions po;
  po.cudnn_pieces = cudnn;
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(spec, shape.tokens, devices, po);
  if (!plan.ok()) {
    res.status = plan.status();
    return res;
  }
  ForceNcclNvlsOff();
  absl::StatusOr<std::shared_ptr<NcclGroup>> group = NcclGroup::Create(devices);
  if (!group.ok()) {
    res.status = group.status();
    return res;
  }
  Barrier barrier(devices);
  std::vector<absl::Status> status(devices);
  std::vector<std::vector<double>> errs(devices, std::vector<double>(2, 0.0));
  std::vector<std::vector<double>> refmax(devices, std::vector<double>(1, 0.0));
  res.stats.resize(devices);
  Clock::time_point t0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const int64_t hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim, n = shape.tokens;

  auto rank_fn = [&](int rank) -> absl::Status {
    ATTN_ASSIGN_OR_RETURN(
        std::unique_ptr<RingCudaRank> r,
        RingCudaRank::Create(*plan, shape, DType::kBF16, scale, rank, rank, *group, {}));
    const int64_t nl = r->shard_tokens();
    // Inputs (B = 1 here: shard rows are the ranges' rows, concatenated).
    if (source != nullptr) {
      int64_t local = 0;
      for (const TokenRange& rg : r->ranges()) {
        auto copy = [&](void* dst, const void* src, int64_t heads) -> absl::Status {
          CUDA_RETURN_IF_ERROR(
              cudaMemcpyPeer(static_cast<std::byte*>(dst) + local * heads * d * 2, rank,
                             static_cast<const std::byte*>(src) + rg.begin * heads * d * 2,
                             source->device, rg.size() * heads * d * 2));
          return absl::OkStatus();
        };
        ATTN_RETURN_IF_ERROR(copy(r->q(), source->q.get(), hq));
        ATTN_RETURN_IF_ERROR(copy(r->k(), source->k.get(), hkv));
        ATTN_RETURN_IF_ERROR(copy(r->v(), source->v.get(), hkv));
        local += rg.size();
      }
    } else {
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, r->q(), nl * hq * d, seed + rank, -1.f,
                                             1.f, r->stream()));
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, r->k(), 2 * nl * hkv * d,
                                             seed + 100 + rank, -1.f, 1.f, r->stream()));
    }
    // cudaMemcpyPeer runs on the legacy default stream, which r->stream() does not wait for.
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    for (int it = 0; it < warmup + reps; ++it) {
      if (!barrier.Arrive()) return absl::AbortedError("another rank failed");
      if (rank == 0) t0 = Clock::now();
      ATTN_RETURN_IF_ERROR(r->Run());
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
      if (!barrier.Arrive()) return absl::AbortedError("another rank failed");
      if (rank == 0 && it >= warmup) res.times.push_back(Seconds(t0, Clock::now()));
    }
    res.stats[rank] = r->stats();
    if (source != nullptr) {
      // Sampled rows: every 509th row of each range, all heads.
      std::vector<uint16_t> o_shard(nl * hq * d);
      std::vector<float> lse_shard(hq * nl);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(o_shard.data(), r->o(), o_shard.size() * 2, cudaMemcpyDeviceToHost));
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(lse_shard.data(), r->lse(), lse_shard.size() * 4, cudaMemcpyDeviceToHost));
      std::vector<uint16_t> o_ref(hq * d);
      std::vector<float> lse_ref(1);
      auto bf = [](uint16_t x) {
        uint32_t u = static_cast<uint32_t>(x) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
      };
      int64_t local = 0;
      for (const TokenRange& rg : r->ranges()) {
        for (int64_t row = rg.begin; row < rg.end; row += 509) {
          const int64_t lr = local + (row - rg.begin);
          CUDA_RETURN_IF_ERROR(cudaMemcpy(
              o_ref.data(), static_cast<const std::byte*>(source->o.get()) + row * hq * d * 2,
              hq * d * 2, cudaMemcpyDeviceToHost));
          for (int64_t i = 0; i < hq * d; ++i) {
            const double a = bf(o_shard[lr * hq * d + i]), b = bf(o_ref[i]);
            errs[rank][0] = std::max(errs[rank][0], std::fabs(a - b));
            refmax[rank][0] = std::max(refmax[rank][0], std::fabs(b));
          }
          for (int64_t h = 0; h < hq; ++h) {
            CUDA_RETURN_IF_ERROR(cudaMemcpy(lse_ref.data(), source->lse.as<float>() + h * n + row,
                                            4, cudaMemcpyDeviceToHost));
            errs[rank][1] = std::max(
                errs[rank][1], static_cast<double>(std::fabs(lse_shard[h * nl + lr] - lse_ref[0])));
          }
        }
        local += rg.size();
      }
    }
    return absl::OkStatus();
  };

  std::vector<std::thread> threads;
  for (int rank = 0; rank < devices; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = rank_fn(rank);
      if (!status[rank].ok()) {
        (*group)->Abort(status[rank]);
        barrier.Abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) {
      res.status = s;
      return res;
    }
  }
  if (source != nullptr) {
    double e = 0, m = 0, l = 0;
    for (int p = 0; p < devices; ++p) {
      e = std::max(e, errs[p][0]);
      m = std::max(m, refmax[p][0]);
      l = std::max(l, errs[p][1]);
    }
    res.check_o_rel = e / std::max(m, 1e-30);
    res.check_lse_abs = l;
  }
  return res;
}

// Data parallel: heads split over the devices, each device a full-sequence plan of its heads,
// all running concurrently; wall time of the slowest, and each device's peak bytes.
struct DpResult {
  absl::Status status;
  double median_s = NAN;
  std::vector<int64_t> peak_bytes;
};

DpResult RunDataParallel(const AttentionShape& shape, bool causal, int devices, int warmup,
                         int reps) {
  DpResult res;
  AttentionShape part = shape;
  part.q_heads = shape.q_heads / devices;
  part.kv_heads = std::max<int64_t>(1, shape.kv_heads / devices);
  Barrier barrier(devices);
  std::vector<absl::Status> status(devices);
  std::vector<double> times;
  res.peak_bytes.assign(devices, 0);
  Clock::time_point t0;
  std::vector<std::thread> threads;
  for (int dev = 0; dev < devices; ++dev) {
    threads.emplace_back([&, dev] {
      status[dev] = [&]() -> absl::Status {
        ATTN_ASSIGN_OR_RETURN(auto g, MakeSingleGpu(dev, part, causal, 7 + dev));
        for (int it = 0; it < warmup + reps; ++it) {
          if (!barrier.Arrive()) return absl::AbortedError("another device failed");
          if (dev == 0) t0 = Clock::now();
          ATTN_RETURN_IF_ERROR(RunSingleOnce(*g).status());
          if (!barrier.Arrive()) return absl::AbortedError("another device failed");
          if (dev == 0 && it >= warmup) times.push_back(Seconds(t0, Clock::now()));
        }
        res.peak_bytes[dev] = g->alloc->Stats().peak_bytes;
        return absl::OkStatus();
      }();
      if (!status[dev].ok()) barrier.Abort();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) {
      res.status = s;
      return res;
    }
  }
  res.median_s = Median(times);
  return res;
}

std::string JsonStr(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}
std::string JsonNum(double x) { return std::isfinite(x) ? absl::StrFormat("%.6g", x) : "null"; }
std::string JsonInts(const std::vector<int64_t>& v) {
  std::string out = "[";
  absl::StrAppend(&out, absl::StrJoin(v, ", "), "]");
  return out;
}

int Main(const Options& opt) {
  const auto start = Clock::now();
  auto elapsed = [&] { return Seconds(start, Clock::now()); };
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaDeviceProp prop{};
  if (count > 0) cudaGetDeviceProperties(&prop, 0);
  std::printf("attnbench_ring: %d GPU(s), %s; ring over %d\n", count, prop.name, opt.devices);
  if (count < opt.devices) {
    std::printf("need %d GPUs, found %d\n", opt.devices, count);
    return 2;
  }
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::vector<std::string> cases_json, longest_json;
  std::vector<std::string> table;
  table.push_back(
      "| engine | N | causal | T1 (s) | T2 ring (s) | eff T1/(P*T2) | T1 TF/s | ring TF/s | DP (s) | "
      "ring peak GiB/GPU | DP peak GiB/GPU | 1-GPU peak GiB | NCCL MiB sent/recv per GPU | check "
      "|");
  table.push_back("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
  const double gib = 1024.0 * 1024 * 1024;
  // Rewritten after every case, so a run cut short by a timeout still leaves its results.
  auto write_json = [&] {
    if (opt.json.empty()) return;
    std::ofstream f(opt.json);
    f << "{\"bench\": \"attnbench_ring\", \"device\": " << JsonStr(prop.name)
      << ", \"gpus\": " << opt.devices << ", \"date\": " << JsonStr(date)
      << ", \"commit\": " << JsonStr(opt.commit) << ", \"command\": " << JsonStr(opt.command)
      << ", \"dtype\": \"bf16\", \"batch\": 1, \"heads\": " << opt.heads
      << ", \"head_dim\": " << opt.dim << ", \"reps\": " << opt.reps
      << ", \"flops_formula\": \"4*B*Hq*D*pairs (causal N(N+1)/2)\""
      << ", \"cases\": [" << absl::StrJoin(cases_json, ", ") << "], \"longest\": ["
      << absl::StrJoin(longest_json, ", ") << "], \"wall_s\": " << JsonNum(elapsed()) << "}\n";
  };

  std::vector<std::string> engines;
  if (opt.engine == "both" || opt.engine == "own") engines.push_back("own");
  if (opt.engine == "both" || opt.engine == "cudnn") engines.push_back("cudnn");
  for (int64_t n : opt.ns) {
   for (const std::string& engine : engines) {
    const bool use_cudnn = engine == "cudnn";
    for (bool causal : {false, true}) {
      const AttentionShape shape{1, n, opt.heads, opt.heads, opt.dim};
      if (elapsed() > opt.budget_s) {
        std::printf("N=%lld causal=%d: skipped (bench budget %.0f s spent)\n",
                    static_cast<long long>(n), causal, opt.budget_s);
        cases_json.push_back(absl::StrCat("{\"n\": ", n, ", \"causal\": ",
                                          causal ? "true" : "false", ", \"skipped\": \"budget\"}"));
        continue;
      }
      const double flops = DenseFlops(shape, causal);
      std::string err;
      // T1.
      std::vector<double> t1s;
      int64_t t1_peak = 0;
      auto single = MakeSingleGpu(0, shape, causal, 1234, use_cudnn);
      if (!single.ok()) {
        err = absl::StrCat("single: ", single.status().ToString());
      } else {
        for (int it = 0; it < opt.warmup + opt.reps && err.empty(); ++it) {
          auto t = RunSingleOnce(**single);
          if (!t.ok()) {
            err = absl::StrCat("single: ", t.status().ToString());
          } else if (it >= opt.warmup) {
            t1s.push_back(*t);
          }
        }
        t1_peak = (*single)->alloc->Stats().peak_bytes;
      }
      const double t1 = Median(t1s);
      // T2 (ring), checked against T1's output.
      RingResult ring;
      if (err.empty()) {
        ring = RunRing(shape, causal, opt.devices, opt.warmup, opt.reps, single->get(), 1234,
                       use_cudnn);
        if (!ring.status.ok()) err = absl::StrCat("ring: ", ring.status.ToString());
      }
      single = absl::UnknownError("released");  // free device 0 before the data-parallel run
      const double t2 = Median(ring.times);
      DpResult dp;
      if (err.empty()) {
        dp = RunDataParallel(shape, causal, opt.devices, /*warmup=*/0, /*reps=*/1);
        if (!dp.status.ok()) err = absl::StrCat("data-parallel: ", dp.status.ToString());
      }
      const double eff = t1 / (opt.devices * t2);
      int64_t ring_peak = 0, sent = 0, recv = 0;
      std::vector<int64_t> ring_peaks, sents, recvs;
      std::vector<int64_t> cudnn_counts;
      for (const RingCudaRankStats& s : ring.stats) {
        cudnn_counts.push_back(s.cudnn_pieces);
        ring_peak = std::max(ring_peak, s.peak_device_bytes);
        ring_peaks.push_back(s.peak_device_bytes);
        sents.push_back(s.bytes_sent);
        recvs.push_back(s.bytes_received);
        sent = std::max(sent, s.bytes_sent);
        recv = std::max(recv, s.bytes_received);
      }
      int64_t dp_peak = 0;
      for (int64_t b : dp.peak_bytes) dp_peak = std::max(dp_peak, b);
      const bool check_ok = ring.check_o_rel <= 1e-2 && ring.check_lse_abs <= 2e-3;
      std::printf(
          "[%s] N=%lld causal=%d  T1 %.4f s (%.1f TF/s)  T2 %.4f s (%.1f TF/s)  eff %.3f  DP %.4f s  "
          "peak GiB ring %.2f dp %.2f 1gpu %.2f  nccl MiB/GPU sent %.1f recv %.1f  check o_rel "
          "%.2e lse %.2e %s %s\n",
          engine.c_str(), static_cast<long long>(n), causal, t1, flops / t1 / 1e12, t2,
          flops / t2 / 1e12, eff,
          dp.median_s, ring_peak / gib, dp_peak / gib, t1_peak / gib, sent / 1048576.0,
          recv / 1048576.0, ring.check_o_rel, ring.check_lse_abs, check_ok ? "OK" : "FAIL",
          err.c_str());
      std::fflush(stdout);
      table.push_back(absl::StrFormat(
          "| %s | %d | %s | %.4f | %.4f | %.3f | %.1f | %.1f | %.4f | %.2f | %.2f | %.2f | "
          "%.1f/%.1f | %s |",
          engine, n, causal ? "yes" : "no", t1, t2, eff, flops / t1 / 1e12, flops / t2 / 1e12, dp.median_s,
          ring_peak / gib, dp_peak / gib, t1_peak / gib, sent / 1048576.0, recv / 1048576.0,
          err.empty() ? (check_ok ? "ok" : "FAIL") : "error"));
      cases_json.push_back(absl::StrCat(
          "{\"n\": ", n, ", \"causal\": ", causal ? "true" : "false", ", \"engine\": \"",
          engine, "\", \"ring_cudnn_pieces_per_gpu\": ", JsonInts(cudnn_counts),
          ", \"flops\": ", JsonNum(flops), ", \"t1_s\": ", JsonNum(t1), ", \"t1_runs_s\": [",
          absl::StrJoin(t1s, ", "), "], \"t2_s\": ", JsonNum(t2), ", \"t2_runs_s\": [",
          absl::StrJoin(ring.times, ", "), "], \"efficiency\": ", JsonNum(eff),
          ", \"t1_tflops\": ", JsonNum(flops / t1 / 1e12),
          ", \"t2_tflops\": ", JsonNum(flops / t2 / 1e12), ", \"dp_s\": ", JsonNum(dp.median_s),
          ", \"ring_peak_bytes_per_gpu\": ", JsonInts(ring_peaks),
          ", \"dp_peak_bytes_per_gpu\": ", JsonInts(dp.peak_bytes),
          ", \"single_peak_bytes\": ", t1_peak, ", \"nccl_bytes_sent_per_gpu\": ", JsonInts(sents),
          ", \"nccl_bytes_received_per_gpu\": ", JsonInts(recvs), ", \"check_o_rel\": ",
          JsonNum(ring.check_o_rel), ", \"check_lse_abs\": ", JsonNum(ring.check_lse_abs),
          ", \"check_ok\": ", check_ok ? "true" : "false", ", \"error\": ", JsonStr(err), "}"));
      write_json();
    }
   }
  }

  // Longest dense causal sequence per mode, the modes interleaved per N so that a bench budget
  // cut treats them alike.
  std::string longest_summary;
  struct ModeState {
    const char* name;
    double last_t = 0;
    int64_t last_n = 0, best_n = 0, best_peak = 0;
    double best_t = NAN;
    bool stopped = false;
    std::string stop = "all sizes ran";
  };
  ModeState modes[2] = {{"1gpu"}, {"ring"}};
  for (int64_t n : opt.longest) {
    for (ModeState& m : modes) {
      if (m.stopped) continue;
      if (m.last_n > 0) {
        const double ratio = static_cast<double>(n) / m.last_n;
        const double predicted = m.last_t * ratio * ratio;
        if (predicted > opt.max_run_s) {
          m.stop = absl::StrFormat("N=%d predicted %.0f s > %.0f s", n, predicted, opt.max_run_s);
          m.stopped = true;
          continue;
        }
        if (elapsed() + predicted > opt.budget_s + 60) {
          m.stop = absl::StrFormat("N=%d: bench budget", n);
          m.stopped = true;
          continue;
        }
      }
      const bool ring = &m == &modes[1];
      const AttentionShape shape{1, n, opt.heads, opt.heads, opt.dim};
      double t = NAN;
      int64_t peak = 0;
      absl::Status st;
      if (!ring) {
        auto g = MakeSingleGpu(0, shape, true, 99);
        if (!g.ok()) {
          st = g.status();
        } else {
          auto r = RunSingleOnce(**g);
          st = r.status();
          if (r.ok()) t = *r;
          peak = (*g)->alloc->Stats().peak_bytes;
        }
      } else {
        RingResult r = RunRing(shape, true, opt.devices, 0, 1, nullptr, 99);
        st = r.status;
        if (st.ok()) {
          t = r.times[0];
          for (const auto& s : r.stats) peak = std::max(peak, s.peak_device_bytes);
        }
      }
      std::printf("longest %s N=%lld: %s %.3f s peak %.2f GiB/GPU\n", m.name,
                  static_cast<long long>(n), st.ok() ? "ok" : st.ToString().c_str(), t, peak / gib);
      std::fflush(stdout);
      longest_json.push_back(absl::StrCat(
          "{\"mode\": \"", m.name, "\", \"n\": ", n, ", \"ok\": ", st.ok() ? "true" : "false",
          ", \"time_s\": ", JsonNum(t), ", \"peak_bytes_per_gpu\": ", peak,
          ", \"error\": ", JsonStr(st.ok() ? "" : st.ToString()), "}"));
      write_json();
      if (!st.ok()) {
        m.stop = absl::StrCat("N=", n, " failed: ", st.message());
        m.stopped = true;
        continue;
      }
      m.last_t = t;
      m.last_n = n;
      m.best_n = n;
      m.best_t = t;
      m.best_peak = peak;
    }
  }
  for (const ModeState& m : modes) {
    longest_summary +=
        absl::StrFormat("longest dense causal %s: N=%d (%.2f s, %.2f GiB/GPU); stop: %s\n", m.name,
                        m.best_n, m.best_t, m.best_peak / gib, m.stop);
    longest_json.push_back(absl::StrCat("{\"mode\": \"", m.name, "\", \"longest_n\": ", m.best_n,
                                        ", \"stop\": ", JsonStr(m.stop), "}"));
  }

  std::printf("\n%s\n", absl::StrJoin(table, "\n").c_str());
  std::printf("%s", longest_summary.c_str());
  std::printf("bench wall %.1f s\n", elapsed());
  write_json();
  if (!opt.json.empty()) std::printf("wrote %s\n", opt.json.c_str());
  return 0;
}

// ---- --longest-causal ---------------------------------------------------------------------------

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

  Attempt Try(int64_t n, int64_t budget, double cap, const Options& opt) {
    Attempt a;
    a.n = n;
    a.status = TryImpl(n, budget, cap, opt, a);
    return a;
  }

 private:
  absl::Status TryImpl(int64_t n, int64_t budget, double cap, const Options& opt, Attempt& a) {
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
        ATTN_ASSIGN_OR_RETURN(plan,
                              CudaAttentionPlan::Create(spec, shape, DType::kBF16, alloc, stream));
        run = [&]() {
          return plan->Run(q.get(), k.get(), v.get(), o.get(), lse.as<float>(), stream);
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

// The ring over devices [0, P) with device_memory_budget = budget and each rank's allocator
// limited to it; a fresh NCCL group per attempt (borrowed communicator API of RingCudaRank).
Attempt TryRing(int64_t n, int64_t budget, double cap, const Options& opt) {
  Attempt a;
  a.n = n;
  const int P = opt.devices;
  const AttentionShape shape{1, n, opt.heads, opt.heads, opt.dim};
  RingCudaPlanOptions po;
  po.device_memory_budget = budget;
  po.cudnn_pieces = RingCudnnPiecesWanted();  // as RingCudaRun plans it in the service
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(DenseSpecOf(true), shape, DType::kBF16, P, po);
  if (!plan.ok()) {
    a.status = plan.status();  // no schedule fits: the plan's figures are the allocations'
    return a;
  }
  a.q_chunks = plan->q_chunks;
  a.kv_pieces = plan->kv_pieces;
  a.engine = "ring flash_fwd";
  ForceNcclNvlsOff();
  absl::StatusOr<std::shared_ptr<NcclGroup>> group = NcclGroup::Create(P);
  if (!group.ok()) {
    a.status = group.status();
    return a;
  }
  Barrier barrier(P);
  std::vector<absl::Status> status(P);
  std::vector<char> created(P, 0);
  a.peak_bytes.assign(P, 0);
  a.estimated_bytes.assign(P, 0);
  bool stop = false;
  double t = NAN;
  Clock::time_point t0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  auto rank_fn = [&](int rank) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
    NcclCommunicator::Options copts;
    copts.group = *group;
    copts.rank = rank;
    copts.cuda_device = rank;
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm, NcclCommunicator::Create(copts));
    CachingAllocator alloc(rank);
    alloc.set_limit(budget);
    absl::StatusOr<std::unique_ptr<RingCudaRank>> made = RingCudaRank::Create(
        *plan, shape, DType::kBF16, scale, rank, rank, *comm, &alloc, nullptr, {});
    created[rank] = made.ok();
    if (!barrier.Arrive()) return absl::AbortedError("another rank failed");
    for (int p = 0; p < P; ++p) {
      if (!created[p]) {
        a.peak_bytes[rank] = alloc.Stats().peak_bytes;
        return made.ok() ? absl::AbortedError(absl::StrCat("rank ", p, " could not allocate"))
                         : made.status();
      }
    }
    std::unique_ptr<RingCudaRank> r = *std::move(made);
    const int64_t nl = r->shard_tokens();
    CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, r->q(), nl * shape.q_heads * shape.head_dim,
                                           11 + rank, -1.f, 1.f, r->stream()));
    int j = 0;
    for (auto [ptr, bytes] : r->HomeKv()) {
      CUDA_RETURN_IF_ERROR(LaunchFillUniform(DType::kBF16, ptr, bytes / 2, 100 * (rank + 1) + j++,
                                             -1.f, 1.f, r->stream()));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
    for (int it = 0; it < 2; ++it) {
      if (!barrier.Arrive()) return absl::AbortedError("another rank failed");
      if (rank == 0) t0 = Clock::now();
      ATTN_RETURN_IF_ERROR(r->Run());
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream()));
      if (!barrier.Arrive()) return absl::AbortedError("another rank failed");
      if (rank == 0) {
        t = Seconds(t0, Clock::now());
        stop = t > cap;
      }
      if (!barrier.Arrive()) return absl::AbortedError("another rank failed");
      if (stop) break;
    }
    const RingCudaRankStats rs = r->stats();
    a.peak_bytes[rank] = alloc.Stats().peak_bytes;
    a.estimated_bytes[rank] = rs.estimated_device_bytes;
    r.reset();
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < P; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = rank_fn(rank);
      if (!status[rank].ok()) {
        (*group)->Abort(status[rank]);
        barrier.Abort();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) {
      a.status = s;
      return a;
    }
  }
  if (stop) {
    a.status = absl::DeadlineExceededError(
        absl::StrFormat("run took %.1f s > --time-cap-s %.1f", t, cap));
  }
  a.time_s = t;
  return a;
}

int LongestCausalMain(const Options& opt) {
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
  const double gib = 1024.0 * 1024 * 1024;
  const int64_t budget = static_cast<int64_t>(opt.memory_budget_gib * gib);
  constexpr int64_t kStep = 4096;
  std::printf("attnbench_ring --longest-causal: %s, budget %.2f GiB per GPU, ring over %d, "
              "time cap %.0f s\n", prop.name, opt.memory_budget_gib, opt.devices, opt.time_cap_s);
  std::vector<std::string> attempts_json;
  auto attempt_json = [&](const char* mode, const Attempt& a) {
    return absl::StrCat(
        "{\"mode\": \"", mode, "\", \"n\": ", a.n, ", \"ok\": ", a.status.ok() ? "true" : "false",
        ", \"time_s\": ", JsonNum(a.time_s), ", \"peak_bytes_per_gpu\": ", JsonInts(a.peak_bytes),
        ", \"estimated_bytes_per_gpu\": ", JsonInts(a.estimated_bytes), ", \"engine\": ",
        JsonStr(a.engine), ", \"q_chunks\": ", a.q_chunks, ", \"kv_pieces\": ", a.kv_pieces,
        ", \"error\": ", JsonStr(a.status.ok() ? "" : a.status.ToString()), "}");
  };
  // Doubling from `first`, then bisection on multiples of kStep; the best success.
  auto search = [&](const char* mode, int64_t first, auto&& try_fn) -> Attempt {
    Attempt best;
    int64_t lo = 0, hi = 0;
    auto run = [&](int64_t n) {
      Attempt a = try_fn(n);
      std::printf("  %s N=%lld: %s  %.3f s  peak %.3f GiB/GPU%s\n", mode,
                  static_cast<long long>(n), a.status.ok() ? "ok" : a.status.ToString().c_str(),
                  a.time_s,
                  a.peak_bytes.empty() ? 0.0
                                       : *std::max_element(a.peak_bytes.begin(), a.peak_bytes.end()) / gib,
                  a.q_chunks > 0 ? absl::StrFormat("  (qc, c) = (%d, %d)", a.q_chunks, a.kv_pieces).c_str()
                                 : "");
      std::fflush(stdout);
      attempts_json.push_back(attempt_json(mode, a));
      if (a.status.ok()) {
        lo = n;
        best = a;
      } else {
        hi = n;
      }
      return a.status.ok();
    };
    for (int64_t n = std::max(kStep, first / kStep * kStep); run(n); n *= 2) {
      if (elapsed() > opt.budget_s) return best;
    }
    while (hi - lo > kStep && elapsed() <= opt.budget_s) {
      int64_t mid = (lo + hi) / 2 / kStep * kStep;
      if (mid <= lo) mid = lo + kStep;
      if (mid >= hi) break;
      run(mid);
    }
    return best;
  };
  LimitedSingleGpu single(0);
  const Attempt a1 = search("1gpu", 65536, [&](int64_t n) {
    return single.Try(n, budget, opt.time_cap_s, opt);
  });
  const Attempt a2 = search("ring", std::max<int64_t>(a1.n, 65536), [&](int64_t n) {
    return TryRing(n, budget, opt.time_cap_s, opt);
  });
  const double ratio = a1.n > 0 ? static_cast<double>(a2.n) / a1.n : NAN;
  std::printf("longest dense causal under %.2f GiB/GPU: 1 GPU N1=%lld (%s, %.3f s), ring x%d "
              "N2=%lld ((qc, c) = (%d, %d), %.3f s), N2/N1 = %.3f\n",
              opt.memory_budget_gib, static_cast<long long>(a1.n), a1.engine.c_str(), a1.time_s,
              opt.devices, static_cast<long long>(a2.n), a2.q_chunks, a2.kv_pieces, a2.time_s,
              ratio);
  if (!opt.json.empty()) {
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::ofstream f(opt.json);
    f << "{\"bench\": \"attnbench_ring_longest_causal\", \"device\": " << JsonStr(prop.name)
      << ", \"gpus\": " << opt.devices << ", \"date\": " << JsonStr(date)
      << ", \"commit\": " << JsonStr(opt.commit) << ", \"command\": " << JsonStr(opt.command)
      << ", \"dtype\": \"bf16\", \"batch\": 1, \"heads\": " << opt.heads
      << ", \"head_dim\": " << opt.dim << ", \"memory_budget_bytes\": " << budget
      << ", \"budget_enforcement\": \"CachingAllocator::set_limit (rounded sizes; CUDA context, "
         "cuDNN handle and NCCL buffers not counted)\""
      << ", \"time_cap_s\": " << JsonNum(opt.time_cap_s) << ", \"n1\": " << a1.n
      << ", \"n2\": " << a2.n << ", \"ratio\": " << JsonNum(ratio)
      << ", \"single\": " << attempt_json("1gpu", a1) << ", \"ring\": " << attempt_json("ring", a2)
      << ", \"attempts\": [" << absl::StrJoin(attempts_json, ", ")
      << "], \"wall_s\": " << JsonNum(elapsed()) << "}\n";
    std::printf("wrote %s\n", opt.json.c_str());
  }
  return a1.n > 0 && a2.n > 0 ? 0 : 1;
}

bool ParseInts(const char* s, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t x;
    if (!absl::SimpleAtoi(part, &x) || x <= 0) return false;
    out->push_back(x);
  }
  return true;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  attnserve::Options opt;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) opt.command += ' ';
    opt.command += argv[i];
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const std::string& flag) -> const char* {
      const std::string f = flag + "=";
      return absl::StartsWith(a, f) ? argv[i] + f.size() : nullptr;
    };
    bool ok = true;
    // Space-separated values of the longest-causal flags: "--memory-budget-gib 4".
    auto spaced = [&](const std::string& flag) -> const char* {
      if (a == flag && i + 1 < argc) return argv[++i];
      return val(flag);
    };
    if (a == "--longest-causal") {
      opt.longest_causal = true;
    } else if (const char* v = spaced("--memory-budget-gib")) {
      ok = absl::SimpleAtod(v, &opt.memory_budget_gib) && opt.memory_budget_gib > 0;
    } else if (const char* v = spaced("--time-cap-s")) {
      ok = absl::SimpleAtod(v, &opt.time_cap_s) && opt.time_cap_s > 0;
    } else if (const char* v = val("--json")) {
      opt.json = v;
    } else if (const char* v = val("--ns")) {
      ok = attnserve::ParseInts(v, &opt.ns);
    } else if (const char* v = val("--longest")) {
      ok = std::string(v).empty() ? (opt.longest.clear(), true)
                                  : attnserve::ParseInts(v, &opt.longest);
    } else if (const char* v = val("--reps")) {
      ok = absl::SimpleAtoi(v, &opt.reps) && opt.reps >= 1;
    } else if (const char* v = val("--warmup")) {
      ok = absl::SimpleAtoi(v, &opt.warmup) && opt.warmup >= 0;
    } else if (const char* v = val("--heads")) {
      ok = absl::SimpleAtoi(v, &opt.heads) && opt.heads >= 1;
    } else if (const char* v = val("--dim")) {
      ok = absl::SimpleAtoi(v, &opt.dim);
    } else if (const char* v = val("--devices")) {
      ok = absl::SimpleAtoi(v, &opt.devices) && opt.devices >= 1;
    } else if (const char* v = val("--max_run_s")) {
      ok = absl::SimpleAtod(v, &opt.max_run_s);
    } else if (const char* v = val("--budget_s")) {
      ok = absl::SimpleAtod(v, &opt.budget_s);
    } else if (const char* v = val("--engine")) {
      opt.engine = v;
      ok = opt.engine == "own" || opt.engine == "cudnn" || opt.engine == "both";
    } else if (const char* v = val("--commit")) {
      opt.commit = v;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "attnbench_ring: bad flag %s (see the header of ring_bench_main.cc)\n",
                   a.c_str());
      return 2;
    }
  }
  return opt.longest_causal ? attnserve::LongestCausalMain(opt) : attnserve::Main(opt);
}
