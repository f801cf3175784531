#include "server/auth/transport.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace attnserve::auth {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, "=", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a PEM file"));
  }
  return text.str();
}

// The certificate parses, the key parses and the two belong together: a mistake in the files is
// reported at start-up rather than as failed handshakes.
absl::Status CheckPair(const ServerTlsOptions& o) {
  absl::StatusOr<std::string> cert = ReadPem(o.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(o.key_file, "--tls-key");
  if (!key.ok()) return key.status();
  BIO* cert_bio = BIO_new_mem_buf(cert->data(), static_cast<int>(cert->size()));
  X509* x509 = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  BIO* key_bio = BIO_new_mem_buf(key->data(), static_cast<int>(key->size()));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  absl::Status status;
  if (x509 == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--tls-cert=", o.cert_file, ": no PEM certificate in it"));
  } else if (pkey == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--tls-key=", o.key_file,
                     ": no PEM private key in it (an encrypted key is not supported)"));
  } else if (X509_check_private_key(x509, pkey) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat("--tls-key=", o.key_file,
                                                     ": does not match the certificate of "
                                                     "--tls-cert=",
                                                     o.cert_file));
  }
  X509_free(x509);
  EVP_PKEY_free(pkey);
  return status;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& o) {
  if (!o.enabled()) {
    if (o.mutual()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is TLS first)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (o.cert_file.empty() || o.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
  }
  if (o.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-reload-interval: must be >= 1s, got ",
                                                   absl::FormatDuration(o.reload_interval)));
  }
  if (absl::Status s = CheckPair(o); !s.ok()) return s;
  if (o.mutual()) {
    if (absl::StatusOr<std::string> ca = ReadPem(o.client_ca_file, "--tls-client-ca"); !ca.ok()) {
      return ca.status();
    }
  }
  const unsigned int interval = static_cast<unsigned int>(absl::ToInt64Seconds(o.reload_interval));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key_file, o.cert_file, o.client_ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (o.mutual()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  if (credentials == nullptr) {
    return absl::InternalError("TLS: gRPC could not create the server credentials");
  }
  return credentials;
}

grpc::Status ReflectionGate::Process(const InputMetadata& auth_metadata,
                                     grpc::AuthContext* /*context*/,
                                     OutputMetadata* /*consumed_auth_metadata*/,
                                     OutputMetadata* /*response_metadata*/) {
  auto path = auth_metadata.find(":path");
  if (path == auth_metadata.end()) return grpc::Status::OK;
  const absl::string_view method(path->second.data(), path->second.size());
  if (!absl::StartsWith(method, "/grpc.reflection.")) return grpc::Status::OK;
  std::optional<absl::string_view> token;
  if (auto it = auth_metadata.find("authorization"); it != auth_metadata.end()) {
    token = absl::string_view(it->second.data(), it->second.size());
  }
  absl::StatusOr<std::shared_ptr<Principal>> principal = authenticator_->Authenticate(token);
  if (!principal.ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        std::string(principal.status().message()));
  }
  return grpc::Status::OK;
}

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:")) return true;
  absl::string_view host = address;
  if (absl::ConsumePrefix(&host, "[")) {
    host = host.substr(0, host.find(']'));
  } else if (const size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace attnserve::auth
