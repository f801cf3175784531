// Transport security and authentication against the real attnserve binary: TLS and mutual TLS
// handshakes (good, wrong-CA and expired certificates), certificate hot reload, bearer tokens and
// each per-principal limit, ownership of contexts and regions, and the --auth-discovery gate on
// Describe and reflection. Certificates are made at run time by scripts/gen-dev-certs into a
// temporary directory.
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
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

#ifndef ATTNCTL_BINARY
#error "ATTNCTL_BINARY must be defined (path of the attnctl binary)"
#endif
#ifndef GEN_DEV_CERTS
#error "GEN_DEV_CERTS must be defined (path of scripts/gen-dev-certs)"
#endif

namespace attnserve::testing {
namespace {

constexpr char kAliceToken[] = "alice-0123456789abcdef0123456789";
constexpr char kBobToken[] = "bob-0123456789abcdef0123456789ab";
constexpr absl::Duration kCallTimeout = absl::Seconds(10);

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
      error_ = new std::string(absl::StrCat("gen-dev-certs failed: ",
                                            r.ok() ? r->output : r.status().ToString()));
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
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
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

  // A server whose certificate has expired (signed by the right CA) fails the handshake.
  options.extra_args = TlsFlags("expired-server");
  options.startup_timeout = absl::Seconds(5);  // its own health check cannot pass
  absl::StatusOr<std::unique_ptr<ServerProcess>> expired = ServerProcess::Start(options);
  ASSERT_FALSE(expired.ok());
  EXPECT_THAT(std::string(expired.status().message()), ::testing::HasSubstr("health check"));
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
  for (const std::string& client_cert : {std::string(""), std::string("other-client"),
                                         std::string("expired-client")}) {
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

// Tokens over plaintext (the token rules do not depend on the transport).
class TokenTest : public SecurityTest {
 protected:
  static constexpr int64_t kMaxRequestBytes = 1 << 20;
  static constexpr int64_t kMaxResidentBytes = 100000;

  void SetUp() override {
    SecurityTest::SetUp();
    dir_ = *TempDir::Create("attnserve_tokens_");
    std::ofstream(dir_->File("tokens.txt"))
        << "# test principals\n"
        << "alice " << kAliceToken << " max_request_bytes=" << kMaxRequestBytes
        << " max_concurrent_streams=1 max_resident_bytes=" << kMaxResidentBytes << "\n"
        << "bob " << kBobToken << "\n";
    ServerOptions options;
    options.extra_args = {"--token-file=" + dir_->File("tokens.txt")};
    server_ = StartServer(options);  // health needs no token
    ASSERT_NE(server_, nullptr);
    alice_ = Client(server_->target(), nullptr, kAliceToken);
    bob_ = Client(server_->target(), nullptr, kBobToken);
    ASSERT_NE(alice_, nullptr);
    ASSERT_NE(bob_, nullptr);
  }
  void TearDown() override {
    if (server_ != nullptr) EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
  }

  // A small f32 request: 1 x 64 tokens x 2 heads x 64, dense.
  static absl::StatusOr<Problem> SmallProblem(int64_t tokens = 64) {
    return MakeProblem(DType::kF32, 1, tokens, 2, 2, 64, SpecFromJson(R"({"dense": {}})"),
                       FreshSeed());
  }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<client::AttnClient> alice_, bob_;
};

TEST_F(TokenTest, MissingAndWrongTokensAreUnauthenticated) {
  absl::StatusOr<Problem> p = SmallProblem();
  ASSERT_TRUE(p.ok());
  std::unique_ptr<client::AttnClient> none = Client(server_->target(), nullptr);
  std::unique_ptr<client::AttnClient> wrong =
      Client(server_->target(), nullptr, "alice-0123456789abcdef0123456788");
  for (client::AttnClient* c : {none.get(), wrong.get()}) {
    absl::StatusOr<client::AttendResult> r = c->Attend(AttendInputFor(*p), Short());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
    EXPECT_FALSE(absl::StrContains(r.status().message(), "alice")) << r.status();
    EXPECT_EQ(c->ListContexts(Short()).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(c->ListRegions(Short()).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(c->CreateContext("x", DType::kF32, 1, 64, 16, absl::ZeroDuration(), Short())
                  .status()
                  .code(),
              absl::StatusCode::kUnauthenticated);
    // Health and (without --auth-discovery) Describe stay open.
    EXPECT_TRUE(HealthOf(*c).ok());
    EXPECT_TRUE(c->Describe(Short()).ok());
  }
  absl::StatusOr<client::AttendResult> r = alice_->Attend(AttendInputFor(*p), Short());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(CheckResult(*p, *r, OTolerance(DType::kF32), LseTolerance(DType::kF32)).ok());
}

TEST_F(TokenTest, RequestBytesAboveThePrincipalsLimitAreRefused) {
  // 1 x 2048 x 2 x 64 f32: q, k and v 3 MiB together, over alice's 1 MiB; bob has no limit.
  absl::StatusOr<Problem> big = SmallProblem(2048);
  ASSERT_TRUE(big.ok());
  absl::StatusOr<client::AttendResult> r = alice_->Attend(AttendInputFor(*big), Short());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "max_request_bytes=1048576")) << r.status();
  EXPECT_TRUE(bob_->Attend(AttendInputFor(*big), Short()).ok());
  // An append's K and V count too.
  absl::StatusOr<v1::ContextStatus> context =
      alice_->CreateContext("alice-big", DType::kF32, 2, 64, 16, absl::ZeroDuration(), Short());
  ASSERT_TRUE(context.ok()) << context.status();
  HostTensor k = RandomTensor(DType::kF32, {2048, 2, 64}, 1);
  HostTensor v = RandomTensor(DType::kF32, {2048, 2, 64}, 2);
  absl::StatusOr<v1::ContextStatus> append =
      alice_->AppendContext("alice-big", k, v, std::nullopt, Short());
  EXPECT_EQ(append.status().code(), absl::StatusCode::kResourceExhausted) << append.status();
  EXPECT_TRUE(absl::StrContains(append.status().message(), "max_request_bytes")) << append.status();
}

TEST_F(TokenTest, ConcurrentStreamsAboveThePrincipalsLimitAreRefused) {
  // Alice's one stream: an Attend that sent its header and waits.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::AttentionService::Stub> stub = v1::AttentionService::NewStub(channel);
  grpc::ClientContext held;
  held.AddMetadata("authorization", absl::StrCat("Bearer ", kAliceToken));
  held.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::unique_ptr<grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>> stream =
      stub->Attend(&held);
  v1::AttendRequest header;
  header.mutable_header()->set_dtype(v1::DTYPE_F32);
  for (auto set : {&v1::AttendHeader::set_batch, &v1::AttendHeader::set_q_heads,
                   &v1::AttendHeader::set_kv_heads}) {
    (header.mutable_header()->*set)(1);
  }
  header.mutable_header()->set_tokens(16);
  header.mutable_header()->set_head_dim(64);
  *header.mutable_header()->mutable_spec() = SpecFromJson(R"({"dense": {}})");
  ASSERT_TRUE(stream->Write(header));

  absl::StatusOr<Problem> p = SmallProblem();
  ASSERT_TRUE(p.ok());
  // The held stream reaches the server before long; until it does, a second call may pass.
  absl::Status second = absl::OkStatus();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up && second.ok()) {
    second = alice_->Attend(AttendInputFor(*p), Short()).status();
  }
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_TRUE(absl::StrContains(second.message(), "max_concurrent_streams=1")) << second;
  // Bob is not limited by alice's streams.
  EXPECT_TRUE(bob_->Attend(AttendInputFor(*p), Short()).ok());

  held.TryCancel();
  stream->Finish().IgnoreError();
  // The slot is given back when the server has finished the cancelled call.
  absl::Status after = absl::UnknownError("not tried");
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until && !after.ok()) {
    after = alice_->Attend(AttendInputFor(*p), Short()).status();
    if (!after.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(after.ok()) << after;
}

TEST_F(TokenTest, ResidentBytesAboveThePrincipalsLimitAreRefused) {
  // 128 rows x 1 head x 64 f32, K and V: 65536 bytes; two do not fit in alice's 100000.
  absl::StatusOr<v1::ContextStatus> first =
      alice_->CreateContext("c1", DType::kF32, 1, 64, 128, absl::ZeroDuration(), Short());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_LE(first->bytes(), kMaxResidentBytes);
  ASSERT_GT(2 * first->bytes(), kMaxResidentBytes);
  absl::StatusOr<v1::ContextStatus> second =
      alice_->CreateContext("c2", DType::kF32, 1, 64, 128, absl::ZeroDuration(), Short());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "max_resident_bytes=100000"))
      << second.status();
  // The refused context is not left behind, and a region counts against the same limit.
  absl::StatusOr<v1::ListContextsResponse> list = alice_->ListContexts(Short());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->contexts_size(), 1);
  absl::StatusOr<std::unique_ptr<client::SharedMemoryRegion>> shm =
      client::SharedMemoryRegion::Create(65536);
  ASSERT_TRUE(shm.ok()) << shm.status();
  absl::StatusOr<v1::RegionStatus> region =
      alice_->RegisterSystemRegion("r1", (*shm)->key(), 0, 65536, Short());
  EXPECT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted) << region.status();
  EXPECT_TRUE(absl::StrContains(region.status().message(), "max_resident_bytes")) << region.status();
  // Bob has no limit; once alice deletes hers, her second fits.
  EXPECT_TRUE(bob_->CreateContext("b1", DType::kF32, 1, 64, 128, absl::ZeroDuration(), Short())
                  .ok());
  ASSERT_TRUE(alice_->DeleteContext("c1", Short()).ok());
  EXPECT_TRUE(alice_->CreateContext("c2", DType::kF32, 1, 64, 128, absl::ZeroDuration(), Short())
                  .ok());
}

