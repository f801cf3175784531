// attnbench_ring: ring attention over GPUs (core/dist/ring_cuda) against the same flash_fwd kernel
// on one GPU, and the per-GPU memory of ring vs data-parallel (heads split over the GPUs).
//
//   attnbench_ring [--json=PATH] [--ns=262144,524288] [--reps=5] [--warmup=1] [--heads=8]
//                  [--dim=128] [--devices=2] [--longest=1048576,2097152,4194304]
//                  [--max_run_s=60] [--budget_s=220] [--commit=SHA]
//
// Timing: every rank (host thread) passes a barrier, rank 0 takes the host clock, each rank runs
// and synchronizes its stream, a second barrier, rank 0 takes the clock: wall time of the whole
// ring including every transfer. Median of --reps runs after --warmup runs. T1 is the single-GPU
// CudaAttentionPlan on the full sequence (same kernel), timed the same way.
// FLOPs: 4 * B * Hq * D * admitted pairs (causal: the kept triangle N(N+1)/2).
// Efficiency: T1 / (P * T2) (1.0 = perfect scaling).
// Correctness: the ring's O/LSE are compared with T1's on every 509th query row of each range (max
// |dO| / max|O| and max |dLSE|), printed and recorded. Data parallel (heads split over the GPUs,
// full sequence each): one run, for its memory and a rough time. Longest sequence: dense causal,
// one run per N on 1 GPU and on the ring, ascending; a mode stops at its first failure or when the
// run predicted from the previous one (time ~ N^2) exceeds
// --max_run_s. The whole bench skips stages that would start after --budget_s.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
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

absl::StatusOr<std::unique_ptr<SingleGpu>> MakeSingleGpu(int device, const AttentionShape& shape,
                                                         bool causal, uint64_t seed) {
  auto g = std::make_unique<SingleGpu>();
  g->device = device;
  g->shape = shape;
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
  ATTN_RETURN_IF_ERROR(
      g.plan->Run(g.q.get(), g.k.get(), g.v.get(), g.o.get(), g.lse.as<float>(), g.stream));
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
                   SingleGpu* source, uint64_t seed) {
  RingResult res;
  const AttentionSpec spec = DenseSpecOf(causal);
  absl::StatusOr<RingCudaPlan> plan = PlanRingCuda(spec, shape.tokens, devices);
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
      "| N | causal | T1 (s) | T2 ring (s) | eff T1/(P*T2) | T1 TF/s | ring TF/s | DP (s) | "
      "ring peak GiB/GPU | DP peak GiB/GPU | 1-GPU peak GiB | NCCL MiB sent/recv per GPU | check "
      "|");
  table.push_back("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
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

  for (int64_t n : opt.ns) {
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
      auto single = MakeSingleGpu(0, shape, causal, 1234);
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
        ring = RunRing(shape, causal, opt.devices, opt.warmup, opt.reps, single->get(), 1234);
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
      for (const RingCudaRankStats& s : ring.stats) {
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
          "N=%lld causal=%d  T1 %.4f s (%.1f TF/s)  T2 %.4f s (%.1f TF/s)  eff %.3f  DP %.4f s  "
          "peak GiB ring %.2f dp %.2f 1gpu %.2f  nccl MiB/GPU sent %.1f recv %.1f  check o_rel "
          "%.2e lse %.2e %s %s\n",
          static_cast<long long>(n), causal, t1, flops / t1 / 1e12, t2, flops / t2 / 1e12, eff,
          dp.median_s, ring_peak / gib, dp_peak / gib, t1_peak / gib, sent / 1048576.0,
          recv / 1048576.0, ring.check_o_rel, ring.check_lse_abs, check_ok ? "OK" : "FAIL",
          err.c_str());
      std::fflush(stdout);
      table.push_back(absl::StrFormat(
          "| %d | %s | %.4f | %.4f | %.3f | %.1f | %.1f | %.4f | %.2f | %.2f | %.2f | %.1f/%.1f | "
          "%s |",
          n, causal ? "yes" : "no", t1, t2, eff, flops / t1 / 1e12, flops / t2 / 1e12, dp.median_s,
          ring_peak / gib, dp_peak / gib, t1_peak / gib, sent / 1048576.0, recv / 1048576.0,
          err.empty() ? (check_ok ? "ok" : "FAIL") : "error"));
      cases_json.push_back(absl::StrCat(
          "{\"n\": ", n, ", \"causal\": ", causal ? "true" : "false",
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
    if (const char* v = val("--json")) {
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
  return attnserve::Main(opt);
}
