// attnctl: command-line client of attnserve (run, bench, health, describe). `attnctl --help`
// documents the subcommands, flags and exit codes.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/attn_client.h"
#include "core/reference/reference.h"
#include "core/tensor/npy.h"
#include "core/tensor/tensor.h"
#include "google/protobuf/util/json_util.h"
#include "server/spec_convert.h"

namespace attnserve::client {
namespace {

namespace v1 = ::attnserve::v1;

constexpr char kUsage[] = R"(attnctl: command-line client of attnserve.

Usage:
  attnctl run      --server HOST:PORT (--q q.npy --k k.npy --v v.npy | --random B,N,Hq,Hkv,D)
                   [--spec JSON] [--causal] [--dtype f32|f16|bf16] [--seed S] [--out o.npy]
                   [--lse lse.npy] [--check] [--tolerance T] [--timeout 60s] [--chunk-bytes N]
                   [--placement auto|single|data|ring]
  attnctl bench    --server HOST:PORT --random B,N,Hq,Hkv,D (--requests R | --duration 10s)
                   [--concurrency C] [--spec JSON] [--causal] [--dtype bf16] [--seed S]
                   [--check] [--json] [--timeout 60s] [--placement auto|single|data|ring]
  attnctl health   --server HOST:PORT [--service NAME] [--timeout 5s]
  attnctl describe --server HOST:PORT [--json] [--timeout 10s]
  attnctl --help

run       sends one request and prints shape, backend, devices, timings, sparsity and GFLOP/s.
          Inputs come from .npy files (bf16 files hold the raw bits as '<u2': pass --dtype bf16)
          or, with --random, from a seeded uniform [-1, 1) generator (--dtype, default bf16).
          --check compares O and LSE with the float64 reference computed locally (small sizes
          only) and prints the max relative error of O and the max absolute error of LSE.
bench     sends --requests requests (or as many as fit in --duration) from --concurrency
          threads and prints requests/s, tokens/s (B * N per request), p50/p90/p99 latency and
          errors by gRPC code; --json prints one JSON object instead. On a terminal a live
          progress line goes to stderr.
health    calls grpc.health.v1.Health/Check; exit 0 when SERVING.
describe  prints the server's devices, backends, limits and supported specs (--json: JSON).

Flags:
  --server HOST:PORT    server address (default localhost:50051)
  --spec JSON           AttentionSpec in the proto3 JSON mapping (default {"dense": {}}), e.g.
                        '{"dilated": {"segmentLengths": [256, 512], "dilationRates": [1, 2]}}'
                        '{"blockSparse": {"blockSize": 64, "localWindow": {"width": 2}}}'
  --causal              sets causal = true on top of --spec
  --dtype D             f32, f16 or bf16
  --random B,N,Hq,Hkv,D random inputs of this shape instead of .npy files
  --seed S              seed of --random (Q uses S, K S+1, V S+2; default 1)
  --out FILE, --lse FILE  write O / LSE as .npy (bf16 O is written as raw '<u2' bits)
  --check               compare with the float64 reference (refused above 5e10 reference FLOPs)
  --tolerance T         --check's bound on O's max relative error (default: 1e-4 for f32 on the
                        cpu backend, 2e-2 otherwise)
  --timeout DURATION    whole-call deadline, e.g. 500ms, 30s, 5m (default 5m; health 5s)
  --chunk-bytes N       upload chunk size (default 4194304; the server accepts up to its
                        --max-chunk-bytes, 64 MiB by default)
  --max-attempts N      attempts per call when the server is UNAVAILABLE (default 4)
  --placement P         run/bench: placement hint: auto (default: the server's planner decides),
                        single (one device), data (data parallel: batch x heads over devices),
                        ring (sequence over devices); the response says what ran
  --concurrency C       bench threads (default 1)
  --requests R          bench request count (default 100 unless --duration is given)
  --duration DURATION   bench for this long instead of a request count
  --json                bench/describe: JSON output
  --service NAME        health: the service to ask about (default "": the whole server)
  --quiet               run: no progress bar

Exit codes:
  0        success (health: the server is SERVING)
  1        local failure (reading or writing files, a malformed server response)
  2        usage error (unknown subcommand or flag, bad flag value)
  3        --check failed: an error above the tolerance, or non-finite outputs
  4        health: the server answered but is not SERVING
  10 + c   the call failed with gRPC code c, e.g. 13 INVALID_ARGUMENT (3), 14 DEADLINE_EXCEEDED
           (4), 18 RESOURCE_EXHAUSTED (8), 24 UNAVAILABLE (14); bench: any request failed
)";

constexpr int kExitOk = 0;
constexpr int kExitLocal = 1;
constexpr int kExitUsage = 2;
constexpr int kExitCheck = 3;
constexpr int kExitNotServing = 4;
constexpr int kExitRpcBase = 10;

// Tensors above this size show a progress bar on a terminal.
constexpr int64_t kProgressBarBytes = int64_t{64} << 20;
// --check refuses references above this many float64 multiply-adds (minutes of CPU time).
constexpr double kMaxReferenceFlops = 5e10;

// ---- Flags ------------------------------------------------------------------------------------

// The command line of one subcommand: --name value, --name=value, and bare boolean --name.
class Flags {
 public:
  // `bool_flags` take no value; `value_flags` take one. Anything else is a usage error.
  static absl::StatusOr<Flags> Parse(int argc, char** argv, int first,
                                     const std::set<std::string>& bool_flags,
                                     const std::set<std::string>& value_flags) {
    Flags flags;
    for (int i = first; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg.rfind("--", 0) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
      }
      arg = arg.substr(2);
      std::optional<std::string> value;
      if (size_t eq = arg.find('='); eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
      std::replace(arg.begin(), arg.end(), '_', '-');
      if (bool_flags.count(arg)) {
        if (value && *value != "true" && *value != "false") {
          return absl::InvalidArgumentError(absl::StrCat("--", arg, " takes no value"));
        }
        flags.values_[arg] = value.value_or("true");
      } else if (value_flags.count(arg)) {
        if (!value) {
          if (i + 1 >= argc) {
            return absl::InvalidArgumentError(absl::StrCat("--", arg, " needs a value"));
          }
          value = argv[++i];
        }
        flags.values_[arg] = *value;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", arg));
      }
    }
    return flags;
  }

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  bool Bool(const std::string& name) const {
    auto it = values_.find(name);
    return it != values_.end() && it->second == "true";
  }
  std::string String(const std::string& name, const std::string& fallback = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback, int64_t min) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    int64_t v = 0;
    if (!absl::SimpleAtoi(it->second, &v) || v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected an integer >= ", min, ", got '", it->second, "'"));
    }
    return v;
  }
  absl::StatusOr<double> Double(const std::string& name, double fallback) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    double v = 0;
    if (!absl::SimpleAtod(it->second, &v) || !(v >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected a number >= 0, got '", it->second, "'"));
    }
    return v;
  }
  absl::StatusOr<absl::Duration> Duration(const std::string& name, absl::Duration fallback) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    absl::Duration d;
    if (!absl::ParseDuration(it->second, &d) || d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected a positive duration such as 500ms, 30s or 5m, got '",
                       it->second, "'"));
    }
    return d;
  }

 private:
  std::map<std::string, std::string> values_;
};

