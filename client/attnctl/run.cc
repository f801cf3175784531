// attnctl run: one request, its timings and (with --check) its error against the reference.
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/attnctl/check.h"
#include "client/attnctl/common.h"
#include "client/attnctl/output.h"
#include "client/attnctl/problem.h"
#include "client/attnctl/regions.h"
#include "core/tensor/npy.h"

ABSL_FLAG(std::string, q, "", "Q as .npy, [B, N, Hq, D]");
ABSL_FLAG(std::string, k, "", "K as .npy, [B, N, Hkv, D]");
ABSL_FLAG(std::string, v, "", "V as .npy, [B, N, Hkv, D]");
ABSL_FLAG(std::string, out, "", "write O as .npy (bf16 O is written as raw '<u2' bits)");
ABSL_FLAG(std::string, lse, "", "write LSE as .npy ([B, Hq, N] f32)");
ABSL_FLAG(bool, quiet, false, "no progress bar");

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

// Tensors above this size show a progress bar on a terminal.
constexpr int64_t kProgressBarBytes = int64_t{64} << 20;

// Draws "upload [####......] 45% 123.0/456.0 MiB" on stderr at most 10 times a second. Only used
// when stderr is a terminal; draws nothing for transfers below kProgressBarBytes.
class ProgressBar {
 public:
  void Update(const client::Progress& p) {
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

void PrintResult(const FlagSet& flags, const Problem& problem, const client::AttendResult& r) {
  const v1::AttendResponseHeader& h = r.header;
  std::printf("request    %s\n", h.request_id().c_str());
  std::printf("input      %s%s\n", problem.description.c_str(),
              flags.Has("random") ? absl::StrCat(", random seed ", problem.seed).c_str() : "");
  std::printf("spec       %s\n", SpecJson(problem.spec).c_str());
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
      r.total_seconds, r.upload_seconds, h.receive_seconds(), h.queue_seconds(),
      h.compute_seconds(),
      r.attempts > 1 ? absl::StrCat("; ", r.attempts, " attempts").c_str() : "");
  // Where compute went, and how much of what the caller waited for was the kernel itself.
  std::printf("compute    copies %.4f s (%.3f GB), kernel %.4f s; kernel is %.1f%% of end to end\n",
              h.copy_seconds(), static_cast<double>(h.copy_bytes()) / 1e9, h.kernel_seconds(),
              r.total_seconds > 0 ? 100.0 * h.kernel_seconds() / r.total_seconds : 0.0);
  std::printf("sparsity   %.4f (fraction of block pairs skipped)\n", h.sparsity());
  std::printf("flops      %.4g, %.2f GFLOP/s over compute time\n", h.flops(),
              h.compute_seconds() > 0 ? h.flops() / h.compute_seconds() / 1e9 : 0.0);
}

// --out and --lse; an exit code (kExitOk when both went well or were not asked for).
int WriteOutputs(const FlagSet& flags, const client::AttendResult& r) {
  if (flags.Has("out")) {
    const std::string path = absl::GetFlag(FLAGS_out);
    if (absl::Status s = WriteNpy(path, r.o); !s.ok()) return Report("--out", s, kExitLocal);
    std::printf("wrote      O to %s\n", path.c_str());
  }
  if (flags.Has("lse") && r.lse) {
    const std::string path = absl::GetFlag(FLAGS_lse);
    if (absl::Status s = WriteNpy(path, *r.lse); !s.ok()) return Report("--lse", s, kExitLocal);
    std::printf("wrote      LSE to %s\n", path.c_str());
  }
  return kExitOk;
}

int RunMain(const FlagSet& flags) {
  InputFiles files;
  if (flags.Has("q")) files.q = absl::GetFlag(FLAGS_q);
  if (flags.Has("k")) files.k = absl::GetFlag(FLAGS_k);
  if (flags.Has("v")) files.v = absl::GetFlag(FLAGS_v);
  int load_exit = kExitUsage;
  absl::StatusOr<Problem> problem = LoadProblem(flags, &files, &load_exit);
  if (!problem.ok()) {
    return load_exit == kExitUsage ? UsageError("run", problem.status())
                                   : Report("run", problem.status(), load_exit);
  }
  absl::StatusOr<v1::Placement> placement = PlacementFromFlags();
  if (!placement.ok()) return UsageError("run", placement.status());
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags, absl::Minutes(5));
  if (!timeout.ok()) return UsageError("run", timeout.status());
  if (absl::Status s = ValidateCheckFlags(problem->q); !s.ok()) return UsageError("run", s);
  absl::StatusOr<std::unique_ptr<client::AttnClient>> client = ClientFromFlags();
  if (!client.ok()) return UsageError("run", client.status());
  absl::StatusOr<RegionMode> region_mode = RegionModeFromFlags();
  if (!region_mode.ok()) return UsageError("run", region_mode.status());

