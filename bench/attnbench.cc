// attnbench: kernel-level benchmark of one attention spec on one backend. Every run
//   (a) checks correctness against the float64 reference at --check-tokens (fails non-zero when
//       the error is over the dtype's tolerance),
//   (b) times the full size (median of --iters runs after --warmup),
//   (c) reports tokens/s, GFLOP/s, sparsity and the layout compile time, and
//   (d) measures the device's GEMM rate in the same process and reports the ratio.
// FLOPs = 4 * B * Hq * D * AdmittedPairs: two GEMMs (Q K^T and P V) of 2 * D FLOPs per admitted
// (query, key) pair and head. AdmittedPairs is the layout's count (causal counts the kept
// triangle); for dilated specs it is the sum over branches and heads of the pairs inside each
// gathered segment (L^2, or L (L + 1) / 2 when causal, per segment of length L).
//
// Backends: cpu (always); cuda (builds with the CUDA backend: our flash_fwd kernels on GPU
// --device, f32 computed in bf16 and checked at the GPU tolerances; --kernel picks the flash
// kernel, the environment's ATTNSERVE_* variables override it, see core/cuda/cuda_options.h).
//
// Example:
//   attnbench --backend cpu --spec '{"dense": {}}' --tokens 8192 --heads 8 --head-dim 64
//   attnbench --backend cuda --device 0 --spec '{"dense": {}, "causal": true}' --tokens 65536
//             --heads 16 --head-dim 128 --dtype bf16
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_backend.h"
#include "bench/harness/flags.h"
#include "core/util/json.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/run_record.h"
#ifdef ATTNSERVE_BENCH_HAVE_CUDA
#include "bench/cuda/cuda_bench.h"
#endif
#include "core/reference/reference.h"
#include "core/spec/pattern_compiler.h"
#include "core/util/status_macros.h"
#include "wire/convert.h"

ABSL_FLAG(std::string, backend, "cpu", "cpu|cuda");
ABSL_FLAG(std::string, spec, R"({"dense": {}})",
          "the proto3 JSON mapping of AttentionSpec, as attnctl --spec takes it");
ABSL_FLAG(int64_t, batch, 1, "B");
ABSL_FLAG(int64_t, tokens, 4096, "N");
ABSL_FLAG(int64_t, heads, 8, "Hq");
ABSL_FLAG(int64_t, kv_heads, 0, "Hkv (0: as --heads)");
ABSL_FLAG(int64_t, head_dim, 64, "D");
ABSL_FLAG(std::string, dtype, "f32", "f32|f16|bf16");
ABSL_FLAG(int64_t, warmup, 1, "untimed runs before the timed ones");
ABSL_FLAG(int64_t, iters, 5, "timed runs (the median is reported)");
ABSL_FLAG(int64_t, threads, 0, "cpu backend: threads (0: every hardware thread)");
ABSL_FLAG(int64_t, device, 0, "cuda backend: CUDA ordinal");
ABSL_FLAG(std::string, kernel, "auto",
          "cuda backend: flash kernel auto|sm80|sm90 ($ATTNSERVE_FLASH_KERNEL overrides)");
ABSL_FLAG(int64_t, check_tokens, -1,
          "N of the correctness check (-1: min(--tokens, 1024); 0: skip the check)");