// ---- Errors and exit codes ----------------------------------------------------------------------

// Prints "attnctl: <what>: <CODE>: <message>" (usage errors: without the code, with a pointer to
// --help) and returns `exit_code`.
int Report(const std::string& what, const absl::Status& status, int exit_code) {
  if (exit_code == kExitUsage) {
    std::fprintf(stderr, "attnctl: %s: %s (see attnctl --help)\n", what.c_str(),
                 std::string(status.message()).c_str());
  } else {
    std::fprintf(stderr, "attnctl: %s: %s\n", what.c_str(), status.ToString().c_str());
  }
  return exit_code;
}

int RpcExitCode(const absl::Status& status) {
  return kExitRpcBase + static_cast<int>(status.code());
}

// ---- Shared inputs ----------------------------------------------------------------------------

struct Problem {
  HostTensor q, k, v;
  v1::AttentionSpec spec;
  std::string description;  // "[B, N, Hq, D] bf16, kv_heads Hkv"
};

absl::StatusOr<v1::AttentionSpec> SpecFromFlags(const Flags& flags) {
  absl::StatusOr<v1::AttentionSpec> spec =
      ParseSpecJsonProto(flags.String("spec", R"({"dense": {}})"));
  if (!spec.ok()) return spec.status();
  if (flags.Bool("causal")) spec->set_causal(true);
  return spec;
}

std::string SpecJson(const v1::AttentionSpec& spec) {
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(spec, &json).ok())
    return spec.ShortDebugString();
  return json;
}

absl::StatusOr<std::vector<int64_t>> ParseDims(const std::string& text) {
  std::vector<int64_t> dims;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d) || d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--random: expected B,N,Hq,Hkv,D of positive integers, got '", text, "'"));
    }
    dims.push_back(d);
  }
  if (dims.size() != 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("--random: expected 5 dims B,N,Hq,Hkv,D, got '", text, "'"));
  }
  return dims;
}

