// attnctl run: one request, its timings and (with --check) its error against the reference.
#include <cstdio>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/attnctl/attend_report.h"
#include "client/attnctl/check.h"
#include "client/attnctl/common.h"
#include "client/attnctl/problem.h"
#include "client/attnctl/regions.h"

ABSL_FLAG(std::string, q, "",
          "Q as .npy, [B, Nq, Hq, D] (context attend: [1, Nq, Hq, D] or [Nq, Hq, D])");
ABSL_FLAG(std::string, k, "",
          "K as .npy, [B, Nkv, Hkv, D] (context append and attend: [T, Hkv, D] or [1, T, Hkv, "
          "D])");
ABSL_FLAG(std::string, v, "", "V as .npy, shaped like K");

namespace attnserve::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

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
  absl::StatusOr<absl::Duration> timeout = TimeoutFromFlags(flags);
  if (!timeout.ok()) return UsageError("run", timeout.status());
  if (absl::Status s =
          ValidateCheckFlags(problem->q, problem->k.rank() == 4 ? problem->k.dim(1) : 0);
      !s.ok()) {
    return UsageError("run", s);
  }
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
  input.q_offset = problem->q_offset;
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
  if (ProgressWanted()) {
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
  PrintAttendResult(flags.Has("random")
                        ? absl::StrCat(problem->description, ", random seed ", problem->seed)
                        : problem->description,
                    problem->spec, *result);
  if (regions) std::printf("regions    %s\n", regions->Description().c_str());
  if (int exit_code = WriteAttendOutputs(flags, *result); exit_code != kExitOk) return exit_code;
  if (!CheckRequested()) return kExitOk;
  absl::StatusOr<CheckOutcome> outcome = CheckAgainstReference(*problem, *result);
  if (!outcome.ok()) return Report("--check", outcome.status(), kExitLocal);
  return PrintCheck(*outcome);
}

}  // namespace

Command RunCommand() {
  std::vector<FlagUse> flags = ConnectionFlags();
  flags.insert(flags.end(), {{"q", "FILE"}, {"k", "FILE"}, {"v", "FILE"}});
  for (const FlagUse& use : ProblemFlags()) flags.push_back(use);
  for (const FlagUse& use : ShapeFlags()) flags.push_back(use);
  for (const FlagUse& use : OutputFlags()) flags.push_back(use);
  for (const FlagUse& use : CheckFlags()) flags.push_back(use);
  flags.insert(flags.end(), {PlacementFlag(), {"chunk_bytes", "N"}, {"quiet", ""}});
  for (const FlagUse& use : RegionFlags()) flags.push_back(use);
  return Command{
      "run",
      "run --server HOST:PORT (--q q.npy --k k.npy --v v.npy | --random B,N,Hq,Hkv,D\n"
      "      [--q-len NQ] [--kv-len NKV]) [--q-offset P] [--spec JSON] [--causal]\n"
      "      [--dtype f32|f16|bf16] [--seed S] [--out o.npy]\n"
      "      [--lse lse.npy] [--check] [--tolerance T] [--timeout 5m] [--chunk-bytes N]\n"
      "      [--max-attempts N] [--placement auto|single|data|ring] [--quiet]\n"
      "      [--shm | --cuda-ipc [--cuda-device N]]",
      "Sends one request and prints shape, backend, devices, timings, sparsity and GFLOP/s.\n"
      "Inputs come from .npy files (bf16 files hold the raw bits as '<u2': pass --dtype bf16)\n"
      "or, with --random, from a seeded uniform [-1, 1) generator (--dtype, default bf16).\n"
      "--check compares O and LSE with the float64 reference computed locally (small sizes\n"
      "only) and prints the max relative error of O and the max absolute error of LSE.\n"
      "Inference shapes: --q-len and --kv-len give Q and K/V their own token counts (a decode\n"
      "step: --q-len 1 --kv-len 4096 --q-offset 4095 --causal); --q-offset places query row 0\n"
      "among the keys; .npy inputs may differ in N the same way. --check honours both.\n"
      "Uploads and downloads over 64 MiB draw a progress bar when stderr is a terminal.\n"
      "--shm (same host as the server) passes Q/K/V and O/LSE through one POSIX shared memory\n"
      "region registered for the run, --cuda-ipc through CUDA IPC device memory (same GPU\n"
      "host; attnctl built with CUDA); the region is unregistered at the end.\n",
      std::move(flags),
      &RunMain,
  };
}

}  // namespace attnserve::attnctl
