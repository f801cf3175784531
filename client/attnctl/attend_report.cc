#include "client/attnctl/attend_report.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/attnctl/common.h"
#include "client/attnctl/output.h"
#include "core/tensor/npy.h"

ABSL_FLAG(std::string, out, "", "write O as .npy (bf16 O is written as raw '<u2' bits)");
ABSL_FLAG(std::string, lse, "", "write LSE as .npy ([B, Hq, N] f32)");
ABSL_FLAG(bool, quiet, false, "no progress bar");

namespace attnserve::attnctl {
namespace {

// Tensors above this size show a progress bar on a terminal.
constexpr int64_t kProgressBarBytes = int64_t{64} << 20;

}  // namespace

void ProgressBar::Update(const client::Progress& p) {
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  const bool upload_done = p.sent_bytes == p.send_total_bytes;
  const bool download_done = p.receive_total_bytes > 0 && p.received_bytes == p.receive_total_bytes;
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

void ProgressBar::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

bool ProgressWanted() { return !absl::GetFlag(FLAGS_quiet) && isatty(STDERR_FILENO); }

std::vector<FlagUse> OutputFlags() { return {{"out", "FILE"}, {"lse", "FILE"}}; }

void PrintAttendResult(const std::string& input, const v1::AttentionSpec& spec,
                       const client::AttendResult& r) {
  const v1::AttendResponseHeader& h = r.header;
  std::printf("request    %s\n", h.request_id().c_str());
  std::printf("input      %s\n", input.c_str());
  std::printf("spec       %s\n", SpecJson(spec).c_str());
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

int WriteAttendOutputs(const FlagSet& flags, const client::AttendResult& r) {
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

int PrintCheck(const CheckOutcome& outcome) {
  std::printf("check      O max rel err %.3e, LSE max abs err %.3e, non-finite %" PRId64
              ", tolerance %.1e: %s\n",
              outcome.o_rel, outcome.lse_max_abs, outcome.nonfinite, outcome.tolerance,
              outcome.pass ? "PASS" : "FAIL");
  return outcome.pass ? kExitOk : kExitCheck;
}

}  // namespace attnserve::attnctl