// Builds the request inputs from --random or from --q/--k/--v. On failure `*exit_code` says
// whether the flags were wrong (kExitUsage) or a file could not be read (kExitLocal).
absl::StatusOr<Problem> LoadProblem(const Flags& flags, bool allow_files, uint64_t* seed_out,
                                    int* exit_code) {
  *exit_code = kExitUsage;
  Problem p;
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromFlags(flags);
  if (!spec.ok()) return spec.status();
  p.spec = *std::move(spec);
  std::optional<DType> dtype;
  if (flags.Has("dtype")) {
    absl::StatusOr<DType> d = ParseDType(flags.String("dtype"));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", d.status().message()));
    dtype = *d;
  }
  absl::StatusOr<int64_t> seed = flags.Int("seed", 1, 0);
  if (!seed.ok()) return seed.status();
  *seed_out = static_cast<uint64_t>(*seed);
  if (flags.Has("random")) {
    if (flags.Has("q") || flags.Has("k") || flags.Has("v")) {
      return absl::InvalidArgumentError("--random and --q/--k/--v are exclusive");
    }
    absl::StatusOr<std::vector<int64_t>> dims = ParseDims(flags.String("random"));
    if (!dims.ok()) return dims.status();
    const auto& d = *dims;
    const DType dt = dtype.value_or(DType::kBF16);
    absl::StatusOr<HostTensor> q = HostTensor::Create(dt, {d[0], d[1], d[2], d[4]});
    if (!q.ok()) return q.status();
    absl::StatusOr<HostTensor> k = HostTensor::Create(dt, {d[0], d[1], d[3], d[4]});
    if (!k.ok()) return k.status();
    absl::StatusOr<HostTensor> v = HostTensor::Create(dt, {d[0], d[1], d[3], d[4]});
    if (!v.ok()) return v.status();
    FillUniform(*q, *seed_out);
    FillUniform(*k, *seed_out + 1);
    FillUniform(*v, *seed_out + 2);
    p.q = *std::move(q);
    p.k = *std::move(k);
    p.v = *std::move(v);
  } else {
    if (!allow_files) return absl::InvalidArgumentError("--random B,N,Hq,Hkv,D is required");
    if (!flags.Has("q") || !flags.Has("k") || !flags.Has("v")) {
      return absl::InvalidArgumentError("give --q, --k and --v (.npy files) or --random");
    }
    HostTensor* outs[] = {&p.q, &p.k, &p.v};
    const char* names[] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<HostTensor> t = ReadNpy(flags.String(names[i]), dtype);
      if (!t.ok()) {
        *exit_code = kExitLocal;
        return absl::Status(t.status().code(),
                            absl::StrCat("--", names[i], ": ", t.status().message()));
      }
      *outs[i] = *std::move(t);
    }
  }
  p.description =
      absl::StrCat(p.q.DebugString(), ", kv_heads ", p.k.rank() == 4 ? p.k.dim(2) : int64_t{-1});
  return p;
}

absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const Flags& flags) {
  ClientOptions options;
  options.target = flags.String("server", "localhost:50051");
  absl::StatusOr<int64_t> chunk = flags.Int("chunk-bytes", options.chunk_bytes, 1);
  if (!chunk.ok()) return chunk.status();
  options.chunk_bytes = *chunk;
  absl::StatusOr<int64_t> attempts = flags.Int("max-attempts", options.max_attempts, 1);
  if (!attempts.ok()) return attempts.status();
  options.max_attempts = static_cast<int>(std::min<int64_t>(*attempts, 100));
  return options;
}

// Float64 multiply-adds of the reference for this problem (dense upper bound).
double ReferenceCost(const HostTensor& q) {
  return 2.0 * static_cast<double>(q.dim(0)) * q.dim(2) * q.dim(1) * q.dim(1) * q.dim(3);
}

struct CheckOutcome {
  ErrorStats stats;
  double tolerance = 0;
  bool pass = false;
};

absl::StatusOr<CheckOutcome> CheckAgainstReference(const Problem& p, const AttendResult& r,
                                                   double tolerance_flag) {
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(p.spec);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<ReferenceResult> ref = ReferenceAttention(*spec, p.q, p.k, p.v);
  if (!ref.ok()) return ref.status();
  CheckOutcome out;
  out.stats = CompareToReference(*ref, r.o, r.lse ? &*r.lse : nullptr);
  if (tolerance_flag > 0) {
    out.tolerance = tolerance_flag;
  } else {
    // f32 runs in f32 on the CPU backend; the CUDA backend computes f32 inputs in bf16.
    out.tolerance = (p.q.dtype() == DType::kF32 && r.header.backend() == "cpu") ? 1e-4 : 2e-2;
  }
  out.pass = out.stats.nonfinite == 0 && out.stats.o_rel <= out.tolerance;
  return out;
}

// ---- Progress bar -----------------------------------------------------------------------------

