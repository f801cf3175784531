// Transport security against the real attnserve binary: TLS and mutual TLS handshakes (good,
// wrong-CA and expired certificates), certificate hot reload, the --auth-discovery gate on
// Describe and reflection, attnctl's TLS and token flags, the start-up checks and the exposure
// log. Certificates are made at run time by scripts/gen-dev-certs into a temporary directory.
#include "tests/integration/security_support.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined (path of the attnctl binary)"
#endif

namespace attnserve::testing {
namespace {

// The CN of the certificate the server presented on a fresh connection (a Describe call).
absl::StatusOr<std::string> PeerCommonName(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection, not a pooled one
  std::unique_ptr<v1::AttentionService::Stub> stub =
      v1::AttentionService::NewStub(grpc::CreateCustomChannel(target, creds, args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::DescribeRequest request;
  v1::DescribeResponse response;
  const grpc::Status status = stub->Describe(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  std::vector<grpc::string_ref> cn = context.auth_context()->FindPropertyValues("x509_common_name");
  if (cn.empty()) return absl::NotFoundError("no x509_common_name in the peer's auth context");
  return std::string(cn[0].data(), cn[0].size());
}

// grpc.reflection ServerReflectionInfo with one list_services request: the call's status and the
// first response's bytes.
struct ReflectionOutcome {
  grpc::Status status;
  std::string response;
};
ReflectionOutcome ListServicesByReflection(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> creds,
                                           const std::string& token) {
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(target, creds);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  // Each step waits for its own tag; the deadline bounds every wait.
  const auto step = [&](void* want) {
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
      if (tag == want) return ok;
    }
    return false;
  };
  ReflectionOutcome out;
  call->StartCall(reinterpret_cast<void*>(1));
  if (step(reinterpret_cast<void*>(1))) {
    const std::string list_services("\x3a\x00", 2);  // ServerReflectionRequest{list_services: ""}
    grpc::Slice slice(list_services);
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    if (step(reinterpret_cast<void*>(2))) {
      call->WritesDone(reinterpret_cast<void*>(3));
      step(reinterpret_cast<void*>(3));
      grpc::ByteBuffer response;
      call->Read(&response, reinterpret_cast<void*>(4));
      if (step(reinterpret_cast<void*>(4))) {
        std::vector<grpc::Slice> slices;
        if (response.Dump(&slices).ok()) {
          for (const grpc::Slice& s : slices) {
            out.response.append(reinterpret_cast<const char*>(s.begin()), s.size());
          }
        }
      }
    }
  }
  call->Finish(&out.status, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

TEST_F(SecurityTest, TlsHandshakeNeedsTheRightCaAndAnUnexpiredCertificate) {
  ServerOptions options;
  options.extra_args = TlsFlags("server");
  options.credentials = Tls("ca");
  std::unique_ptr<ServerProcess> server = StartServer(options);
  ASSERT_NE(server, nullptr);

  std::unique_ptr<client::AttnClient> good = Client(server->target(), Tls("ca"));
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(HealthOf(*good).ok());
  absl::StatusOr<v1::DescribeResponse> describe = good->Describe(Short());
  EXPECT_TRUE(describe.ok()) << describe.status();

  // A client that trusts another CA, and a plaintext client, cannot talk to it.
  std::unique_ptr<client::AttnClient> wrong_ca = Client(server->target(), Tls("other-ca"));
  ASSERT_NE(wrong_ca, nullptr);
  EXPECT_EQ(HealthOf(*wrong_ca).code(), absl::StatusCode::kUnavailable);
  std::unique_ptr<client::AttnClient> plaintext = Client(server->target(), nullptr);
  ASSERT_NE(plaintext, nullptr);
  EXPECT_EQ(HealthOf(*plaintext).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();

  // A server whose certificate has expired (signed by the right CA) runs, but the client that
  // talked to the first server (same CA, same flags otherwise) fails the handshake with it.
  options.extra_args = TlsFlags("expired-server");
  options.wait_for_health = false;  // no client can pass its handshake
  absl::StatusOr<std::unique_ptr<ServerProcess>> expired = ServerProcess::Start(options);
  ASSERT_TRUE(expired.ok()) << expired.status();
  std::unique_ptr<client::AttnClient> same_ca = Client((*expired)->target(), Tls("ca"));
  ASSERT_NE(same_ca, nullptr);
  EXPECT_EQ(HealthOf(*same_ca).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*expired)->Running()) << (*expired)->Log();
  EXPECT_TRUE((*expired)->Stop().ok()) << (*expired)->Log();
}

TEST_F(SecurityTest, MutualTlsRefusesClientsWithoutAGoodCertificate) {
  ServerOptions options;
  options.extra_args = TlsFlags("server");
  options.extra_args.push_back("--tls-client-ca=" + Cert("ca.pem"));
  options.credentials = Tls("ca", "client");
  std::unique_ptr<ServerProcess> server = StartServer(options);
  ASSERT_NE(server, nullptr);

  std::unique_ptr<client::AttnClient> good = Client(server->target(), Tls("ca", "client"));
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(HealthOf(*good).ok());
  for (const std::string& client_cert :
       {std::string(""), std::string("other-client"), std::string("expired-client")}) {
    std::unique_ptr<client::AttnClient> bad = Client(server->target(), Tls("ca", client_cert));
    ASSERT_NE(bad, nullptr);
    EXPECT_EQ(HealthOf(*bad).code(), absl::StatusCode::kUnavailable)
        << "client certificate: " << (client_cert.empty() ? "(none)" : client_cert);
  }
  EXPECT_TRUE(HealthOf(*good).ok());
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST_F(SecurityTest, ReplacedCertificateFilesAreServedWithoutARestart) {
  // The server reads its key and certificate from a directory the test rewrites.
  absl::StatusOr<std::unique_ptr<TempDir>> live = TempDir::Create("attnserve_sec_live_");
  ASSERT_TRUE(live.ok());
  const auto install = [&](const std::string& from) {
    for (const std::string ext : {".pem", ".key"}) {
      std::ifstream in(Cert(from + ext), std::ios::binary);
      const std::string tmp = (*live)->File("server" + ext + ".tmp");
      std::ofstream(tmp, std::ios::binary) << in.rdbuf();
      ASSERT_EQ(std::rename(tmp.c_str(), (*live)->File("server" + ext).c_str()), 0);
    }
  };
  install("server");
  ServerOptions options;
  options.extra_args = {"--tls-cert=" + (*live)->File("server.pem"),
                        "--tls-key=" + (*live)->File("server.key"), "--tls-reload-interval=1s"};
  options.credentials = Tls("ca");
  std::unique_ptr<ServerProcess> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::string> cn = PeerCommonName(server->target(), Tls("ca"));
  ASSERT_TRUE(cn.ok()) << cn.status();
  EXPECT_EQ(*cn, "attnserve");

  install("server2");
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up) {
    cn = PeerCommonName(server->target(), Tls("ca"));
    if (cn.ok() && *cn == "attnserve-2") break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_TRUE(cn.ok()) << cn.status();
  EXPECT_EQ(*cn, "attnserve-2") << "the new certificate was not served within 20 s";
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST_F(SecurityTest, AuthDiscoveryClosesDescribeAndReflectionButNotHealth) {
  const std::string tokens = certs_->File("discovery_tokens.txt");
  std::ofstream(tokens) << "alice " << kAliceToken << "\n";
  for (const bool closed : {true, false}) {
    SCOPED_TRACE(closed ? "--auth-discovery" : "default");
    ServerOptions options;
    options.extra_args = TlsFlags("server");
    options.extra_args.push_back("--token-file=" + tokens);
    if (closed) options.extra_args.push_back("--auth-discovery");
    options.credentials = Tls("ca");
    std::unique_ptr<ServerProcess> server = StartServer(options);
    ASSERT_NE(server, nullptr);
    std::unique_ptr<client::AttnClient> anonymous = Client(server->target(), Tls("ca"));
    std::unique_ptr<client::AttnClient> alice = Client(server->target(), Tls("ca"), kAliceToken);
    EXPECT_TRUE(HealthOf(*anonymous).ok());
    EXPECT_TRUE(alice->Describe(Short()).ok());
    absl::StatusOr<v1::DescribeResponse> open = anonymous->Describe(Short());
    EXPECT_EQ(open.status().code(),
              closed ? absl::StatusCode::kUnauthenticated : absl::StatusCode::kOk)
        << open.status();

    ReflectionOutcome with = ListServicesByReflection(server->target(), Tls("ca"), kAliceToken);
    EXPECT_TRUE(with.status.ok()) << with.status.error_message();
    EXPECT_TRUE(absl::StrContains(with.response, "attnserve.v1.AttentionService"));
    ReflectionOutcome without = ListServicesByReflection(server->target(), Tls("ca"), "");
    if (closed) {
      EXPECT_EQ(without.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << without.status.error_message();
      EXPECT_FALSE(absl::StrContains(without.response, "AttentionService"));
    } else {
      EXPECT_TRUE(without.status.ok()) << without.status.error_message();
      EXPECT_TRUE(absl::StrContains(without.response, "attnserve.v1.AttentionService"));
    }
    EXPECT_TRUE(server->Stop().ok()) << server->Log();
  }
}

TEST_F(SecurityTest, AttnctlConnectsWithTlsFlagsAndATokenFile) {
  const std::string tokens = certs_->File("attnctl_tokens.txt");
  std::ofstream(tokens) << "alice " << kAliceToken << "\n";
  const std::string token_file = certs_->File("alice_token.txt");
  std::ofstream(token_file) << kAliceToken << "\n";
  ServerOptions options;
  options.extra_args = TlsFlags("server");
  options.extra_args.push_back("--tls-client-ca=" + Cert("ca.pem"));
  options.extra_args.push_back("--token-file=" + tokens);
  options.extra_args.push_back("--auth-discovery");
  options.credentials = Tls("ca", "client");
  std::unique_ptr<ServerProcess> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  // By name: the certificate names localhost; by address with --server-name-override.
  const std::string port = absl::StrCat(server->port());
  const std::vector<std::string> tls = {"--ca-cert",        Cert("ca.pem"), "--client-cert",
                                        Cert("client.pem"), "--client-key", Cert("client.key")};
  const auto attnctl = [&](std::vector<std::string> args) {
    args.insert(args.end(), tls.begin(), tls.end());
    return RunLogged("attnctl", ATTNCTL_BINARY, args, absl::Seconds(60));
  };
  CommandResult ok = attnctl({"describe", "--server", "localhost:" + port, "--token-file",
                              token_file, "--timeout", "10s"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(absl::StrContains(ok.output, "backend")) << ok.output;
  CommandResult named = attnctl({"describe", "--server", "127.0.0.1:" + port, "--token-file",
                                 token_file, "--server-name-override", "attnserve"});
  EXPECT_EQ(named.exit_code, 0) << named.output;
  // Without a token: 10 + UNAUTHENTICATED (16); health needs none.
  CommandResult no_token = attnctl({"describe", "--server", "localhost:" + port});
  EXPECT_EQ(no_token.exit_code, 26) << no_token.output;
  CommandResult health = attnctl({"health", "--server", "localhost:" + port});
  EXPECT_EQ(health.exit_code, 0) << health.output;
  // Without the client certificate: the handshake fails, 10 + UNAVAILABLE (14).
  CommandResult no_cert = RunLogged("attnctl", ATTNCTL_BINARY,
                                    {"health", "--server", "localhost:" + port, "--ca-cert",
                                     Cert("ca.pem"), "--timeout", "3s", "--max-attempts", "1"},
                                    absl::Seconds(60));
  EXPECT_EQ(no_cert.exit_code, 24) << no_cert.output;
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST_F(SecurityTest, OpenPortsAreWarnedAboutAndMetricsCanStayOnLoopback) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create("attnserve_sec_exposure_");
  ASSERT_TRUE(dir.ok());
  // gRPC on every interface without TLS or tokens; metrics asked for every interface too, but
  // --metrics-loopback-only keeps them on 127.0.0.1.
  absl::StatusOr<std::unique_ptr<ChildProcess>> server = ChildProcess::Spawn(
      ATTNSERVE_BINARY,
      {"--listen=0.0.0.0:0", "--port-file=" + (*dir)->File("port"), "--metrics-listen=0.0.0.0:0",
       "--metrics-loopback-only", "--backend=cpu"},
      (*dir)->File("log"));
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up && !std::ifstream((*dir)->File("port")).good()) {
    ASSERT_TRUE((*server)->Running()) << (*server)->Log();
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string log = (*server)->Log();
  EXPECT_TRUE(absl::StrContains(log, "metrics on http://127.0.0.1:")) << log;
  EXPECT_TRUE(absl::StrContains(log, "(not loopback) without TLS and without tokens")) << log;
  EXPECT_FALSE(absl::StrContains(log, "is open to anyone who can reach it")) << log;
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

TEST_F(SecurityTest, StartUpRefusesBadSecurityFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls-cert=" + Cert("server.pem")}, "--tls-cert and --tls-key: give both or neither"},
      {{"--tls-cert=" + Cert("server.pem"), "--tls-key=" + Cert("client.key")},
       "does not match the certificate"},
      {{"--tls-client-ca=" + Cert("ca.pem")}, "--tls-client-ca: needs --tls-cert and --tls-key"},
      {{"--auth-discovery"}, "--auth-discovery: needs --token-file"},
      {{"--token-file=" + Cert("missing.txt")}, "cannot read it"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics-listen=", "--backend=cpu"};
    args.insert(args.end(), flags.begin(), flags.end());
    CommandResult r = RunLogged("attnserve", ATTNSERVE_BINARY, args, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 1) << flags[0];
    EXPECT_TRUE(absl::StrContains(r.output, message)) << r.output;
  }
}

}  // namespace
}  // namespace attnserve::testing
