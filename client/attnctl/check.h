// --check: compares a response with the float64 reference computed locally. The only attnctl
// file that uses core/reference; run and bench call it.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_CHECK_H_
#define ATTNSERVE_CLIENT_ATTNCTL_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/attn_client.h"
#include "client/attnctl/flag_parser.h"
#include "client/attnctl/problem.h"

namespace attnserve::attnctl {

// --check, --tolerance.
std::vector<FlagUse> CheckFlags();

// Whether --check was given.
bool CheckRequested();

// INVALID_ARGUMENT (a usage error) for a negative --tolerance, or for --check when the reference
// of inputs like `q` against `kv_tokens` keys (<= 0: as many as q's tokens) would take too long
// to be worth computing (above 5e10 float64 multiply-adds, minutes of CPU time). Called before
// anything is sent.
absl::Status ValidateCheckFlags(const HostTensor& q, int64_t kv_tokens = 0);

struct CheckOutcome {
  double o_rel = 0;        // max |O - ref| / max |ref|
  double lse_max_abs = 0;  // max |LSE - ref|
  int64_t nonfinite = 0;   // non-finite values in O and LSE
  double tolerance = 0;    // the bound o_rel was held to
  bool pass = false;
};

// Computes the reference of `p` (its q_offset included) and compares `r` with it. The bound is
// --tolerance when it is given (> 0), otherwise 1e-4 for f32 inputs on the cpu backend and 2e-2
// for everything else.
absl::StatusOr<CheckOutcome> CheckAgainstReference(const Problem& p,
                                                   const client::AttendResult& r);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_CHECK_H_