// Draws "upload 45% 123.0/456.0 MiB" on stderr at most 10 times a second. Only used when stderr
// is a terminal and a tensor transfer exceeds kProgressBarBytes.
class ProgressBar {
 public:
  void Update(const Progress& p) {
    const absl::Time now = absl::Now();
    std::lock_guard<std::mutex> lock(mu_);
    const bool upload_done = p.sent_bytes == p.send_total_bytes;
    const bool download_done =
        p.receive_total_bytes > 0 && p.received_bytes == p.receive_total_bytes;
    if (now - last_ < absl::Milliseconds(100) && !upload_done && !download_done) return;
    last_ = now;
    const bool downloading = p.receive_total_bytes > 0;
    const int64_t done = downloading ? p.received_bytes : p.sent_bytes;
    const int64_t total = downloading ? p.receive_total_bytes : p.send_total_bytes;
    if (total < kProgressBarBytes) return;
    const double frac = total > 0 ? static_cast<double>(done) / total : 1.0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r%-8s [%s%s] %3d%% %.1f/%.1f MiB%s", downloading ? "download" : "upload",
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 static_cast<int>(frac * 100), done / 1048576.0, total / 1048576.0,
                 p.attempt > 1 ? absl::StrCat(" (attempt ", p.attempt, ")").c_str() : "");
    drawn_ = true;
  }
  void Finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  std::mutex mu_;
  absl::Time last_ = absl::InfinitePast();
  bool drawn_ = false;
};

