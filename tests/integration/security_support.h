// Support for the security integration tests (security_test.cc, token_test.cc): one set of
// certificates per suite from scripts/gen-dev-certs, clients with TLS and tokens, servers started
// with security flags.
#ifndef ATTNSERVE_TESTS_INTEGRATION_SECURITY_SUPPORT_H_
#define ATTNSERVE_TESTS_INTEGRATION_SECURITY_SUPPORT_H_

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "client/attn_client.h"
#include "client/client_security.h"
#include "client/shared_memory_region.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

#ifndef GEN_DEV_CERTS
#error "GEN_DEV_CERTS must be defined (path of scripts/gen-dev-certs)"
#endif

namespace attnserve::testing {

inline constexpr char kAliceToken[] = "alice-0123456789abcdef0123456789";
inline constexpr char kBobToken[] = "bob-0123456789abcdef0123456789ab";
inline constexpr absl::Duration kCallTimeout = absl::Seconds(10);

// One set of certificates for the whole suite (scripts/gen-dev-certs --test-extras).
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnserve_sec_");
    if (!dir.ok()) {
      error_ = new std::string(dir.status().ToString());
      return;
    }
    certs_ = dir->release();
    absl::StatusOr<CommandResult> r =
        RunCommand(GEN_DEV_CERTS, {certs_->path(), "--test-extras"}, absl::Seconds(60));
    if (!r.ok() || r->exit_code != 0) {
      error_ = new std::string(
          absl::StrCat("gen-dev-certs failed: ", r.ok() ? r->output : r.status().ToString()));
    }
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
    delete error_;
    error_ = nullptr;
  }
  void SetUp() override {
    ASSERT_EQ(error_, nullptr) << *error_;
    ASSERT_NE(certs_, nullptr);
  }

  static std::string Cert(const std::string& name) { return certs_->File(name); }

  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca,
                                                       const std::string& client = "") {
    client::TlsFiles files;
    files.ca_cert = Cert(ca + ".pem");
    if (!client.empty()) {
      files.client_cert = Cert(client + ".pem");
      files.client_key = Cert(client + ".key");
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> c =
        client::TlsCredentialsFromFiles(files);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

  // A client of `target` with its own connection (retries off).
  static std::unique_ptr<client::AttnClient> Client(
      const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials,
      const std::string& token = "") {
    client::ClientOptions o;
    o.target = target;
    o.max_attempts = 1;
    o.connections = 1;
    o.credentials = std::move(credentials);
    o.token = token;
    absl::StatusOr<std::unique_ptr<client::AttnClient>> c = client::AttnClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  static absl::Status HealthOf(client::AttnClient& c) {
    client::CallOptions call;
    call.timeout = absl::Seconds(5);
    return c.Health(call);
  }

  static client::CallOptions Short() {
    client::CallOptions call;
    call.timeout = kCallTimeout;
    return call;
  }

  // A server whose start-up health check connects as `options` says.
  static std::unique_ptr<ServerProcess> StartServer(const ServerOptions& options) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(options);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  static std::vector<std::string> TlsFlags(const std::string& server) {
    return {"--tls-cert=" + Cert(server + ".pem"), "--tls-key=" + Cert(server + ".key")};
  }

  inline static TempDir* certs_ = nullptr;
  inline static std::string* error_ = nullptr;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_INTEGRATION_SECURITY_SUPPORT_H_
