#include "client/attnctl/problem.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/attnctl/common.h"
#include "core/tensor/npy.h"
#include "wire/convert.h"

ABSL_FLAG(std::string, spec, R"({"dense": {}})",
          "AttentionSpec in the proto3 JSON mapping, e.g. "
          R"('{"dilated": {"segmentLengths": [256, 512], "dilationRates": [1, 2]}}' or )"
          R"('{"blockSparse": {"blockSize": 64, "localWindow": {"width": 2}}}')");
ABSL_FLAG(bool, causal, false, "sets causal = true on top of --spec");
ABSL_FLAG(std::string, dtype, "",
          "f32, f16 or bf16 (run, bench: default the .npy files' dtype, bf16 with --random; "
          "context create: the context's, default bf16). bf16 .npy files hold the raw bits as "
          "'<u2': pass --dtype bf16 to read them");
ABSL_FLAG(std::string, random, "",
          "random inputs of this shape, uniform in [-1, 1), instead of .npy files (context "
          "append: ROWS[,SEED] random K and V rows of the context's shape, K from SEED and V "
          "from SEED+1, SEED defaulting to --seed)");
ABSL_FLAG(int64_t, seed, 1, "seed of --random: Q uses S, K S+1, V S+2");
ABSL_FLAG(int64_t, q_len, 0, "with --random: Q's token count Nq instead of N");
ABSL_FLAG(int64_t, kv_len, 0, "with --random: K's and V's token count Nkv instead of N");
ABSL_FLAG(int64_t, q_offset, 0,
          "position of query row 0 among the keys (query row i sits at q_offset + i; causal "
          "masks compare positions); run and bench: 0, context attend: the context's last rows");
ABSL_FLAG(std::string, placement, "auto",
          "placement hint: auto (the server's planner decides), single (one device), data (data "
          "parallel: batch x heads over devices), ring (sequence over devices); the response "
          "says what ran");