ABSL_FLAG(uint64_t, seed, 1, "input seed");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace attnserve::bench {
namespace {

constexpr char kUsage[] =
    "attnbench [--backend cpu|cuda] [--spec JSON] [--batch B] [--tokens N] [--heads Hq] "
    "[--kv-heads Hkv] [--head-dim D] [--dtype f32|f16|bf16] ... [--json-out FILE]\n"
    "--spec takes the proto3 JSON mapping of AttentionSpec, e.g.\n"
    "  '{\"window\": {\"size\": 256}, \"causal\": true}'\n"
    "  '{\"dilated\": {\"segmentLengths\": [2048, 4096], \"dilationRates\": [1, 2]}}'\n"
    "  '{\"blockSparse\": {\"blockSize\": 128, \"random\": {\"keep\": 0.1, \"seed\": 1}}}'";

struct Flags {
  std::string backend;
  std::string spec;
  int64_t batch, tokens, heads, kv_heads, head_dim;
  std::string dtype;
  int64_t warmup, iters, threads, device, check_tokens;
  std::string kernel;
  uint64_t seed;
  std::string json_out;
};

// The parsed flags with their defaults resolved.
absl::StatusOr<Flags> ReadFlags() {
  Flags f{absl::GetFlag(FLAGS_backend),   absl::GetFlag(FLAGS_spec),
          absl::GetFlag(FLAGS_batch),     absl::GetFlag(FLAGS_tokens),
          absl::GetFlag(FLAGS_heads),     absl::GetFlag(FLAGS_kv_heads),
          absl::GetFlag(FLAGS_head_dim),  absl::GetFlag(FLAGS_dtype),
          absl::GetFlag(FLAGS_warmup),    absl::GetFlag(FLAGS_iters),
          absl::GetFlag(FLAGS_threads),   absl::GetFlag(FLAGS_device),
          absl::GetFlag(FLAGS_check_tokens), absl::GetFlag(FLAGS_kernel),
          absl::GetFlag(FLAGS_seed),      absl::GetFlag(FLAGS_json_out)};
  if (f.kv_heads == 0) f.kv_heads = f.heads;
  if (f.threads == 0) f.threads = std::max(1u, std::thread::hardware_concurrency());
  if (f.check_tokens < 0) f.check_tokens = std::min<int64_t>(f.tokens, 1024);
  if (f.iters < 1) return absl::InvalidArgumentError("--iters: must be >= 1");
  return f;
}

// The --backend switch: the one place that maps a name to an implementation.
absl::StatusOr<std::unique_ptr<BenchBackend>> MakeBackend(const Flags& f) {
  if (f.backend == "cpu") return MakeCpuBenchBackend(static_cast<int>(f.threads));
#ifdef ATTNSERVE_BENCH_HAVE_CUDA
  if (f.backend == "cuda") {
    ATTN_ASSIGN_OR_RETURN(const CudaOptions options, BenchCudaOptions(f.kernel, ""));
    return MakeCudaBenchBackend(static_cast<int>(f.device), options);
  }
  constexpr char kHave[] = "cpu, cuda";
#else
  constexpr char kHave[] = "cpu";
#endif
  return absl::InvalidArgumentError(absl::StrCat(
      "--backend: '", f.backend, "' is not available in this build (have: ", kHave, ")"));
}

// Admitted (query, key) pairs of the whole problem, summed over query heads (see the file
// comment).
int64_t AdmittedPairsAllHeads(const AttentionSpec& spec, const CompiledPattern& c,
                              int64_t q_heads) {
  if (!c.dilated) return c.layout.AdmittedPairs() * q_heads;
  int64_t pairs = 0;
  for (const DilatedBranch& br : c.dilated->branches) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const DilatedGroup& g = br.groups[h % br.rate];
      for (size_t t = 0; t + 1 < g.seg_start.size(); ++t) {
        const int64_t len = g.seg_start[t + 1] - g.seg_start[t];
        pairs += spec.causal ? len * (len + 1) / 2 : len * len;
      }
    }
  }
  return pairs;
}

// The cuda backend computes f32 inputs in bf16 (core/cuda/cuda_attention.h) and its LSE comes
// from low-precision scores: the GPU tests' bounds (tests/gpu/cuda_attention_test.cc).
double OToleranceFor(const std::string& backend, DType dtype) {
  if (backend == "cuda") return dtype == DType::kF16 ? 5e-3 : 1e-2;
  return ReferenceOTolerance(dtype);
}
double LseToleranceFor(const std::string& backend, DType dtype) {
  if (backend == "cuda") return dtype == DType::kF32 ? 3e-2 : 2e-3;
  return kReferenceLseTolerance;
}