// "1-256" for 1, 2, ..., 256; "64, 128" when the values are not consecutive.
template <typename Values>
std::string CompactList(const Values& values) {
  std::vector<std::string> parts;
  int i = 0;
  const int n = static_cast<int>(values.size());
  while (i < n) {
    int j = i;
    while (j + 1 < n && values[j + 1] == values[j] + 1) ++j;
    parts.push_back(j - i >= 2 ? absl::StrCat(values[i], "-", values[j])
                               : absl::StrJoin(values.begin() + i, values.begin() + j + 1, ", "));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

// DTYPE_BF16 -> "bf16", PLACEMENT_SINGLE -> "single".
std::string ShortEnumName(const std::string& name) {
  std::string out = name.substr(name.find('_') + 1);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// --placement auto|single|data|ring (also data_parallel) -> the header's hint.
absl::StatusOr<v1::Placement> PlacementFromFlags(const Flags& flags) {
  if (!flags.Has("placement")) return v1::PLACEMENT_AUTO;
  const std::string p = flags.String("placement");
  if (p == "auto") return v1::PLACEMENT_AUTO;
  if (p == "single") return v1::PLACEMENT_SINGLE;
  if (p == "data" || p == "data_parallel") return v1::PLACEMENT_DATA_PARALLEL;
  if (p == "ring") return v1::PLACEMENT_RING;
  return absl::InvalidArgumentError(
      absl::StrCat("--placement: expected auto, single, data or ring, got \"", p, "\""));
}

// ---- run --------------------------------------------------------------------------------------

int RunCommand(int argc, char** argv) {
  absl::StatusOr<Flags> flags =
      Flags::Parse(argc, argv, 2, {"causal", "check", "quiet"},
                   {"server", "q", "k", "v", "spec", "dtype", "random", "seed", "out", "lse",
                    "timeout", "tolerance", "chunk-bytes", "max-attempts", "placement"});
  if (!flags.ok()) return Report("run", flags.status(), kExitUsage);
  uint64_t seed = 0;
  int load_exit = kExitUsage;
  absl::StatusOr<Problem> problem = LoadProblem(*flags, /*allow_files=*/true, &seed, &load_exit);
  if (!problem.ok()) return Report("run", problem.status(), load_exit);
  absl::StatusOr<v1::Placement> placement = PlacementFromFlags(*flags);
  if (!placement.ok()) return Report("run", placement.status(), kExitUsage);
  absl::StatusOr<absl::Duration> timeout = flags->Duration("timeout", absl::Minutes(5));
  if (!timeout.ok()) return Report("run", timeout.status(), kExitUsage);
  absl::StatusOr<double> tolerance = flags->Double("tolerance", 0);
  if (!tolerance.ok()) return Report("run", tolerance.status(), kExitUsage);
  const bool check = flags->Bool("check");
  if (check && problem->q.rank() == 4 && ReferenceCost(problem->q) > kMaxReferenceFlops) {
    return Report("run",
                  absl::InvalidArgumentError(absl::StrFormat(
                      "--check: the float64 reference of %s would take %.3g FLOPs (limit %.3g); "
                      "use a smaller shape",
                      problem->q.DebugString(), ReferenceCost(problem->q), kMaxReferenceFlops)),
                  kExitUsage);
  }
  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(*flags);
  if (!client_options.ok()) return Report("run", client_options.status(), kExitUsage);
  absl::StatusOr<std::unique_ptr<AttnClient>> client = AttnClient::Create(*client_options);
  if (!client.ok()) return Report("run", client.status(), kExitUsage);

  AttendInput input;
  input.q = &problem->q;
  input.k = &problem->k;
  input.v = &problem->v;
  input.spec = problem->spec;
  input.return_lse = true;
  input.placement = *placement;
  CallOptions call;
  call.timeout = *timeout;
  ProgressBar bar;
  if (!flags->Bool("quiet") && isatty(STDERR_FILENO)) {
    call.progress = [&bar](const Progress& p) { bar.Update(p); };
  }
  absl::StatusOr<AttendResult> result = (*client)->Attend(input, call);
  bar.Finish();
  if (!result.ok()) {
    const bool local = result.status().code() == absl::StatusCode::kDataLoss;
    return Report(absl::StrCat("Attend to ", client_options->target, " failed"), result.status(),
                  local ? kExitLocal : RpcExitCode(result.status()));
  }

  const v1::AttendResponseHeader& h = result->header;
  std::printf("request    %s\n", h.request_id().c_str());
  std::printf("input      %s%s\n", problem->description.c_str(),
              flags->Has("random") ? absl::StrCat(", random seed ", seed).c_str() : "");
  std::printf("spec       %s\n", SpecJson(problem->spec).c_str());
  std::printf("output     O [%s] %s%s\n", absl::StrJoin(h.o_shape(), ", ").c_str(),
              ShortEnumName(v1::DType_Name(h.dtype())).c_str(),
              h.lse_shape().empty()
                  ? ""
                  : absl::StrCat(", LSE [", absl::StrJoin(h.lse_shape(), ", "), "] f32").c_str());
  std::printf("backend    %s on %s, placement %s\n", h.backend().c_str(),
              absl::StrJoin(h.devices(), ", ").c_str(),
              ShortEnumName(v1::Placement_Name(h.placement())).c_str());
  std::printf(
      "timings    total %.4f s (upload %.4f s); server: receive %.4f s, queue %.4f s, "
      "compute %.4f s%s\n",
      result->total_seconds, result->upload_seconds, h.receive_seconds(), h.queue_seconds(),
      h.compute_seconds(),
      result->attempts > 1 ? absl::StrCat("; ", result->attempts, " attempts").c_str() : "");
  std::printf("sparsity   %.4f (fraction of block pairs skipped)\n", h.sparsity());
  std::printf("flops      %.4g, %.2f GFLOP/s over compute time\n", h.flops(),
              h.compute_seconds() > 0 ? h.flops() / h.compute_seconds() / 1e9 : 0.0);

  if (flags->Has("out")) {
    if (absl::Status s = WriteNpy(flags->String("out"), result->o); !s.ok()) {
      return Report("--out", s, kExitLocal);
    }
    std::printf("wrote      O to %s\n", flags->String("out").c_str());
  }
  if (flags->Has("lse") && result->lse) {
    if (absl::Status s = WriteNpy(flags->String("lse"), *result->lse); !s.ok()) {
      return Report("--lse", s, kExitLocal);
    }
    std::printf("wrote      LSE to %s\n", flags->String("lse").c_str());
  }
  if (check) {
    absl::StatusOr<CheckOutcome> outcome = CheckAgainstReference(*problem, *result, *tolerance);
    if (!outcome.ok()) return Report("--check", outcome.status(), kExitLocal);
    std::printf("check      O max rel err %.3e, LSE max abs err %.3e, non-finite %" PRId64
                ", tolerance %.1e: %s\n",
                outcome->stats.o_rel, outcome->stats.lse_max_abs, outcome->stats.nonfinite,
                outcome->tolerance, outcome->pass ? "PASS" : "FAIL");
    if (!outcome->pass) return kExitCheck;
  }
  return kExitOk;
}

// ---- bench ------------------------------------------------------------------------------------

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank: the smallest value with at least p of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

int BenchCommand(int argc, char** argv) {
  absl::StatusOr<Flags> flags =
      Flags::Parse(argc, argv, 2, {"causal", "check", "json"},
                   {"server", "spec", "dtype", "random", "seed", "timeout", "tolerance",
                    "chunk-bytes", "max-attempts", "concurrency", "requests", "duration",
                    "placement"});
  if (!flags.ok()) return Report("bench", flags.status(), kExitUsage);
  uint64_t seed = 0;
  int load_exit = kExitUsage;
  absl::StatusOr<Problem> problem = LoadProblem(*flags, /*allow_files=*/false, &seed, &load_exit);
  if (!problem.ok()) return Report("bench", problem.status(), load_exit);
  absl::StatusOr<v1::Placement> placement = PlacementFromFlags(*flags);
  if (!placement.ok()) return Report("bench", placement.status(), kExitUsage);
  absl::StatusOr<int64_t> concurrency = flags->Int("concurrency", 1, 1);
  if (!concurrency.ok()) return Report("bench", concurrency.status(), kExitUsage);
  if (*concurrency > 1024) {
    return Report("bench", absl::InvalidArgumentError("--concurrency: at most 1024"), kExitUsage);
  }
  if (flags->Has("requests") && flags->Has("duration")) {
    return Report("bench", absl::InvalidArgumentError("--requests and --duration are exclusive"),
                  kExitUsage);
  }
  absl::StatusOr<int64_t> requests = flags->Int("requests", 100, 1);
  if (!requests.ok()) return Report("bench", requests.status(), kExitUsage);
  std::optional<absl::Duration> duration;
  if (flags->Has("duration")) {
    absl::StatusOr<absl::Duration> d = flags->Duration("duration", absl::Seconds(10));
    if (!d.ok()) return Report("bench", d.status(), kExitUsage);
    duration = *d;
  }
  absl::StatusOr<absl::Duration> timeout = flags->Duration("timeout", absl::Minutes(5));
  if (!timeout.ok()) return Report("bench", timeout.status(), kExitUsage);
  absl::StatusOr<double> tolerance = flags->Double("tolerance", 0);
  if (!tolerance.ok()) return Report("bench", tolerance.status(), kExitUsage);
  const bool check = flags->Bool("check");
  if (check && ReferenceCost(problem->q) > kMaxReferenceFlops) {
    return Report("bench",
                  absl::InvalidArgumentError("--check: shape too large for the float64 reference"),
                  kExitUsage);
  }
  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(*flags);
  if (!client_options.ok()) return Report("bench", client_options.status(), kExitUsage);
  absl::StatusOr<std::unique_ptr<AttnClient>> client = AttnClient::Create(*client_options);
  if (!client.ok()) return Report("bench", client.status(), kExitUsage);

  AttendInput input;
  input.q = &problem->q;
  input.k = &problem->k;
  input.v = &problem->v;
  input.spec = problem->spec;
  input.return_lse = check;
  input.placement = *placement;
  CallOptions call;
  call.timeout = *timeout;

  // Each thread claims request numbers until the count (or the duration) runs out; every call is
  // bounded by --timeout, so the whole run is bounded by (count or duration) + timeout.
  const int64_t max_requests = duration ? std::numeric_limits<int64_t>::max() : *requests;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
  std::mutex mu;
  std::vector<double> latencies;
  std::map<std::string, int64_t> errors;
  std::string first_error;
  std::optional<AttendResult> first_result;
  std::string backend;
  std::string ran_on;  // placement and devices of the first successful request
  const absl::Time start = absl::Now();
  const absl::Time stop_at = duration ? start + *duration : absl::InfiniteFuture();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < *concurrency; ++t) {
    threads.emplace_back([&] {
      while (absl::Now() < stop_at && next.fetch_add(1) < max_requests) {
        const absl::Time begin = absl::Now();
        absl::StatusOr<AttendResult> r = (*client)->Attend(input, call);
        const double seconds = absl::ToDoubleSeconds(absl::Now() - begin);
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          latencies.push_back(seconds);
          if (backend.empty()) {
            backend = r->header.backend();
            ran_on = absl::StrCat(ShortEnumName(v1::Placement_Name(r->header.placement())), " on ",
                                  absl::StrJoin(r->header.devices(), ", "));
          }
          if (check && !first_result) first_result = *std::move(r);
          completed.fetch_add(1);
        } else {
          ++errors[absl::StatusCodeToString(r.status().code())];
          if (first_error.empty()) first_error = r.status().ToString();
          failed.fetch_add(1);
        }
      }
    });
  }
  const bool live = isatty(STDERR_FILENO) && !flags->Bool("json");
  // Waits for the workers, drawing the live line every half second on a terminal. Bounded: the
  // workers stop by themselves (see above); this loop ends when they have.
  while (completed.load() + failed.load() <
         (duration ? std::numeric_limits<int64_t>::max() : *requests)) {
    if (duration && absl::Now() >= stop_at + *timeout) break;
    absl::SleepFor(absl::Milliseconds(live ? 500 : 50));
    if (live) {
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
      std::fprintf(stderr, "\r[bench] %" PRId64 " ok, %" PRId64 " failed, %.1f req/s, %.1f s",
                   completed.load(), failed.load(), elapsed > 0 ? completed.load() / elapsed : 0.0,
                   elapsed);
    }
    if (duration && absl::Now() >= stop_at) break;
  }
  for (std::thread& t : threads) t.join();
  if (live) std::fprintf(stderr, "\n");
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);

  std::sort(latencies.begin(), latencies.end());
  const int64_t ok = static_cast<int64_t>(latencies.size());
  const int64_t tokens = problem->q.dim(0) * problem->q.dim(1);
  const double rps = elapsed > 0 ? ok / elapsed : 0;
  double mean = 0;
  for (double l : latencies) mean += l;
  if (ok > 0) mean /= ok;

  std::optional<CheckOutcome> outcome;
  if (check && first_result) {
    absl::StatusOr<CheckOutcome> o = CheckAgainstReference(*problem, *first_result, *tolerance);
    if (!o.ok()) return Report("--check", o.status(), kExitLocal);
    outcome = *o;
  }

  if (flags->Bool("json")) {
    std::vector<std::string> error_items;
    for (const auto& [code, count] : errors) {
      error_items.push_back(absl::StrCat(JsonString(code), ": ", count));
    }
    std::string json =
        absl::StrCat("{\"server\": ", JsonString(client_options->target),
                     ", \"backend\": ", JsonString(backend),
                     ", \"placement\": ", JsonString(ran_on), ", \"shape\": [",
                     absl::StrJoin(problem->q.dims(), ", "), "], \"kv_heads\": ", problem->k.dim(2),
                     ", \"dtype\": ", JsonString(std::string(DTypeName(problem->q.dtype()))),
                     ", \"spec\": ", SpecJson(problem->spec), ", \"seed\": ", seed,
                     ", \"concurrency\": ", *concurrency, ", \"requests\": ", ok + failed.load(),
                     ", \"ok\": ", ok, ", \"failed\": ", failed.load(), ", \"errors\": {",
                     absl::StrJoin(error_items, ", "), "}");
    absl::StrAppend(&json,
                    absl::StrFormat(", \"elapsed_s\": %.6f, \"requests_per_s\": %.6f, "
                                    "\"tokens_per_s\": %.3f, \"latency_s\": {\"p50\": %.6f, "
                                    "\"p90\": %.6f, \"p99\": %.6f, \"mean\": %.6f, \"min\": %.6f, "
                                    "\"max\": %.6f}",
                                    elapsed, rps, rps * tokens, Percentile(latencies, 0.5),
                                    Percentile(latencies, 0.9), Percentile(latencies, 0.99), mean,
                                    ok ? latencies.front() : 0.0, ok ? latencies.back() : 0.0));
    if (outcome) {
      absl::StrAppend(&json,
                      absl::StrFormat(", \"check\": {\"o_rel\": %.6g, \"lse_max_abs\": %.6g, "
                                      "\"nonfinite\": %d, \"tolerance\": %.3g, \"pass\": %s}",
                                      outcome->stats.o_rel, outcome->stats.lse_max_abs,
                                      outcome->stats.nonfinite, outcome->tolerance,
                                      outcome->pass ? "true" : "false"));
    }
    json += "}";
    std::printf("%s\n", json.c_str());
  } else {
    std::printf("bench      %s, spec %s, concurrency %" PRId64 ", %s\n",
                problem->description.c_str(), SpecJson(problem->spec).c_str(), *concurrency,
                backend.empty() ? "backend ?"
                                : absl::StrCat("backend ", backend, ", placement ", ran_on).c_str());
    std::printf("requests   %" PRId64 " ok, %" PRId64 " failed in %.3f s\n", ok, failed.load(),
                elapsed);
    std::printf("throughput %.2f requests/s, %.1f tokens/s\n", rps, rps * tokens);
    std::printf("latency    p50 %.4f s, p90 %.4f s, p99 %.4f s (min %.4f, mean %.4f, max %.4f)\n",
                Percentile(latencies, 0.5), Percentile(latencies, 0.9), Percentile(latencies, 0.99),
                ok ? latencies.front() : 0.0, mean, ok ? latencies.back() : 0.0);
    for (const auto& [code, count] : errors) {
      std::printf("errors     %s: %" PRId64 "\n", code.c_str(), count);
    }
    if (!first_error.empty()) std::printf("first error %s\n", first_error.c_str());
    if (outcome) {
      std::printf("check      O max rel err %.3e, LSE max abs err %.3e, tolerance %.1e: %s\n",
                  outcome->stats.o_rel, outcome->stats.lse_max_abs, outcome->tolerance,
                  outcome->pass ? "PASS" : "FAIL");
    }
  }
  if (outcome && !outcome->pass) return kExitCheck;
  if (failed.load() > 0) {
    // The code of the most frequent error.
    absl::StatusCode code = absl::StatusCode::kUnknown;
    int64_t most = 0;
    for (const auto& [name, count] : errors) {
      if (count > most) {
        most = count;
        for (int c = 1; c <= 16; ++c) {
          if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == name) {
            code = static_cast<absl::StatusCode>(c);
          }
        }
      }
    }
    return kExitRpcBase + static_cast<int>(code);
  }
  return kExitOk;
}

