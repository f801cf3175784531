// Transport security of the gRPC port: TLS, mutual TLS, and the gate that keeps reflection closed
// to callers without a token.
//
// Certificates are served through gRPC's FileWatcherCertificateProvider: the key, certificate and
// client CA files are re-read every `reload_interval`, and a changed (and valid) set is used for
// the handshakes that follow; connections already open keep theirs. A key and certificate that do
// not match (say, one file replaced and not yet the other) are ignored until they do, so replace
// them atomically (write new files, then rename them into place; a Kubernetes Secret volume does
// this for you).
#ifndef ATTNSERVE_SERVER_AUTH_TRANSPORT_H_
#define ATTNSERVE_SERVER_AUTH_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/auth/principals.h"

namespace attnserve::auth {

struct ServerTlsOptions {
  std::string cert_file;       // PEM certificate chain (--tls-cert)
  std::string key_file;        // PEM private key (--tls-key)
  std::string client_ca_file;  // PEM CA bundle; set: clients must present a cert it signed (mTLS)
  absl::Duration reload_interval = absl::Seconds(60);

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

// Checks the options (both of cert and key or neither; a client CA needs them; the files parse as
// PEM and the key matches the certificate) and returns the port's credentials: insecure when TLS
// is off. Errors name the flag.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

// On a TLS port, refuses (UNAUTHENTICATED) the calls to gRPC reflection that carry no valid token,
// before the reflection service sees them. Every other call passes through: the attnserve service
// authenticates its own calls, and health stays open. gRPC runs these processors on secure ports
// only, so a plaintext port cannot gate reflection this way (main.cc then leaves reflection off).
class ReflectionGate final : public grpc::AuthMetadataProcessor {
 public:
  explicit ReflectionGate(const Authenticator* authenticator) : authenticator_(authenticator) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const Authenticator* const authenticator_;
};

// Whether a listen address ("127.0.0.1:50051", "[::1]:0", "localhost:9464", "unix:...") is
// reachable from this host only.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace attnserve::auth

#endif  // ATTNSERVE_SERVER_AUTH_TRANSPORT_H_