struct Inputs {
  HostTensor q, k, v;
};
absl::StatusOr<Inputs> MakeInputs(const AttentionShape& s, DType dtype, uint64_t seed) {
  Inputs in;
  ATTN_ASSIGN_OR_RETURN(in.q, HostTensor::Create(dtype, {s.batch, s.tokens, s.q_heads, s.head_dim}));
  ATTN_ASSIGN_OR_RETURN(in.k, HostTensor::Create(dtype, {s.batch, s.tokens, s.kv_heads, s.head_dim}));
  ATTN_ASSIGN_OR_RETURN(in.v, HostTensor::Create(dtype, {s.batch, s.tokens, s.kv_heads, s.head_dim}));
  FillUniform(in.q, seed * 3 + 1, -2.f, 2.f);
  FillUniform(in.k, seed * 3 + 2, -2.f, 2.f);
  FillUniform(in.v, seed * 3 + 3, -1.f, 1.f);
  return in;
}

struct CheckResult {
  bool ran = false;
  int64_t tokens = 0;
  ErrorStats stats;
  double tolerance = 0;
  bool passed = true;
};

absl::StatusOr<CheckResult> Check(const Flags& f, const AttentionSpec& spec, DType dtype,
                                  BenchBackend& backend) {
  CheckResult r;
  r.tokens = f.check_tokens;
  // A caller's csr layout fits exactly one sequence length: check at the full size.
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern);
      bs != nullptr && std::holds_alternative<CsrGen>(bs->generator)) {
    r.tokens = f.tokens;
  }
  if (r.tokens <= 0) return r;
  const AttentionShape s{1, r.tokens, f.heads, f.kv_heads, f.head_dim};
  ATTN_RETURN_IF_ERROR(ValidateShape(s));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, s));
  ATTN_ASSIGN_OR_RETURN(const Inputs in, MakeInputs(s, dtype, f.seed + 1000));
  ATTN_ASSIGN_OR_RETURN(const CompiledPattern compiled, CompileValidatedPattern(spec, s.tokens, s.q_heads));
  ATTN_RETURN_IF_ERROR(backend.Prepare(spec, compiled, in.q, in.k, in.v));
  ATTN_RETURN_IF_ERROR(backend.Run());
  ATTN_ASSIGN_OR_RETURN(const AttentionOutputs* out, backend.Outputs());
  ATTN_ASSIGN_OR_RETURN(const ReferenceResult ref, ReferenceAttention(spec, in.q, in.k, in.v));
  r.ran = true;
  r.stats = CompareToReference(ref, out->o, &out->lse);
  r.tolerance = OToleranceFor(f.backend, dtype);
  r.passed = r.stats.nonfinite == 0 && r.stats.o_rel <= r.tolerance &&
             r.stats.lse_max_abs <= LseToleranceFor(f.backend, dtype);
  return r;
}

// What the timed part of a run measured.
struct Figures {
  double compile_ms = 0;
  std::vector<double> times;  // seconds, in run order
  double median = 0, min = 0, max = 0;
  int64_t pairs = 0;
  double flops = 0, gflops = 0, tokens_per_s = 0, sparsity = 0;
  double gemm_gflops = 0, ratio = 0;
  std::string kernel;  // the flash kernel of the timed runs (cuda), else empty
};