  client::AttendInput input;
  input.q = &problem->q;
  input.k = &problem->k;
  input.v = &problem->v;
  input.spec = problem->spec;
  input.return_lse = true;
  input.placement = *placement;
  std::unique_ptr<RegionSession> regions;  // --shm / --cuda-ipc; unregistered at the end
  if (*region_mode != RegionMode::kNone) {
    absl::StatusOr<std::unique_ptr<RegionSession>> session = RegionSession::Start(
        **client, *problem, *region_mode, static_cast<int>(absl::GetFlag(FLAGS_cuda_device)));
    if (!session.ok()) {
      return Report("region set-up", session.status(),
                    session.status().code() == absl::StatusCode::kFailedPrecondition
                        ? kExitLocal
                        : RpcExitCode(session.status()));
    }
    regions = *std::move(session);
    regions->Apply(&input);
  }
  client::CallOptions call;
  call.timeout = *timeout;
  ProgressBar bar;
  if (!absl::GetFlag(FLAGS_quiet) && isatty(STDERR_FILENO)) {
    call.progress = [&bar](const client::Progress& p) { bar.Update(p); };
  }
  absl::StatusOr<client::AttendResult> result = (*client)->Attend(input, call);
  bar.Finish();
  if (!result.ok()) {
    const bool local = result.status().code() == absl::StatusCode::kDataLoss;
    return Report(absl::StrCat("Attend to ", (*client)->options().target, " failed"),
                  result.status(), local ? kExitLocal : RpcExitCode(result.status()));
  }
  if (regions) {
    if (absl::Status s = regions->ReadOutputs(&*result); !s.ok()) {
      return Report("reading the outputs back", s, kExitLocal);
    }
  }
  PrintResult(flags, *problem, *result);
  if (regions) std::printf("regions    %s\n", regions->Description().c_str());
  if (int exit_code = WriteOutputs(flags, *result); exit_code != kExitOk) return exit_code;
  if (!CheckRequested()) return kExitOk;
  absl::StatusOr<CheckOutcome> outcome = CheckAgainstReference(*problem, *result);
  if (!outcome.ok()) return Report("--check", outcome.status(), kExitLocal);
  std::printf("check      O max rel err %.3e, LSE max abs err %.3e, non-finite %" PRId64
              ", tolerance %.1e: %s\n",
              outcome->o_rel, outcome->lse_max_abs, outcome->nonfinite, outcome->tolerance,
              outcome->pass ? "PASS" : "FAIL");
  return outcome->pass ? kExitOk : kExitCheck;
}

}  // namespace

Command RunCommand() {
  std::vector<FlagUse> flags = ConnectionFlags();
  flags.insert(flags.end(), {{"q", "FILE"}, {"k", "FILE"}, {"v", "FILE"}});
  for (const FlagUse& use : ProblemFlags()) flags.push_back(use);
  flags.insert(flags.end(), {{"out", "FILE"}, {"lse", "FILE"}});
  for (const FlagUse& use : CheckFlags()) flags.push_back(use);
  flags.insert(flags.end(), {PlacementFlag(), {"chunk_bytes", "N"}, {"quiet", ""}});
  for (const FlagUse& use : RegionFlags()) flags.push_back(use);
  return Command{
      "run",
      "run --server HOST:PORT (--q q.npy --k k.npy --v v.npy | --random B,N,Hq,Hkv,D)\n"
      "      [--spec JSON] [--causal] [--dtype f32|f16|bf16] [--seed S] [--out o.npy]\n"
      "      [--lse lse.npy] [--check] [--tolerance T] [--timeout 5m] [--chunk-bytes N]\n"
      "      [--max-attempts N] [--placement auto|single|data|ring] [--quiet]\n"
      "      [--shm | --cuda-ipc [--cuda-device N]]",
      "Sends one request and prints shape, backend, devices, timings, sparsity and GFLOP/s.\n"
      "Inputs come from .npy files (bf16 files hold the raw bits as '<u2': pass --dtype bf16)\n"
      "or, with --random, from a seeded uniform [-1, 1) generator (--dtype, default bf16).\n"
      "--check compares O and LSE with the float64 reference computed locally (small sizes\n"
      "only) and prints the max relative error of O and the max absolute error of LSE.\n"
      "Uploads and downloads over 64 MiB draw a progress bar when stderr is a terminal.\n"
      "--shm (same host as the server) passes Q/K/V and O/LSE through one POSIX shared memory\n"
      "region registered for the run, --cuda-ipc through CUDA IPC device memory (same GPU\n"
      "host; attnctl built with CUDA); the region is unregistered at the end.\n",
      std::move(flags),
      &RunMain,
  };
}

}  // namespace attnserve::attnctl
