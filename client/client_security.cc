#include "client/client_security.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace attnserve::client {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(name, "=", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;  // the factory's, which the channel keeps alive
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentialsFromFiles(
    const TlsFiles& files, const std::string& flag_prefix) {
  grpc::SslCredentialsOptions ssl;
  if (!files.ca_cert.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(files.ca_cert, flag_prefix + "ca-cert");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (files.client_cert.empty() != files.client_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag_prefix, "client-cert and ", flag_prefix,
                                                   "client-key: give both or neither"));
  }
  if (!files.client_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(files.client_cert, flag_prefix + "client-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(files.client_key, flag_prefix + "client-key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (credentials == nullptr) return absl::InternalError("TLS: could not create credentials");
  return credentials;
}

absl::StatusOr<std::string> TokenFromFileOrEnv(const std::string& token_file) {
  if (!token_file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(token_file, "--token-file");
    if (!text.ok()) return text.status();
    const std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file=", token_file, ": the first line holds no token"));
    }
    return token;
  }
  const char* env = std::getenv("ATTNSERVE_TOKEN");
  return std::string(env == nullptr ? "" : absl::StripAsciiWhitespace(env));
}

grpc::experimental::Interceptor* BearerTokenInterceptorFactory::CreateClientInterceptor(
    grpc::experimental::ClientRpcInfo* /*info*/) {
  return new BearerTokenInterceptor(&value_);
}

}  // namespace attnserve::client