absl::StatusOr<Figures> TimeFullSize(const Flags& f, const AttentionSpec& spec, DType dtype,
                                     BenchBackend& backend) {
  const AttentionShape shape{f.batch, f.tokens, f.heads, f.kv_heads, f.head_dim};
  Figures r;
  ATTN_ASSIGN_OR_RETURN(const Inputs in, MakeInputs(shape, dtype, f.seed));
  const auto c0 = Clock::now();
  ATTN_ASSIGN_OR_RETURN(const CompiledPattern compiled,
                        CompileValidatedPattern(spec, shape.tokens, shape.q_heads));
  r.compile_ms = 1e3 * Seconds(c0, Clock::now());
  ATTN_RETURN_IF_ERROR(backend.Prepare(spec, compiled, in.q, in.k, in.v));
  for (int64_t i = 0; i < f.warmup; ++i) ATTN_RETURN_IF_ERROR(backend.Run());
  for (int64_t i = 0; i < f.iters; ++i) {
    const auto t0 = Clock::now();
    ATTN_RETURN_IF_ERROR(backend.Run());
    r.times.push_back(Seconds(t0, Clock::now()));
  }
  r.kernel = backend.kernel();
  r.median = Median(r.times);
  r.min = *std::min_element(r.times.begin(), r.times.end());
  r.max = *std::max_element(r.times.begin(), r.times.end());
  r.pairs = AdmittedPairsAllHeads(spec, compiled, shape.q_heads);
  r.flops = 4.0 * f.batch * f.head_dim * static_cast<double>(r.pairs);
  r.gflops = r.flops / r.median / 1e9;
  r.tokens_per_s = static_cast<double>(f.batch * f.tokens) / r.median;
  // Block-level for layouts (skipped block pairs); token-level for dilated (no block layout
  // spans the whole sequence).
  r.sparsity = compiled.dilated ? 1.0 - static_cast<double>(r.pairs) /
                                            (static_cast<double>(f.tokens) * f.tokens * f.heads)
                                : compiled.layout.sparsity();
  // The GEMM yardstick, measured after the attention so both see the same clocks.
  ATTN_ASSIGN_OR_RETURN(r.gemm_gflops, backend.MeasureGemmGflops());
  r.ratio = r.gflops / r.gemm_gflops;
  return r;
}

void PrintFigures(const Flags& f, const std::string& spec_json, const CheckResult& check,
                  const Figures& r) {
  std::printf("  compile %.3f ms, sparsity %.4f, admitted pairs %lld%s\n", r.compile_ms,
              r.sparsity, static_cast<long long>(r.pairs),
              r.kernel.empty() ? "" : absl::StrCat(", flash kernel ", r.kernel).c_str());
  std::printf("  median %.4f s over %lld iters (min %.4f, max %.4f)\n", r.median,
              static_cast<long long>(f.iters), r.min, r.max);
  std::printf("  %.4g tokens/s, %.2f GFLOP/s attention, %.2f GFLOP/s sgemm, ratio %.3f\n",
              r.tokens_per_s, r.gflops, r.gemm_gflops, r.ratio);
  std::printf("\n| backend | spec | B | N | Hq | Hkv | D | dtype | median s | GFLOP/s | sgemm "
              "GFLOP/s | ratio | check |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
              "| %s | `%s` | %lld | %lld | %lld | %lld | %lld | %s | %.4f | %.2f | %.2f | %.3f | "
              "%s |\n",
              f.backend.c_str(), spec_json.c_str(), static_cast<long long>(f.batch),
              static_cast<long long>(f.tokens), static_cast<long long>(f.heads),
              static_cast<long long>(f.kv_heads), static_cast<long long>(f.head_dim),
              f.dtype.c_str(), r.median, r.gflops, r.gemm_gflops, r.ratio,
              !check.ran ? "skipped" : check.passed ? "pass" : "FAIL");
}