namespace attnserve::attnctl {
namespace {

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

// --q-len / --kv-len when given (>= 1), else `n`.
absl::StatusOr<int64_t> TokensOr(const FlagSet& flags, const char* name,
                                 const absl::Flag<int64_t>& flag, int64_t n) {
  if (!flags.Has(name)) return n;
  return IntAtLeast(flag, 1);
}

absl::Status FillRandom(const FlagSet& flags, DType dtype, Problem& p) {
  absl::StatusOr<std::vector<int64_t>> dims = ParseDims(absl::GetFlag(FLAGS_random));
  if (!dims.ok()) return dims.status();
  const std::vector<int64_t>& d = *dims;
  absl::StatusOr<int64_t> nq = TokensOr(flags, "q_len", FLAGS_q_len, d[1]);
  if (!nq.ok()) return nq.status();
  absl::StatusOr<int64_t> nkv = TokensOr(flags, "kv_len", FLAGS_kv_len, d[1]);
  if (!nkv.ok()) return nkv.status();
  absl::StatusOr<HostTensor> q = HostTensor::Create(dtype, {d[0], *nq, d[2], d[4]});
  if (!q.ok()) return q.status();
  absl::StatusOr<HostTensor> k = HostTensor::Create(dtype, {d[0], *nkv, d[3], d[4]});
  if (!k.ok()) return k.status();
  absl::StatusOr<HostTensor> v = HostTensor::Create(dtype, {d[0], *nkv, d[3], d[4]});
  if (!v.ok()) return v.status();
  FillUniform(*q, p.seed);
  FillUniform(*k, p.seed + 1);
  FillUniform(*v, p.seed + 2);
  p.q = *std::move(q);
  p.k = *std::move(k);
  p.v = *std::move(v);
  return absl::OkStatus();
}

// Reads the three files; `*exit_code` is local for a file that cannot be read.
absl::Status ReadInputs(const InputFiles& files, std::optional<DType> dtype, Problem& p,
                        int* exit_code) {
  if (!files.q || !files.k || !files.v) {
    return absl::InvalidArgumentError("give --q, --k and --v (.npy files) or --random");
  }
  const std::pair<const char*, const std::string*> inputs[] = {
      {"q", &*files.q}, {"k", &*files.k}, {"v", &*files.v}};
  HostTensor* outs[] = {&p.q, &p.k, &p.v};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<HostTensor> t = ReadNpy(*inputs[i].second, dtype);
    if (!t.ok()) {
      *exit_code = kExitLocal;
      return absl::Status(t.status().code(),
                          absl::StrCat("--", inputs[i].first, ": ", t.status().message()));
    }
    *outs[i] = *std::move(t);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<FlagUse> ProblemFlags() {
  return {{"random", "B,N,Hq,Hkv,D"},
          {"spec", "JSON"},
          {"causal", ""},
          {"dtype", "D"},
          {"seed", "S"}};
}

std::vector<FlagUse> ShapeFlags() {
  return {{"q_len", "NQ", "-"}, {"kv_len", "NKV", "-"}, {"q_offset", "P"}};
}

FlagUse PlacementFlag() { return {"placement", "auto|single|data|ring"}; }

absl::StatusOr<Problem> LoadProblem(const FlagSet& flags, const InputFiles* files,
                                    int* exit_code) {
  *exit_code = kExitUsage;
  Problem p;
  absl::StatusOr<v1::AttentionSpec> spec = ParseSpecJsonProto(absl::GetFlag(FLAGS_spec));
  if (!spec.ok()) return spec.status();
  p.spec = *std::move(spec);
  if (absl::GetFlag(FLAGS_causal)) p.spec.set_causal(true);
  std::optional<DType> dtype;
  if (flags.Has("dtype")) {
    absl::StatusOr<DType> d = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", d.status().message()));
    dtype = *d;
  }
  absl::StatusOr<int64_t> seed = IntAtLeast(FLAGS_seed, 0);
  if (!seed.ok()) return seed.status();
  p.seed = static_cast<uint64_t>(*seed);
  if (flags.Has("q_offset")) {
    absl::StatusOr<int64_t> offset = IntAtLeast(FLAGS_q_offset, 0);
    if (!offset.ok()) return offset.status();
    p.q_offset = *offset;
  }
  if (flags.Has("random")) {
    if (files != nullptr && (files->q || files->k || files->v)) {
      return absl::InvalidArgumentError("--random and --q/--k/--v are exclusive");
    }
    if (absl::Status s = FillRandom(flags, dtype.value_or(DType::kBF16), p); !s.ok()) return s;
  } else {
    if (files == nullptr) return absl::InvalidArgumentError("--random B,N,Hq,Hkv,D is required");
    if (flags.Has("q_len") || flags.Has("kv_len")) {
      return absl::InvalidArgumentError(
          "--q-len and --kv-len shape --random inputs; .npy inputs bring their own token counts");
    }
    if (absl::Status s = ReadInputs(*files, dtype, p, exit_code); !s.ok()) return s;
  }
  p.description =
      absl::StrCat(p.q.DebugString(), ", kv_heads ", p.k.rank() == 4 ? p.k.dim(2) : int64_t{-1});
  if (p.q.rank() == 4 && p.k.rank() == 4 && p.k.dim(1) != p.q.dim(1)) {
    absl::StrAppend(&p.description, ", kv_tokens ", p.k.dim(1));
  }
  if (p.q_offset) absl::StrAppend(&p.description, ", q_offset ", *p.q_offset);
  return p;
}

absl::StatusOr<v1::Placement> PlacementFromFlags() {
  const std::string p = absl::GetFlag(FLAGS_placement);
  if (p == "auto") return v1::PLACEMENT_AUTO;
  if (p == "single") return v1::PLACEMENT_SINGLE;
  if (p == "data" || p == "data_parallel") return v1::PLACEMENT_DATA_PARALLEL;
  if (p == "ring") return v1::PLACEMENT_RING;
  return absl::InvalidArgumentError(
      absl::StrCat("--placement: expected auto, single, data or ring, got \"", p, "\""));
}

}  // namespace attnserve::attnctl
