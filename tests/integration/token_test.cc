// Bearer tokens against the real attnserve binary (plaintext: the token rules do not depend on
// the transport): missing and wrong tokens, each per-principal limit, ownership of contexts and
// regions, SIGHUP reload of the token file.
#include "tests/integration/security_support.h"

namespace attnserve::testing {
namespace {

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
    if (server_ != nullptr) {
      EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
    }
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
  EXPECT_TRUE(absl::StrContains(region.status().message(), "max_resident_bytes"))
      << region.status();
  // Bob has no limit; once alice deletes hers, her second fits.
  EXPECT_TRUE(
      bob_->CreateContext("b1", DType::kF32, 1, 64, 128, absl::ZeroDuration(), Short()).ok());
  ASSERT_TRUE(alice_->DeleteContext("c1", Short()).ok());
  EXPECT_TRUE(
      alice_->CreateContext("c2", DType::kF32, 1, 64, 128, absl::ZeroDuration(), Short()).ok());
}

TEST_F(TokenTest, ContextsAndRegionsBelongToTheirPrincipal) {
  ASSERT_TRUE(
      alice_->CreateContext("mine", DType::kF32, 2, 64, 64, absl::ZeroDuration(), Short()).ok());
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
  // Bob's own "mine" is another context: names are per principal.
  absl::StatusOr<v1::ContextStatus> bobs_mine =
      bob_->CreateContext("mine", DType::kF32, 2, 64, 32, absl::ZeroDuration(), Short());
  ASSERT_TRUE(bobs_mine.ok()) << bobs_mine.status();
  EXPECT_EQ(bobs_mine->capacity_tokens(), 32);
  absl::StatusOr<v1::ContextStatus> alices_mine = alice_->GetContext("mine", Short());
  ASSERT_TRUE(alices_mine.ok());
  EXPECT_EQ(alices_mine->capacity_tokens(), 64);

  absl::StatusOr<std::unique_ptr<client::SharedMemoryRegion>> shm =
      client::SharedMemoryRegion::Create(4096);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(bob_->RegisterSystemRegion("bobs", (*shm)->key(), 0, 4096, Short()).ok());
  absl::StatusOr<v1::ListRegionsResponse> alices = alice_->ListRegions(Short());
  ASSERT_TRUE(alices.ok());
  EXPECT_EQ(alices->regions_size(), 0);
  EXPECT_EQ(alice_->UnregisterRegion("bobs", Short()).status().code(), absl::StatusCode::kNotFound);
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

}  // namespace
}  // namespace attnserve::testing