TEST_F(TokenTest, ContextsAndRegionsBelongToTheirPrincipal) {
  ASSERT_TRUE(alice_->CreateContext("mine", DType::kF32, 2, 64, 64, absl::ZeroDuration(), Short())
                  .ok());
  EXPECT_EQ(bob_->GetContext("mine", Short()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob_->DeleteContext("mine", Short()).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::ListContextsResponse> bobs = bob_->ListContexts(Short());
  ASSERT_TRUE(bobs.ok());
  EXPECT_EQ(bobs->contexts_size(), 0);
  // Attending to alice's context as bob: not found either.
  HostTensor q = RandomTensor(DType::kF32, {1, 1, 2, 64}, 3);
  client::AttendInput in;
  in.q = &q;
  in.shape = AttentionShape{1, 1, 2, 2, 64};
  in.dtype = DType::kF32;
  in.spec = SpecFromJson(R"({"dense": {}})");
  in.context = "mine";
  absl::StatusOr<client::AttendResult> r = bob_->Attend(in, Short());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_TRUE(alice_->GetContext("mine", Short()).ok());

  absl::StatusOr<std::unique_ptr<client::SharedMemoryRegion>> shm =
      client::SharedMemoryRegion::Create(4096);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(bob_->RegisterSystemRegion("bobs", (*shm)->key(), 0, 4096, Short()).ok());
  absl::StatusOr<v1::ListRegionsResponse> alices = alice_->ListRegions(Short());
  ASSERT_TRUE(alices.ok());
  EXPECT_EQ(alices->regions_size(), 0);
  EXPECT_EQ(alice_->UnregisterRegion("bobs", Short()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(bob_->UnregisterRegion("bobs", Short()).ok());
}

TEST_F(TokenTest, SighupReloadsTheTokenFile) {
  constexpr char kCarolToken[] = "carol-0123456789abcdef0123456789";
  std::unique_ptr<client::AttnClient> carol = Client(server_->target(), nullptr, kCarolToken);
  EXPECT_EQ(carol->ListContexts(Short()).status().code(), absl::StatusCode::kUnauthenticated);
  // Bob leaves, carol arrives; alice stays.
  const std::string tmp = dir_->File("tokens.txt.tmp");
  std::ofstream(tmp) << "alice " << kAliceToken << "\ncarol " << kCarolToken << "\n";
  ASSERT_EQ(std::rename(tmp.c_str(), dir_->File("tokens.txt").c_str()), 0);
  ASSERT_EQ(kill(server_->process().pid(), SIGHUP), 0);
  absl::Status status = absl::UnknownError("not tried");
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up && !status.ok()) {
    status = carol->ListContexts(Short()).status();
    if (!status.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(bob_->ListContexts(Short()).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(alice_->ListContexts(Short()).ok());
  // A broken file is refused and the tokens in force stay.
  std::ofstream(tmp) << "carol\n";
  ASSERT_EQ(std::rename(tmp.c_str(), dir_->File("tokens.txt").c_str()), 0);
  ASSERT_EQ(kill(server_->process().pid(), SIGHUP), 0);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until && !absl::StrContains(server_->Log(), "tokens in force stay")) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(absl::StrContains(server_->Log(), "line 1: expected NAME TOKEN")) << server_->Log();
  EXPECT_TRUE(carol->ListContexts(Short()).ok());
  EXPECT_TRUE(server_->process().Running());
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
  const std::vector<std::string> tls = {"--ca-cert", Cert("ca.pem"), "--client-cert",
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
  CommandResult no_cert =
      RunLogged("attnctl", ATTNCTL_BINARY,
                {"health", "--server", "localhost:" + port, "--ca-cert", Cert("ca.pem"),
                 "--timeout", "3s", "--max-attempts", "1"},
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
    std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics-listen=",
                                     "--backend=cpu"};
    args.insert(args.end(), flags.begin(), flags.end());
    CommandResult r = RunLogged("attnserve", ATTNSERVE_BINARY, args, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 1) << flags[0];
    EXPECT_TRUE(absl::StrContains(r.output, message)) << r.output;
  }
}

}  // namespace
}  // namespace attnserve::testing
