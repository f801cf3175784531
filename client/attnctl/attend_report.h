// What run and context attend print about one Attend call (the progress bar while it transfers,
// shapes, backend, the server's timing split, the --out/--lse files, the --check line), and the
// flags for those files.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_ATTEND_REPORT_H_
#define ATTNSERVE_CLIENT_ATTNCTL_ATTEND_REPORT_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "attnserve/v1/attnserve.pb.h"
#include "client/attn_client.h"
#include "client/attnctl/check.h"
#include "client/attnctl/flag_parser.h"

namespace attnserve::attnctl {

// Draws "upload [####......] 45% 123.0/456.0 MiB" on stderr at most 10 times a second. Only used
// when stderr is a terminal and --quiet is not given (ProgressWanted); draws nothing for
// transfers below 64 MiB.
class ProgressBar {
 public:
  void Update(const client::Progress& p);
  void Finish();

 private:
  std::mutex mu_;
  absl::Time last_ = absl::InfinitePast();
  bool drawn_ = false;
};

// --quiet not given and stderr a terminal.
bool ProgressWanted();

// --out, --lse, --quiet.
std::vector<FlagUse> OutputFlags();

// The lines run prints after a successful call: request id, `input` (what was sent), spec,
// output shapes, backend and devices, timings (client total and upload; server receive, queue,
// compute; copies and kernel), sparsity and GFLOP/s.
void PrintAttendResult(const std::string& input, const v1::AttentionSpec& spec,
                       const client::AttendResult& r);

// --out and --lse when given; an exit code (kExitOk when both went well or were not asked for).
int WriteAttendOutputs(const FlagSet& flags, const client::AttendResult& r);

// "check      O max rel err ..., tolerance ...: PASS"; returns kExitOk or kExitCheck.
int PrintCheck(const CheckOutcome& outcome);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_ATTEND_REPORT_H_
