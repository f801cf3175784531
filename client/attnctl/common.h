// What every attnctl subcommand shares: exit codes, error reporting, the connection flags and the
// subcommand table entry (Command). One file per subcommand (run.cc, bench.cc, health.cc,
// describe.cc; context.cc for the `context` group) defines its own flags and its Command; main.cc
// dispatches.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_COMMON_H_
#define ATTNSERVE_CLIENT_ATTNCTL_COMMON_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/attn_client.h"
#include "client/attnctl/flag_parser.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(int64_t, max_attempts);
ABSL_DECLARE_FLAG(int64_t, chunk_bytes);
ABSL_DECLARE_FLAG(bool, json);

namespace attnserve::attnctl {

// Exit codes, listed in `attnctl help` (kExitCodesHelp) and client/README.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitLocal = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCheck = 3;
inline constexpr int kExitNotServing = 4;
inline constexpr int kExitRpcBase = 10;  // + the gRPC code of a failed call

extern const char kExitCodesHelp[];

// One subcommand.
struct Command {
  absl::string_view name;      // "run"; "context create" for a command of the context group
  absl::string_view synopsis;  // the usage line(s) after "attnctl "
  absl::string_view summary;   // what it does, a paragraph
  std::vector<FlagUse> flags;  // what it accepts, in help order
  // Runs it once its flags are set; returns the exit code.
  int (*main)(const FlagSet& flags);
  // Arguments that are not flags it takes (a context's NAME): FlagSet::operands.
  int operands = 0;
};

Command RunCommand();
Command BenchCommand();
Command HealthCommand();
Command DescribeCommand();
// context create, append, attend, stats, list, delete (context.cc).
std::vector<Command> ContextCommands();

// "attnctl run --help": synopsis, summary, flags and exit codes.
std::string CommandHelp(const Command& command);

// Prints "attnctl: <what>: <CODE>: <message>" on stderr and returns `exit_code`.
int Report(absl::string_view what, const absl::Status& status, int exit_code);
// Prints "attnctl: <command>: <message> (see attnctl <command> --help)"; returns kExitUsage.
int UsageError(absl::string_view command, const absl::Status& status);
// kExitRpcBase + the status code.
int RpcExitCode(const absl::Status& status);

// --server, --timeout (whole-call deadline), --max-attempts and the TLS/token flags (--tls,
// --ca-cert, --client-cert, --client-key, --server-name-override, --token-file): every
// subcommand takes them.
// `default_timeout_text` is the subcommand's own timeout default ("" keeps the flag's).
std::vector<FlagUse> ConnectionFlags(absl::string_view default_timeout_text = "");

// The client --server, --max-attempts and (where given) --chunk-bytes describe.
absl::StatusOr<std::unique_ptr<client::AttnClient>> ClientFromFlags();

// --timeout, or `fallback` when the command line does not give it.
absl::StatusOr<absl::Duration> TimeoutFromFlags(const FlagSet& flags, absl::Duration fallback);
// --timeout, or else the default the subcommand's help shows (ConnectionFlags'
// `default_timeout_text`, else the flag's own): what the help says is what applies.
absl::StatusOr<absl::Duration> TimeoutFromFlags(const FlagSet& flags);

}  // namespace attnserve::attnctl

#endif  // ATTNSERVE_CLIENT_ATTNCTL_COMMON_H_
