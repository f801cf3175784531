#include "client/attnctl/check.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "core/reference/reference.h"
#include "wire/convert.h"

ABSL_FLAG(bool, check, false,
          "compare O and LSE with the float64 reference computed locally (small sizes only: "
          "refused above 5e10 reference FLOPs) and print O's max relative error and LSE's max "
          "absolute error; bench checks its first response");
ABSL_FLAG(double, tolerance, 0,
          "--check's bound on O's max relative error; 0: 1e-4 for f32 on the cpu backend, 2e-2 "
          "otherwise");

namespace attnserve::attnctl {
namespace {

constexpr double kMaxReferenceFlops = 5e10;

// Float64 multiply-adds of the reference for inputs like `q` against `kv_tokens` keys (dense
// upper bound).
double ReferenceCost(const HostTensor& q, int64_t kv_tokens) {
  return 2.0 * static_cast<double>(q.dim(0)) * q.dim(2) * q.dim(1) * kv_tokens * q.dim(3);
}

}  // namespace

std::vector<FlagUse> CheckFlags() { return {{"check", ""}, {"tolerance", "T"}}; }

bool CheckRequested() { return absl::GetFlag(FLAGS_check); }

absl::Status ValidateCheckFlags(const HostTensor& q, int64_t kv_tokens) {
  if (absl::StatusOr<double> t = NonNegative(FLAGS_tolerance); !t.ok()) return t.status();
  // Inputs that are not [B, N, H, D] are left to the server to refuse.
  if (!CheckRequested() || q.rank() != 4) return absl::OkStatus();
  if (kv_tokens <= 0) kv_tokens = q.dim(1);
  const double cost = ReferenceCost(q, kv_tokens);
  if (cost <= kMaxReferenceFlops) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--check: the float64 reference of %s against %d keys would take %.3g FLOPs (limit "
      "%.3g); use a smaller shape",
      q.DebugString(), kv_tokens, cost, kMaxReferenceFlops));
}

absl::StatusOr<CheckOutcome> CheckAgainstReference(const Problem& p,
                                                   const client::AttendResult& r) {
  const double tolerance = absl::GetFlag(FLAGS_tolerance);  // >= 0: ValidateCheckFlags
  absl::StatusOr<AttentionSpec> spec = SpecFromProto(p.spec);
  if (!spec.ok()) return spec.status();
  spec->q_offset = p.q_offset.value_or(0);
  absl::StatusOr<ReferenceResult> ref = ReferenceAttention(*spec, p.q, p.k, p.v);
  if (!ref.ok()) return ref.status();
  const ErrorStats stats = CompareToReference(*ref, r.o, r.lse ? &*r.lse : nullptr);
  CheckOutcome out;
  out.o_rel = stats.o_rel;
  out.lse_max_abs = stats.lse_max_abs;
  out.nonfinite = stats.nonfinite;
  if (tolerance > 0) {
    out.tolerance = tolerance;
  } else {
    // f32 runs in f32 on the CPU backend; the CUDA backend computes f32 inputs in bf16.
    out.tolerance = (p.q.dtype() == DType::kF32 && r.header.backend() == "cpu") ? 1e-4 : 2e-2;
  }
  out.pass = out.nonfinite == 0 && out.o_rel <= out.tolerance;
  return out;
}

}  // namespace attnserve::attnctl
