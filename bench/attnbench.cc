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
// --device, f32 computed in bf16 and checked at the GPU tolerances).
//
// Example:
//   attnbench --backend cpu --spec '{"dense": {}}' --tokens 8192 --heads 8 --head-dim 64
//   attnbench --backend cuda --device 0 --spec '{"dense": {}, "causal": true}' --tokens 65536
//             --heads 16 --head-dim 128 --dtype bf16
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_backend.h"
#ifdef ATTNSERVE_BENCH_HAVE_CUDA
#include "bench/cuda_bench.h"
#endif
#include "bench/spec_json.h"
#include "core/reference/reference.h"
#include "core/spec/pattern_compiler.h"
#include "core/util/status_macros.h"

namespace attnserve::bench {
namespace {

struct Flags {
  std::string backend = "cpu";
  std::string spec = R"({"dense": {}})";
  int64_t batch = 1;
  int64_t tokens = 4096;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 64;
  std::string dtype = "f32";
  int64_t warmup = 1;
  int64_t iters = 5;
  int64_t threads = 0;        // 0: every hardware thread (cpu backend)
  int64_t device = 0;         // CUDA ordinal (cuda backend)
  int64_t check_tokens = -1;  // -1: min(tokens, 1024); 0: skip the check
  uint64_t seed = 1;
  std::string json_out;
};

constexpr char kUsage[] =
    "usage: attnbench [--backend cpu|cuda] [--device D] [--spec JSON] [--batch B] [--tokens N] "
    "[--heads Hq]\n"
    "                 [--kv-heads Hkv] [--head-dim D] [--dtype f32|f16|bf16] [--warmup W]\n"
    "                 [--iters I] [--threads T] [--check-tokens N] [--seed S] [--json-out FILE]\n"
    "--spec takes the proto3 JSON mapping of AttentionSpec, e.g.\n"
    "  '{\"window\": {\"size\": 256}, \"causal\": true}'\n"
    "  '{\"dilated\": {\"segmentLengths\": [2048, 4096], \"dilationRates\": [1, 2]}}'\n"
    "  '{\"blockSparse\": {\"blockSize\": 128, \"random\": {\"keep\": 0.1, \"seed\": 1}}}'\n";

// --name=value and --name value; dashes and underscores in names are interchangeable.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::function<bool(const std::string&)>> setters = {
      {"backend",
       [&](const std::string& v) {
         f.backend = v;
         return true;
       }},
      {"spec",
       [&](const std::string& v) {
         f.spec = v;
         return true;
       }},
      {"batch", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.batch); }},
      {"tokens", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.tokens); }},
      {"heads", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.heads); }},
      {"kv_heads", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.kv_heads); }},
      {"head_dim", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.head_dim); }},
      {"dtype",
       [&](const std::string& v) {
         f.dtype = v;
         return true;
       }},
      {"warmup", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.warmup); }},
      {"iters", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.iters); }},
      {"threads", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.threads); }},
      {"device", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.device); }},
      {"check_tokens", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.check_tokens); }},
      {"seed", [&](const std::string& v) { return absl::SimpleAtoi(v, &f.seed); }},
      {"json_out",
       [&](const std::string& v) {
         f.json_out = v;
         return true;
       }},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'\n", kUsage));
    }
    arg = arg.substr(2);
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", arg, ": missing value"));
    }
    const std::string name = absl::StrReplaceAll(arg, {{"-", "_"}});
    auto it = setters.find(name);
    if (it == setters.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", arg, "\n", kUsage));
    }
    if (!it->second(value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", arg, ": bad value '", value, "'"));
    }
  }
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
  if (f.backend == "cuda") return MakeCudaBenchBackend(static_cast<int>(f.device));
  constexpr char kHave[] = "cpu, cuda";
#else
  constexpr char kHave[] = "cpu";
#endif
  return absl::InvalidArgumentError(absl::StrCat(
      "--backend: '", f.backend, "' is not available in this build (have: ", kHave, ")"));
}

// Admitted (query, key) pairs of the whole problem, summed over query heads (see the file
// comment). Also returns the dense count for the token-level sparsity of dilated specs.
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