// ---- health, describe -----------------------------------------------------------------------

int HealthCommand(int argc, char** argv) {
  absl::StatusOr<Flags> flags =
      Flags::Parse(argc, argv, 2, {}, {"server", "service", "timeout", "max-attempts"});
  if (!flags.ok()) return Report("health", flags.status(), kExitUsage);
  absl::StatusOr<absl::Duration> timeout = flags->Duration("timeout", absl::Seconds(5));
  if (!timeout.ok()) return Report("health", timeout.status(), kExitUsage);
  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(*flags);
  if (!client_options.ok()) return Report("health", client_options.status(), kExitUsage);
  absl::StatusOr<std::unique_ptr<AttnClient>> client = AttnClient::Create(*client_options);
  if (!client.ok()) return Report("health", client.status(), kExitUsage);
  CallOptions call;
  call.timeout = *timeout;
  const std::string service = flags->String("service");
  absl::StatusOr<ServingStatus> status = (*client)->HealthCheck(call, service);
  if (!status.ok()) {
    return Report(absl::StrCat("health check of ", client_options->target, " failed"),
                  status.status(), RpcExitCode(status.status()));
  }
  std::printf("%s: %s\n", service.empty() ? client_options->target.c_str() : service.c_str(),
              std::string(ServingStatusName(*status)).c_str());
  return *status == ServingStatus::kServing ? kExitOk : kExitNotServing;
}

