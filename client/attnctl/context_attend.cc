// attnctl context attend: Q alone against a context's rows, printed as run prints a result, with
// --check against the float64 reference when the rows are given as files.
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/attnctl/attend_report.h"
#include "client/attnctl/check.h"
#include "client/attnctl/common.h"
#include "client/attnctl/context_util.h"
#include "client/attnctl/problem.h"
#include "core/tensor/npy.h"
#include "wire/convert.h"

// Shared with run and bench (run.cc, problem.cc and check.cc define them).
ABSL_DECLARE_FLAG(std::string, q);
ABSL_DECLARE_FLAG(std::string, spec);
ABSL_DECLARE_FLAG(bool, causal);
ABSL_DECLARE_FLAG(int64_t, q_offset);
ABSL_DECLARE_FLAG(double, tolerance);

ABSL_FLAG(std::string, random_q, "",
          "context attend: NQ[,SEED] random query rows, uniform in [-1, 1), in the context's "
          "dtype (SEED defaults to --seed)");
ABSL_FLAG(int64_t, q_heads, 0,
          "context attend: query heads Hq, a multiple of the context's kv_heads");

namespace attnserve::attnctl {

namespace v1 = ::attnserve::v1;

int ContextAttendMain(const FlagSet& flags) {
  constexpr absl::string_view kCmd = "context attend";
  absl::StatusOr<std::string> name = ContextName(flags);
  if (!name.ok()) return UsageError(kCmd, name.status());
  if (flags.Has("q") == flags.Has("random_q")) {
    return UsageError(
        kCmd, absl::InvalidArgumentError("give either --q (a .npy file) or --random-q NQ[,SEED]"));
  }
  const bool kv_files = flags.Has("k") || flags.Has("v");
  if (CheckRequested() != kv_files || (kv_files && !(flags.Has("k") && flags.Has("v")))) {
    return UsageError(
        kCmd, absl::InvalidArgumentError(
                  "--check needs the context's rows as --k and --v (.npy files holding every "
                  "row appended, in order), and --k/--v are only for --check"));
  }
  absl::StatusOr<v1::AttentionSpec> spec = ParseSpecJsonProto(absl::GetFlag(FLAGS_spec));
  if (!spec.ok()) return UsageError(kCmd, spec.status());
  if (absl::GetFlag(FLAGS_causal)) spec->set_causal(true);
  std::optional<int64_t> q_offset;
  if (flags.Has("q_offset")) {
    absl::StatusOr<int64_t> p = IntAtLeast(FLAGS_q_offset, 0);
    if (!p.ok()) return UsageError(kCmd, p.status());
    q_offset = *p;
  }
  std::optional<int64_t> q_heads;
  if (flags.Has("q_heads")) {
    absl::StatusOr<int64_t> h = IntAtLeast(FLAGS_q_heads, 1);
    if (!h.ok()) return UsageError(kCmd, h.status());
    q_heads = *h;
  }
  std::optional<std::pair<int64_t, uint64_t>> random;
  if (flags.Has("random_q")) {
    auto r = CountAndSeed("random-q", absl::GetFlag(FLAGS_random_q));
    if (!r.ok()) return UsageError(kCmd, r.status());
    random = *r;
  }
  if (absl::StatusOr<double> t = NonNegative(FLAGS_tolerance); !t.ok()) {
    return UsageError(kCmd, t.status());
  }
  absl::StatusOr<ContextCall> call = StartContextCall(flags);
  if (!call.ok()) return UsageError(kCmd, call.status());

  // The context's dtype, heads and rows: Q is made or read to fit them.
  absl::StatusOr<v1::ContextStatus> c = call->client->GetContext(*name, call->options);
  if (!c.ok()) return ContextCallFailed("GetContext", *name, c.status());
  absl::StatusOr<DType> dtype = DTypeFromProto(c->dtype());
  if (!dtype.ok()) return Report(kCmd, dtype.status(), kExitLocal);

  Problem problem;  // Q, and for --check the context's rows
  problem.spec = *spec;
  std::string q_source;
  if (random) {
    absl::StatusOr<HostTensor> q = HostTensor::Create(
        *dtype, {1, random->first, q_heads.value_or(c->kv_heads()), c->head_dim()});
    if (!q.ok()) return Report(kCmd, q.status(), kExitLocal);
    FillUniform(*q, random->second);
    problem.q = *std::move(q);
    q_source = absl::StrCat(", random seed ", random->second);
  } else {
    absl::StatusOr<HostTensor> q = ReadNpy(absl::GetFlag(FLAGS_q), *dtype);
    if (!q.ok()) {
      return Report(kCmd,
                    absl::Status(q.status().code(), absl::StrCat("--q: ", q.status().message())),
                    kExitLocal);
    }
    absl::StatusOr<HostTensor> q4 = BatchOfOne("q", *std::move(q), "[Nq, Hq, D] or [1, Nq, Hq, D]");
    if (!q4.ok()) return UsageError(kCmd, q4.status());
    if (q_heads && q4->dim(2) != *q_heads) {
      return UsageError(kCmd, absl::InvalidArgumentError(absl::StrCat(
                                  "--q-heads ", *q_heads, " differs from --q's ", q4->dim(2))));
    }
    problem.q = *std::move(q4);
    q_source = absl::StrCat(" from ", absl::GetFlag(FLAGS_q));
  }
  const int64_t nq = problem.q.dim(1);
  int64_t kv_rows = c->tokens();
  if (CheckRequested()) {
    int exit_code = kExitUsage;
    if (absl::Status s = ReadContextRows(*c, *dtype, &problem.k, &problem.v, &exit_code); !s.ok()) {
      return exit_code == kExitUsage ? UsageError(kCmd, s) : Report(kCmd, s, exit_code);
    }
    if (problem.k.dim(1) != c->tokens()) {
      return UsageError(kCmd, absl::InvalidArgumentError(absl::StrCat(
                                  "--k and --v hold ", problem.k.dim(1), " rows but context '",
                                  *name, "' holds ", c->tokens())));
    }
    kv_rows = problem.k.dim(1);
    if (absl::Status s = ValidateCheckFlags(problem.q, kv_rows); !s.ok()) {
      return UsageError(kCmd, s);
    }
    // The server's default offset puts the queries on the context's last rows.
    problem.q_offset = q_offset.value_or(kv_rows - nq);
  }

  client::AttendInput input;
  input.q = &problem.q;
  input.shape = AttentionShape{1, nq, problem.q.dim(2), c->kv_heads(), c->head_dim()};
  input.context = *name;
  input.spec = problem.spec;
  input.return_lse = true;
  input.q_offset = q_offset;
  ProgressBar bar;
  client::CallOptions options = call->options;
  if (ProgressWanted()) options.progress = [&bar](const client::Progress& p) { bar.Update(p); };
  absl::StatusOr<client::AttendResult> result = call->client->Attend(input, options);
  bar.Finish();
  if (!result.ok()) {
    const bool local = result.status().code() == absl::StatusCode::kDataLoss;
    return Report(absl::StrCat("Attend to context '", *name, "' failed"), result.status(),
                  local ? kExitLocal : RpcExitCode(result.status()));
  }
  PrintAttendResult(
      absl::StrCat("Q ", problem.q.DebugString(), q_source, "; context '", *name, "' (", kv_rows,
                   " rows, kv_heads ", c->kv_heads(), "), q_offset ",
                   q_offset ? absl::StrCat(*q_offset)
                            : absl::StrCat("default (", kv_rows - nq, ": the last rows)")),
      problem.spec, *result);
  if (int exit_code = WriteAttendOutputs(flags, *result); exit_code != kExitOk) return exit_code;
  if (!CheckRequested()) return kExitOk;
  absl::StatusOr<CheckOutcome> outcome = CheckAgainstReference(problem, *result);
  if (!outcome.ok()) return Report("--check", outcome.status(), kExitLocal);
  return PrintCheck(*outcome);
}

}  // namespace attnserve::attnctl
