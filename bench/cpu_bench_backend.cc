#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "bench/bench_backend.h"
#include "core/util/status_macros.h"
#include "core/util/thread_pool.h"

namespace attnserve::bench {
namespace {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

class CpuBenchBackend final : public BenchBackend {
 public:
  explicit CpuBenchBackend(int threads) : threads_(threads) {
    // ParallelFor runs items on the calling thread too, so threads - 1 workers give `threads`.
    if (threads_ > 1) pool_ = std::make_unique<ThreadPool>(threads_ - 1);
  }

  std::string device() const override {
    return absl::StrCat("cpu: ", CpuModelName(), ", ", threads_, " threads");
  }

  absl::Status Prepare(const AttentionSpec& spec, const CompiledPattern& compiled,
                       const HostTensor& q, const HostTensor& k,
                       const HostTensor& v) override {
    spec_ = &spec;
    compiled_ = &compiled;
    q_ = &q;
    k_ = &k;
    v_ = &v;
    // Outputs are allocated once: a server reuses its buffers too, and the timing should show
    // the attention, not page faults of fresh allocations.
    ATTN_ASSIGN_OR_RETURN(out_.o, HostTensor::Create(q.dtype(), q.dims()));
    ATTN_ASSIGN_OR_RETURN(out_.lse, HostTensor::Create(DType::kF32, {q.dim(0), q.dim(2), q.dim(1)}));
    out_.o.FillBytes(0xFF);  // poisoned: the check proves every element is written
    out_.lse.FillBytes(0xFF);
    return absl::OkStatus();
  }

  absl::Status Run() override {
    CpuRunOptions options;
    options.pool = pool_.get();
    return CpuAttentionInto(*spec_, *compiled_, *q_, *k_, *v_, options, out_.o, out_.lse);
  }

  absl::StatusOr<const AttentionOutputs*> Outputs() override { return &out_; }

  // Every thread multiplies its own 1024^3 float matrices at the same time (Eigen is
  // single-threaded here, as in the attention tiles); the rate is the sum of the per-thread
  // rates, each the best of a few repetitions.
  absl::StatusOr<double> MeasureGemmGflops() override {
    static constexpr int kN = 1024;
    static constexpr int kReps = 4;
    std::vector<double> rate(threads_, 0.0);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) {
      workers.emplace_back([t, &rate] {
        Eigen::MatrixXf a = Eigen::MatrixXf::Random(kN, kN);
        Eigen::MatrixXf b = Eigen::MatrixXf::Random(kN, kN);
        Eigen::MatrixXf c(kN, kN);
        c.noalias() = a * b;  // warm-up: caches, page faults
        for (int r = 0; r < kReps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          c.noalias() = a * b;
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          rate[t] = std::max(rate[t], 2.0 * kN * kN * kN / s / 1e9);
        }
        // Keep the product observable so it is not optimised away.
        if (c(0, 0) == 12345.f) std::printf(" ");
      });
    }
    for (auto& w : workers) w.join();
    double sum = 0;
    for (double r : rate) sum += r;
    return sum;
  }

 private:
  int threads_;
  std::unique_ptr<ThreadPool> pool_;
  const AttentionSpec* spec_ = nullptr;
  const CompiledPattern* compiled_ = nullptr;
  const HostTensor* q_ = nullptr;
  const HostTensor* k_ = nullptr;
  const HostTensor* v_ = nullptr;
  AttentionOutputs out_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchBackend>> MakeCpuBenchBackend(int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads: must be >= 1, got ", threads));
  }
  return std::make_unique<CpuBenchBackend>(threads);
}

}  // namespace attnserve::bench