std::string GitCommit() {
  if (FILE* p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r")) {
    char buf[64] = {0};
    const bool got = std::fgets(buf, sizeof(buf), p) != nullptr;
    pclose(p);
    std::string s = got ? std::string(buf) : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (!s.empty()) return s;
  }
#ifdef ATTNSERVE_GIT_COMMIT
  if (std::string(ATTNSERVE_GIT_COMMIT).size() > 0) return ATTNSERVE_GIT_COMMIT;
#endif
  return "unknown";
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
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
  ATTN_ASSIGN_OR_RETURN(const CompiledPattern compiled, CompilePattern(spec, s.tokens, s.q_heads));
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

absl::Status Main(int argc, char** argv) {
  ATTN_ASSIGN_OR_RETURN(const Flags f, ParseFlags(argc, argv));
  ATTN_ASSIGN_OR_RETURN(const AttentionSpec spec, ParseSpecJson(f.spec));
  ATTN_ASSIGN_OR_RETURN(const DType dtype, ParseDType(f.dtype));
  const AttentionShape shape{f.batch, f.tokens, f.heads, f.kv_heads, f.head_dim};
  ATTN_RETURN_IF_ERROR(ValidateShape(shape));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, shape));
  ATTN_ASSIGN_OR_RETURN(std::unique_ptr<BenchBackend> backend, MakeBackend(f));

  std::string command;
  for (int i = 0; i < argc; ++i) {
    absl::StrAppend(&command, i ? " " : "",
                    std::string(argv[i]).find_first_of(" {\"") == std::string::npos
                        ? std::string(argv[i])
                        : absl::StrCat("'", argv[i], "'"));
  }
  const std::string device = backend->device();
  std::printf("attnbench: %s\n  device %s\n  spec %s, [B=%lld, N=%lld, Hq=%lld, Hkv=%lld, D=%lld] %s\n",
              f.backend.c_str(), device.c_str(), SpecToJson(spec).c_str(),
              static_cast<long long>(f.batch), static_cast<long long>(f.tokens),
              static_cast<long long>(f.heads), static_cast<long long>(f.kv_heads),
              static_cast<long long>(f.head_dim), f.dtype.c_str());

  // (a) correctness at the check size.
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

  // (b) timing at the full size.
  ATTN_ASSIGN_OR_RETURN(const Inputs in, MakeInputs(shape, dtype, f.seed));
  const auto c0 = std::chrono::steady_clock::now();
  ATTN_ASSIGN_OR_RETURN(const CompiledPattern compiled,
                        CompilePattern(spec, shape.tokens, shape.q_heads));
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
  ATTN_RETURN_IF_ERROR(backend->Prepare(spec, compiled, in.q, in.k, in.v));
  for (int64_t i = 0; i < f.warmup; ++i) ATTN_RETURN_IF_ERROR(backend->Run());
  std::vector<double> times;
  for (int64_t i = 0; i < f.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ATTN_RETURN_IF_ERROR(backend->Run());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                          : 0.5 * (sorted[sorted.size() / 2 - 1] +
                                                   sorted[sorted.size() / 2]);

  // (c) figures.
  const int64_t pairs = AdmittedPairsAllHeads(spec, compiled, shape.q_heads);
  const double flops = 4.0 * f.batch * f.head_dim * static_cast<double>(pairs);
  const double gflops = flops / median / 1e9;
  const double tokens_per_s = static_cast<double>(f.batch * f.tokens) / median;
  // Block-level for layouts (skipped block pairs); token-level for dilated (no block layout
  // spans the whole sequence).
  const double sparsity =
      compiled.dilated ? 1.0 - static_cast<double>(pairs) /
                                   (static_cast<double>(f.tokens) * f.tokens * f.heads)
                       : compiled.layout.sparsity();

  // (d) the GEMM yardstick, measured after the attention so both see the same clocks.
  ATTN_ASSIGN_OR_RETURN(const double gemm_gflops, backend->MeasureGemmGflops());
  const double ratio = gflops / gemm_gflops;

  std::printf("  compile %.3f ms, sparsity %.4f, admitted pairs %lld\n", compile_ms, sparsity,
              static_cast<long long>(pairs));
  std::printf("  median %.4f s over %lld iters (min %.4f, max %.4f)\n", median,
              static_cast<long long>(f.iters), sorted.front(), sorted.back());
  std::printf("  %.4g tokens/s, %.2f GFLOP/s attention, %.2f GFLOP/s sgemm, ratio %.3f\n",
              tokens_per_s, gflops, gemm_gflops, ratio);
  std::printf("\n| backend | spec | B | N | Hq | Hkv | D | dtype | median s | GFLOP/s | sgemm "
              "GFLOP/s | ratio | check |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
              "| %s | `%s` | %lld | %lld | %lld | %lld | %lld | %s | %.4f | %.2f | %.2f | %.3f | "
              "%s |\n",
              f.backend.c_str(), SpecToJson(spec).c_str(), static_cast<long long>(f.batch),
              static_cast<long long>(f.tokens), static_cast<long long>(f.heads),
              static_cast<long long>(f.kv_heads), static_cast<long long>(f.head_dim),
              f.dtype.c_str(), median, gflops, gemm_gflops, ratio,
              !check.ran ? "skipped" : check.passed ? "pass" : "FAIL");

  if (!f.json_out.empty()) {
    std::string j = "{\n";
    auto field = [&](const std::string& k, const std::string& v, bool last = false) {
      absl::StrAppend(&j, "  ", JsonString(k), ": ", v, last ? "\n" : ",\n");
    };
    field("device", JsonString(device));
    field("date", JsonString(absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(),
                                              absl::UTCTimeZone())));
    field("commit", JsonString(GitCommit()));
    field("command", JsonString(command));
    field("backend", JsonString(f.backend));
    field("spec", SpecToJson(spec));
    field("shape", absl::StrFormat(
                       "{\"batch\": %d, \"tokens\": %d, \"q_heads\": %d, \"kv_heads\": %d, "
                       "\"head_dim\": %d}",
                       f.batch, f.tokens, f.heads, f.kv_heads, f.head_dim));
    field("dtype", JsonString(f.dtype));
    field("threads", absl::StrCat(f.threads));
    field("warmup", absl::StrCat(f.warmup));
    field("iters", absl::StrCat(f.iters));
    field("seed", absl::StrCat(f.seed));
    field("check", check.ran ? absl::StrFormat(
                                   "{\"tokens\": %d, \"o_max_rel_err\": %.6g, \"lse_max_abs_err\": "
                                   "%.6g, \"nonfinite\": %d, \"tolerance\": %g, \"passed\": %s}",
                                   check.tokens, check.stats.o_rel, check.stats.lse_max_abs,
                                   check.stats.nonfinite, check.tolerance,
                                   check.passed ? "true" : "false")
                             : "null");
    field("times_s", absl::StrCat("[", absl::StrJoin(times, ", "), "]"));
    field("median_s", absl::StrCat(median));
    field("tokens_per_s", absl::StrCat(tokens_per_s));
    field("admitted_pairs", absl::StrCat(pairs));
    field("flops", absl::StrCat(flops));
    field("flops_formula",
          JsonString("4 * B * Hq * D * admitted_pairs_per_head (dilated: sum over branches and "
                     "heads of segment pairs, L^2 or L(L+1)/2 causal)"));
    field("gflops", absl::StrCat(gflops));
    field("sparsity", absl::StrCat(sparsity));
    field("compile_ms", absl::StrCat(compile_ms));
    field("sgemm_gflops", absl::StrCat(gemm_gflops));
    field("sgemm_method", JsonString("Eigen float GEMM 1024x1024x1024, one per thread, "
                                     "concurrently, best of 4 per thread, summed"));
    field("attention_over_sgemm", absl::StrCat(ratio), /*last=*/true);
    j += "}\n";
    std::ofstream out(f.json_out);
    out << j;
    if (!out) return absl::InternalError(absl::StrCat("--json-out: cannot write ", f.json_out));
    std::printf("  wrote %s\n", f.json_out.c_str());
  }
  if (check.ran && !check.passed) {
    return absl::InternalError("correctness check failed: error over tolerance");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace attnserve::bench

int main(int argc, char** argv) {
  const absl::Status s = attnserve::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "attnbench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
