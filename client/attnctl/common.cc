#include "client/attnctl/common.h"

#include <algorithm>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/client_security.h"

ABSL_FLAG(std::string, server, "localhost:50051", "server address, HOST:PORT");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(5),
          "whole-call deadline, retries included, e.g. 500ms, 30s, 5m");
ABSL_FLAG(int64_t, max_attempts, attnserve::client::ClientOptions().max_attempts,
          "attempts per call when the server is UNAVAILABLE before answering (at most 100)");
ABSL_FLAG(int64_t, chunk_bytes, attnserve::client::ClientOptions().chunk_bytes,
          "upload chunk size; the server accepts up to its --max-chunk-bytes, 64 MiB by default");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(bool, tls, false,
          "connect with TLS (implied by --ca-cert, --client-cert, --server-name-override)");
ABSL_FLAG(std::string, ca_cert, "",
          "TLS: PEM CA bundle that signed the server's certificate "
          "(default: the system's roots)");
ABSL_FLAG(std::string, client_cert, "", "TLS: PEM client certificate (servers with mutual TLS)");
ABSL_FLAG(std::string, client_key, "", "TLS: PEM private key of --client-cert");
ABSL_FLAG(std::string, server_name_override, "",
          "TLS: the name the server's certificate must carry, when it is not --server's host");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the bearer token to send (default: $ATTNSERVE_TOKEN)");
ABSL_FLAG(int64_t, connections, attnserve::client::ClientOptions().connections,
          "TCP connections concurrent calls are spread over (1..64)");

namespace attnserve::attnctl {

const char kExitCodesHelp[] = R"(Exit codes:
  0        success (health: the server is SERVING)
  1        local failure (reading or writing files, a malformed server response)
  2        usage error (unknown subcommand or flag, bad flag value)
  3        --check failed: an error above the tolerance, or non-finite outputs
  4        health: the server answered but is not SERVING
  10 + c   the call failed with gRPC code c, e.g. 13 INVALID_ARGUMENT (3), 14 DEADLINE_EXCEEDED
           (4), 18 RESOURCE_EXHAUSTED (8), 24 UNAVAILABLE (14), 26 UNAUTHENTICATED (16); bench:
           any request failed
)";

std::string CommandHelp(const Command& command) {
  return absl::StrCat("Usage:\n  attnctl ", command.synopsis, "\n\n", command.summary,
                      "\nFlags:\n", FlagsHelp(command.flags), "\n", kExitCodesHelp);
}

int Report(absl::string_view what, const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "attnctl: %s: %s\n", std::string(what).c_str(), status.ToString().c_str());
  return exit_code;
}

int UsageError(absl::string_view command, const absl::Status& status) {
  const std::string name(command);
  std::fprintf(stderr, "attnctl: %s: %s (see attnctl %s --help)\n", name.c_str(),
               std::string(status.message()).c_str(), name.c_str());
  return kExitUsage;
}

int RpcExitCode(const absl::Status& status) {
  return kExitRpcBase + static_cast<int>(status.code());
}

std::vector<FlagUse> ConnectionFlags(absl::string_view default_timeout_text) {
  return {{"server", "HOST:PORT"},
          {"timeout", "DURATION", default_timeout_text},
          {"max_attempts", "N"},
          {"tls", ""},
          {"ca_cert", "FILE"},
          {"client_cert", "FILE"},
          {"client_key", "FILE"},
          {"server_name_override", "NAME"},
          {"token_file", "FILE"}};
}

absl::StatusOr<std::unique_ptr<client::AttnClient>> ClientFromFlags() {
  client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  absl::StatusOr<int64_t> chunk = IntAtLeast(FLAGS_chunk_bytes, 1);
  if (!chunk.ok()) return chunk.status();
  options.chunk_bytes = *chunk;
  absl::StatusOr<int64_t> attempts = IntAtLeast(FLAGS_max_attempts, 1);
  if (!attempts.ok()) return attempts.status();
  options.max_attempts = static_cast<int>(std::min<int64_t>(*attempts, 100));
  absl::StatusOr<int64_t> connections = IntAtLeast(FLAGS_connections, 1);
  if (!connections.ok()) return connections.status();
  options.connections = static_cast<int>(std::min<int64_t>(*connections, 64));
  client::TlsFiles tls{absl::GetFlag(FLAGS_ca_cert), absl::GetFlag(FLAGS_client_cert),
                       absl::GetFlag(FLAGS_client_key)};
  options.tls_server_name = absl::GetFlag(FLAGS_server_name_override);
  if (absl::GetFlag(FLAGS_tls) || !tls.ca_cert.empty() || !tls.client_cert.empty() ||
      !tls.client_key.empty() || !options.tls_server_name.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        client::TlsCredentialsFromFiles(tls, "--");
    if (!credentials.ok()) return credentials.status();
    options.credentials = *credentials;
  }
  absl::StatusOr<std::string> token = client::TokenFromFileOrEnv(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return token.status();
  options.token = *token;
  return client::AttnClient::Create(options);
}

absl::StatusOr<absl::Duration> TimeoutFromFlags(const FlagSet& flags, absl::Duration fallback) {
  if (!flags.Has("timeout")) return fallback;
  return PositiveDuration(FLAGS_timeout);
}

absl::StatusOr<absl::Duration> TimeoutFromFlags(const FlagSet& flags) {
  const std::string text = flags.DefaultText("timeout");
  absl::Duration fallback;
  if (text.empty()) {
    fallback = absl::GetFlag(FLAGS_timeout);  // not on the command line: the flag's default
  } else if (!absl::ParseDuration(text, &fallback)) {
    return absl::InternalError(absl::StrCat("--timeout: bad default '", text, "'"));
  }
  return TimeoutFromFlags(flags, fallback);
}

}  // namespace attnserve::attnctl
