// What the context subcommands share (context.cc: create, append, stats, list, delete;
// context_attend.cc: attend): the NAME operand, the client and deadline, errors of a call, and
// reading or making rows that fit a context.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_CONTEXT_UTIL_H_
#define ATTNSERVE_CLIENT_ATTNCTL_CONTEXT_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnserve/v1/attnserve.pb.h"
#include "client/attn_client.h"
#include "client/attnctl/flag_parser.h"
#include "core/tensor/tensor.h"

namespace attnserve::attnctl {

// The call of one context subcommand, with its whole-call deadline.
struct ContextCall {
  std::unique_ptr<client::AttnClient> client;
  client::CallOptions options;
};

// The client and the deadline (--timeout, else the default the command's help shows);
// INVALID_ARGUMENT (a usage error) for bad connection flags.
absl::StatusOr<ContextCall> StartContextCall(const FlagSet& flags);

// The context's NAME, the one operand; INVALID_ARGUMENT when it is missing.
absl::StatusOr<std::string> ContextName(const FlagSet& flags);

// A failed call: prints "attnctl: <what> of context 'NAME' failed: CODE: message" and returns
// 10 + the code.
int ContextCallFailed(absl::string_view what, const std::string& name, const absl::Status& status);

// "NQ[,SEED]" / "ROWS[,SEED]" of --`flag`: the count (>= 1) and the seed (--seed when absent).
absl::StatusOr<std::pair<int64_t, uint64_t>> CountAndSeed(absl::string_view flag,
                                                          const std::string& text);

// `t`, of rank 3 or 4 with a leading 1, as [1, dims...] (a copy when it has rank 3).
// INVALID_ARGUMENT naming --`flag` and what was `expected` otherwise.
absl::StatusOr<HostTensor> BatchOfOne(absl::string_view flag, HostTensor t,
                                      absl::string_view expected);

// --k and --v read in the context's dtype as [1, T, Hkv, D], checked against the context.
// `*exit_code` is local for a file that cannot be read, usage for one that does not fit.
absl::Status ReadContextRows(const v1::ContextStatus& c, DType dtype, HostTensor* k, HostTensor* v,
                             int* exit_code);

// context attend (context_attend.cc).
int ContextAttendMain(const FlagSet& flags);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_CONTEXT_UTIL_H_