int DescribeCommand(int argc, char** argv) {
  absl::StatusOr<Flags> flags =
      Flags::Parse(argc, argv, 2, {"json"}, {"server", "timeout", "max-attempts"});
  if (!flags.ok()) return Report("describe", flags.status(), kExitUsage);
  absl::StatusOr<absl::Duration> timeout = flags->Duration("timeout", absl::Seconds(10));
  if (!timeout.ok()) return Report("describe", timeout.status(), kExitUsage);
  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(*flags);
  if (!client_options.ok()) return Report("describe", client_options.status(), kExitUsage);
  absl::StatusOr<std::unique_ptr<AttnClient>> client = AttnClient::Create(*client_options);
  if (!client.ok()) return Report("describe", client.status(), kExitUsage);
  CallOptions call;
  call.timeout = *timeout;
  absl::StatusOr<v1::DescribeResponse> d = (*client)->Describe(call);
  if (!d.ok()) {
    return Report(absl::StrCat("Describe of ", client_options->target, " failed"), d.status(),
                  RpcExitCode(d.status()));
  }
  if (flags->Bool("json")) {
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.always_print_primitive_fields = true;
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(*d, &json, options).ok()) {
      return Report("describe", absl::InternalError("could not print the response as JSON"),
                    kExitLocal);
    }
    std::printf("%s", json.c_str());
    if (json.empty() || json.back() != '\n') std::printf("\n");
    return kExitOk;
  }
  std::printf("server      %s\n", client_options->target.c_str());
  std::printf("version     %s\n", d->version().c_str());
  std::printf("backend     %s\n", d->backend().c_str());
  std::printf("devices     %d\n", d->devices_size());
  for (const v1::DeviceInfo& dev : d->devices()) {
    std::printf("  %-8s %s%s, memory %.2f GiB total, %.2f GiB free\n", dev.name().c_str(),
                dev.model().c_str(), dev.uuid().empty() ? "" : (" (" + dev.uuid() + ")").c_str(),
                dev.memory_total_bytes() / 1073741824.0, dev.memory_free_bytes() / 1073741824.0);
  }
  const v1::Limits& l = d->limits();
  std::printf("limits      max request %" PRId64 " bytes, max queue %" PRId64 ", chunk %" PRId64
              " bytes (max %" PRId64 ")\n",
              l.max_request_bytes(), l.max_queue(), l.chunk_bytes(), l.max_chunk_bytes());
  std::printf("            block sizes [%s], head dims [%s]\n",
              CompactList(l.block_sizes()).c_str(), CompactList(l.head_dims()).c_str());
  std::printf("patterns    %s\n", absl::StrJoin(d->patterns(), ", ").c_str());
  std::printf("generators  %s\n", absl::StrJoin(d->generators(), ", ").c_str());
  std::printf("dtypes      %s\n", absl::StrJoin(d->dtypes(), ", ").c_str());
  std::printf("placements  %s\n", absl::StrJoin(d->placements(), ", ").c_str());
  if (!d->notes().empty()) std::printf("notes       %s\n", d->notes().c_str());
  return kExitOk;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
  }
  if (command == "run") return RunCommand(argc, argv);
  if (command == "bench") return BenchCommand(argc, argv);
  if (command == "health") return HealthCommand(argc, argv);
  if (command == "describe") return DescribeCommand(argc, argv);
  std::fprintf(stderr, "attnctl: unknown subcommand '%s' (run, bench, health, describe)\n",
               command.c_str());
  return kExitUsage;
}

}  // namespace
}  // namespace attnserve::client

int main(int argc, char** argv) { return attnserve::client::Main(argc, argv); }
