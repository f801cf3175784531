// TLS and bearer tokens for the attnserve client: channel credentials from PEM files, the token
// from a file or the environment, and the interceptor that sends it on every call.
#ifndef ATTNSERVE_CLIENT_CLIENT_SECURITY_H_
#define ATTNSERVE_CLIENT_CLIENT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace attnserve::client {

// PEM files of a TLS channel. Every field may be empty: no CA means the system's roots; a client
// certificate and key (both or neither) answer a server that asks for one (mutual TLS).
struct TlsFiles {
  std::string ca_cert;
  std::string client_cert;
  std::string client_key;
};

// Channel credentials for TLS from the files; errors name the file ("--ca-cert=x: cannot read
// it" with `flag_prefix` "--", "ca_cert=x: ..." with "").
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentialsFromFiles(
    const TlsFiles& files, const std::string& flag_prefix = "");

// The token to send: the first line of `token_file` when given, else the environment variable
// ATTNSERVE_TOKEN, else "" (none).
absl::StatusOr<std::string> TokenFromFileOrEnv(const std::string& token_file);

// Adds "authorization: Bearer <token>" to the initial metadata of every call of a channel. On a
// plaintext channel the token travels in the clear: use it with TLS.
class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token)
      : value_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override;

 private:
  const std::string value_;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_CLIENT_SECURITY_H_