Json ResultJson(const Flags& f, const std::string& device, const std::string& spec_json,
                const CheckResult& check, const Figures& r) {
  Json j = Json::Object();
  AddRunRecord(MakeRunRecord(device), j);
  j.Set("backend", f.backend);
  j.Set("spec", Json::Raw(spec_json));
  j.Set("shape", Json::Object()
                     .Set("batch", f.batch)
                     .Set("tokens", f.tokens)
                     .Set("q_heads", f.heads)
                     .Set("kv_heads", f.kv_heads)
                     .Set("head_dim", f.head_dim));
  j.Set("dtype", f.dtype);
  j.Set("threads", f.threads);
  j.Set("warmup", f.warmup);
  j.Set("iters", f.iters);
  j.Set("seed", f.seed);
  if (!r.kernel.empty()) j.Set("flash_kernel", r.kernel);
  j.Set("check", !check.ran ? Json()
                            : Json::Object()
                                  .Set("tokens", check.tokens)
                                  .Set("o_max_rel_err", check.stats.o_rel)
                                  .Set("lse_max_abs_err", check.stats.lse_max_abs)
                                  .Set("nonfinite", check.stats.nonfinite)
                                  .Set("tolerance", check.tolerance)
                                  .Set("passed", check.passed));
  j.Set("times_s", Json::ArrayOf(r.times));
  j.Set("median_s", r.median);
  j.Set("tokens_per_s", r.tokens_per_s);
  j.Set("admitted_pairs", r.pairs);
  j.Set("flops", r.flops);
  j.Set("flops_formula",
        "4 * B * Hq * D * admitted_pairs_per_head (dilated: sum over branches and heads of "
        "segment pairs, L^2 or L(L+1)/2 causal)");
  j.Set("gflops", r.gflops);
  j.Set("sparsity", r.sparsity);
  j.Set("compile_ms", r.compile_ms);
  j.Set("sgemm_gflops", r.gemm_gflops);
  j.Set("sgemm_method", f.backend == "cpu"
                            ? "Eigen float GEMM 1024x1024x1024, one per thread, concurrently, "
                              "best of 4 per thread, summed"
                            : "cuBLAS bf16 GEMM 8192x8192x8192 (f32 accumulate), 10 runs");
  j.Set("attention_over_sgemm", r.ratio);
  return j;
}

absl::Status Main() {
  ATTN_ASSIGN_OR_RETURN(const Flags f, ReadFlags());
  ATTN_ASSIGN_OR_RETURN(const AttentionSpec spec, ParseSpecJson(f.spec));
  ATTN_ASSIGN_OR_RETURN(const DType dtype, ParseDType(f.dtype));
  const AttentionShape shape{f.batch, f.tokens, f.heads, f.kv_heads, f.head_dim};
  ATTN_RETURN_IF_ERROR(ValidateShape(shape));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, shape));
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<BenchBackend> backend, MakeBackend(f));

  const std::string device = backend->device();
  const std::string spec_json = SpecToJson(spec);
  std::printf("attnbench: %s\n  device %s\n  spec %s, [B=%lld, N=%lld, Hq=%lld, Hkv=%lld, D=%lld] %s\n",
              f.backend.c_str(), device.c_str(), spec_json.c_str(),
              static_cast<long long>(f.batch), static_cast<long long>(f.tokens),
              static_cast<long long>(f.heads), static_cast<long long>(f.kv_heads),
              static_cast<long long>(f.head_dim), f.dtype.c_str());

  ATTN_ASSIGN_OR_RETURN(const CheckResult check, Check(f, spec, dtype, *backend));
  if (check.ran) {
    std::printf("  check N=%lld vs float64 reference: o max rel err %.3g (tol %.0e), lse max abs "
                "err %.3g, non-finite %lld -> %s\n",
                static_cast<long long>(check.tokens), check.stats.o_rel, check.tolerance,
                check.stats.lse_max_abs, static_cast<long long>(check.stats.nonfinite),
                check.passed ? "PASS" : "FAIL");
  } else {
    std::printf("  check skipped (--check-tokens 0)\n");
  }
  ATTN_ASSIGN_OR_RETURN(const Figures figures, TimeFullSize(f, spec, dtype, *backend));
  PrintFigures(f, spec_json, check, figures);
  if (!f.json_out.empty()) {
    ATTN_RETURN_IF_ERROR(
        WriteJsonOut(f.json_out, ResultJson(f, device, spec_json, check, figures)));
  }
  if (check.ran && !check.passed) {
    return absl::InternalError("correctness check failed: error over tolerance");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  return attnserve::bench::BenchMain(argc, argv, attnserve::bench::kUsage, "attnbench",
                                     attnserve::bench::Main);
}
