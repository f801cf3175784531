// Shared-memory regions end to end over the real server (CPU backend, loopback): requests whose
// Q/K/V and O/LSE live in a POSIX shm object equal the float64 reference; every misuse is refused
// with the field named and the next request works; a region unregistered while a request uses it
// stays mapped until the request ends; a caller that dies with its region registered leaves the
// server working.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/attn_client.h"
#include "client/shared_memory_region.h"
#include "gtest/gtest.h"
#include "tests/integration/server_fixture.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;
using client::AttendInput;
using client::AttendResult;
using client::SharedMemoryRegion;
using client::TensorRegion;

// Where q, k, v, o and lse sit in one region (each 64-byte aligned).
struct Layout {
  int64_t q = 0, k = 0, v = 0, o = 0, lse = 0, total = 0;
  int64_t q_bytes = 0, kv_bytes = 0, lse_bytes = 0;
};

Layout LayoutFor(const Problem& p) {
  Layout l;
  l.q_bytes = static_cast<int64_t>(p.q.nbytes());
  l.kv_bytes = static_cast<int64_t>(p.k.nbytes());
  l.lse_bytes = p.q.dim(0) * p.q.dim(1) * p.q.dim(2) * 4;
  l.k = client::AlignRegionOffset(l.q + l.q_bytes);
  l.v = client::AlignRegionOffset(l.k + l.kv_bytes);
  l.o = client::AlignRegionOffset(l.v + l.kv_bytes);
  l.lse = client::AlignRegionOffset(l.o + l.q_bytes);
  l.total = l.lse + l.lse_bytes;
  return l;
}

// Copies the problem's inputs into `shm` and poisons the output slots (0xFF: NaN).
void Fill(const Problem& p, const Layout& l, SharedMemoryRegion& shm) {
  std::memcpy(shm.data() + l.q, p.q.data(), l.q_bytes);
  std::memcpy(shm.data() + l.k, p.k.data(), l.kv_bytes);
  std::memcpy(shm.data() + l.v, p.v.data(), l.kv_bytes);
  std::memset(shm.data() + l.o, 0xFF, l.q_bytes);
  std::memset(shm.data() + l.lse, 0xFF, l.lse_bytes);
}

// A request of `p` reading everything from region `name` and writing O/LSE there.
AttendInput RegionInput(const Problem& p, const Layout& l, const std::string& name) {
  AttendInput in;
  in.shape = AttentionShape{p.q.dim(0), p.q.dim(1), p.q.dim(2), p.k.dim(2), p.q.dim(3)};
  in.dtype = p.q.dtype();
  in.spec = p.spec;
  in.q_region = TensorRegion{name, l.q, l.q_bytes};
  in.k_region = TensorRegion{name, l.k, l.kv_bytes};
  in.v_region = TensorRegion{name, l.v, l.kv_bytes};
  in.o_region = TensorRegion{name, l.o, l.q_bytes};
  in.lse_region = TensorRegion{name, l.lse, l.lse_bytes};
  return in;
}

// The outputs read back from the region, as an AttendResult for CheckResult.
AttendResult ReadBack(const Problem& p, const Layout& l, const SharedMemoryRegion& shm,
                      const AttendResult& r) {
  AttendResult out;
  out.header = r.header;
  out.o = *HostTensor::Create(p.q.dtype(), p.q.dims());
  std::memcpy(out.o.data(), shm.data() + l.o, l.q_bytes);
  HostTensor lse = *HostTensor::Create(DType::kF32, {p.q.dim(0), p.q.dim(2), p.q.dim(1)});
  std::memcpy(lse.data(), shm.data() + l.lse, l.lse_bytes);
  out.lse = std::move(lse);
  return out;
}

class ShmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options;
    options.extra_args = {"--cpu-workers=1", "--max-regions=8"};
    auto server = ServerProcess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    client_ = server_->NewClient();
  }
  void TearDown() override {
    // Every test leaves no region behind.
    auto list = client_->ListRegions();
    ASSERT_TRUE(list.ok()) << list.status();
    for (const auto& r : list->regions()) (void)client_->UnregisterRegion(r.name());
  }

  // A small problem through region `name` of a fresh shm object: checked against the reference.
  void ExpectGoodRequest(const std::string& tag) {
    SCOPED_TRACE(tag);
    const uint64_t seed = FreshSeed();
    auto p = MakeProblem(DType::kF32, 1, 130, 4, 2, 64, SpecFromJson(R"({"dense": {}})"), seed);
    ASSERT_TRUE(p.ok());
    const Layout l = LayoutFor(*p);
    auto shm = SharedMemoryRegion::Create(l.total);
    ASSERT_TRUE(shm.ok()) << shm.status();
    Fill(*p, l, **shm);
    const std::string name = absl::StrCat("good_", tag);
    ASSERT_TRUE(client_->RegisterSystemRegion(name, (*shm)->key(), 0, l.total).ok());
    auto r = client_->Attend(RegionInput(*p, l, name));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->header.outputs_in_regions());
    EXPECT_TRUE(CheckResult(*p, ReadBack(*p, l, **shm, *r), 1e-5, 1e-4).ok());
    ASSERT_TRUE(client_->UnregisterRegion(name).ok());
  }

  static ServerProcess* server_;
  std::unique_ptr<client::AttnClient> client_;
};
ServerProcess* ShmTest::server_ = nullptr;

TEST_F(ShmTest, RegionRequestsMatchTheReference) {
  struct Case {
    DType dtype;
    std::string spec;
    int64_t hq, hkv;
  };
  for (const Case& c :
       {Case{DType::kF32, R"({"dense": {}, "causal": true})", 4, 2},
        Case{DType::kBF16, R"({"window": {"size": 40}})", 4, 4},
        Case{DType::kF32, R"({"blockSparse": {"blockSize": 64, "localWindow": {"width": 1}}})", 2,
             1}}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat(c.spec, " seed ", seed));
    auto p = MakeProblem(c.dtype, 2, 300, c.hq, c.hkv, 64, SpecFromJson(c.spec), seed);
    ASSERT_TRUE(p.ok());
    const Layout l = LayoutFor(*p);
    auto shm = SharedMemoryRegion::Create(l.total + 4096);
    ASSERT_TRUE(shm.ok()) << shm.status();
    // The region starts 4096 bytes into the object: offsets are relative to the region.
    Fill(*p, l, **shm);
    std::memmove((*shm)->data() + 4096, (*shm)->data(), l.total);
    auto reg = client_->RegisterSystemRegion("io", (*shm)->key(), 4096, l.total);
    ASSERT_TRUE(reg.ok()) << reg.status();
    auto r = client_->Attend(RegionInput(*p, l, "io"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->header.outputs_in_regions());
    EXPECT_TRUE(r->o.empty());
    EXPECT_FALSE(r->lse.has_value());
    EXPECT_EQ(r->header.o_bytes(), l.q_bytes);
    EXPECT_EQ(r->header.lse_bytes(), l.lse_bytes);
    EXPECT_LT(r->header.receive_seconds(), 0.5);
    std::memmove((*shm)->data(), (*shm)->data() + 4096, l.total);
    absl::Status s =
        CheckResult(*p, ReadBack(*p, l, **shm, *r), OTolerance(c.dtype), LseTolerance(c.dtype));
    EXPECT_TRUE(s.ok()) << s;
    auto un = client_->UnregisterRegion("io");
    ASSERT_TRUE(un.ok()) << un.status();
    EXPECT_FALSE(un->in_use());
  }
}

// A context's rows appended from a region (two appends, the second checked by expect_tokens):
// the server copies them, so the attends after the region is unregistered and overwritten still
// equal the float64 reference of the whole problem.
TEST_F(ShmTest, ContextRowsAppendedFromARegion) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  auto p = MakeProblem(DType::kBF16, 1, 300, 4, 2, 64,
                       SpecFromJson(R"({"dense": {}, "causal": true})"), seed);
  ASSERT_TRUE(p.ok());
  const Layout l = LayoutFor(*p);
  auto shm = SharedMemoryRegion::Create(l.total);
  ASSERT_TRUE(shm.ok()) << shm.status();
  Fill(*p, l, **shm);
  ASSERT_TRUE(client_->RegisterSystemRegion("rows", (*shm)->key(), 0, l.total).ok());
  ASSERT_TRUE(client_->CreateContext("from_region", DType::kBF16, 2, 64).ok());
  const int64_t row_bytes = 2 * 64 * 2, first = 128;  // 128 rows: slices stay 64-byte aligned
  auto a = client_->AppendContextFromRegions(
      "from_region", first, TensorRegion{"rows", l.k, first * row_bytes},
      TensorRegion{"rows", l.v, first * row_bytes}, /*expect_tokens=*/0);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = client_->AppendContextFromRegions(
      "from_region", 300 - first,
      TensorRegion{"rows", l.k + first * row_bytes, (300 - first) * row_bytes},
      TensorRegion{"rows", l.v + first * row_bytes, (300 - first) * row_bytes}, first);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->tokens(), 300);
  // A slice of the wrong size is refused naming the field.
  auto bad = client_->AppendContextFromRegions("from_region", 1, TensorRegion{"rows", l.k, 64},
                                               TensorRegion{"rows", l.v, row_bytes});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("header.k_region"), std::string::npos) << bad.status();
  ASSERT_TRUE(client_->UnregisterRegion("rows").ok());
  std::memset((*shm)->data() + l.k, 0x7F, 2 * l.kv_bytes);  // the context holds its own copy
  AttendInput in;
  in.q = &p->q;
  in.spec = p->spec;
  in.context = "from_region";
  in.shape = AttentionShape{1, 300, 4, 2, 64};
  auto r = client_->Attend(in);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::Status s = CheckResult(*p, *r, OTolerance(DType::kBF16), LseTolerance(DType::kBF16));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(client_->DeleteContext("from_region").ok());
}

// Q from a region, K and V streamed, outputs streamed back.
TEST_F(ShmTest, MixedRegionAndChunks) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  auto p = MakeProblem(DType::kF32, 1, 257, 4, 2, 64, SpecFromJson(R"({"dense": {}})"), seed);
  ASSERT_TRUE(p.ok());
  const Layout l = LayoutFor(*p);
  auto shm = SharedMemoryRegion::Create(l.total);
  ASSERT_TRUE(shm.ok());
  Fill(*p, l, **shm);
  ASSERT_TRUE(client_->RegisterSystemRegion("q_only", (*shm)->key(), 0, l.total).ok());
  AttendInput in = AttendInputFor(*p);
  in.q = nullptr;
  in.q_region = TensorRegion{"q_only", l.q, l.q_bytes};
  in.shape = AttentionShape{1, 257, 4, 2, 64};
  auto r = client_->Attend(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->header.outputs_in_regions());
  EXPECT_TRUE(CheckResult(*p, *r, 1e-5, 1e-4).ok());
}

TEST_F(ShmTest, MisuseIsRefusedAndTheNextRequestWorks) {
  auto p = MakeProblem(DType::kF32, 1, 128, 2, 2, 64, SpecFromJson(R"({"dense": {}})"), 7);
  ASSERT_TRUE(p.ok());
  const Layout l = LayoutFor(*p);
  auto shm = SharedMemoryRegion::Create(l.total + 8192);
  ASSERT_TRUE(shm.ok());
  Fill(*p, l, **shm);
  ASSERT_TRUE(client_->RegisterSystemRegion("m", (*shm)->key(), 0, l.total).ok());
  ASSERT_TRUE(client_->RegisterSystemRegion("small", (*shm)->key(), 0, l.q_bytes / 2).ok());
  struct Misuse {
    std::string name;
    std::function<void(AttendInput&)> edit;
    absl::StatusCode code;
    std::string text;
  };
  const std::vector<Misuse> cases = {
      {"region_too_small", [&](AttendInput& in) { in.q_region->region = "small"; },
       absl::StatusCode::kInvalidArgument,
       absl::StrCat("header.q_region: offset 0 + ", l.q_bytes, " bytes exceeds region 'small'")},
      {"offset_past_end", [&](AttendInput& in) { in.v_region->offset = l.total; },
       absl::StatusCode::kInvalidArgument, "header.v_region: offset"},
      {"misaligned", [&](AttendInput& in) { in.k_region->offset += 4; },
       absl::StatusCode::kInvalidArgument, "header.k_region: offset"},
      {"wrong_bytes", [&](AttendInput& in) { in.q_region->bytes -= 64; },
       absl::StatusCode::kInvalidArgument, "header.q_region: bytes"},
      {"unknown_region", [&](AttendInput& in) { in.o_region->region = "nope"; },
       absl::StatusCode::kNotFound, "header.o_region: no region named 'nope'"},
      {"lse_missing", [&](AttendInput& in) { in.lse_region.reset(); },
       absl::StatusCode::kInvalidArgument, "header.lse_region"},
      {"lse_wrong_bytes", [&](AttendInput& in) { in.lse_region->bytes = 64; },
       absl::StatusCode::kInvalidArgument, "header.lse_region: bytes 64"},
  };
  for (const Misuse& m : cases) {
    SCOPED_TRACE(m.name);
    AttendInput in = RegionInput(*p, l, "m");
    m.edit(in);
    auto r = client_->Attend(in);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), m.code) << r.status();
    EXPECT_NE(r.status().message().find(m.text), std::string::npos) << r.status();
    ExpectGoodRequest(m.name);
  }
  // Registration misuse.
  auto dup = client_->RegisterSystemRegion("m", (*shm)->key(), 0, 64);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists) << dup.status();
  ExpectGoodRequest("duplicate");
  auto big = client_->RegisterSystemRegion("big", (*shm)->key(), 0, (*shm)->bytes() + 1);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  auto missing = client_->RegisterSystemRegion("gone", "/attn_no_such_shm_object", 0, 64);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  auto ipc = client_->RegisterCudaIpcRegion("gpu", std::string(64, '\0'), 0, 1024);
  EXPECT_EQ(ipc.status().code(), absl::StatusCode::kFailedPrecondition) << ipc.status();
  EXPECT_NE(ipc.status().message().find("CUDA IPC regions need the CUDA backend"),
            std::string::npos);
  EXPECT_EQ(client_->UnregisterRegion("nope").status().code(), absl::StatusCode::kNotFound);
  // --max-regions=8: two are registered here.
  std::vector<std::string> names;
  absl::Status limit;
  for (int i = 0; i < 8 && limit.ok(); ++i) {
    auto r = client_->RegisterSystemRegion(absl::StrCat("fill", i), (*shm)->key(), 0, 64);
    limit = r.status();
  }
  EXPECT_EQ(limit.code(), absl::StatusCode::kResourceExhausted) << limit;
  EXPECT_TRUE(client_->UnregisterRegion("fill0").ok());
  ExpectGoodRequest("after_limit");
}

// Unregistered while the request is queued or running: the request completes correctly, later
// requests are refused, and the memory is unmapped once it ends.
TEST_F(ShmTest, UnregisterWhileInUse) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  auto p = MakeProblem(DType::kF32, 1, 3072, 8, 8, 64, SpecFromJson(R"({"dense": {}})"), seed);
  ASSERT_TRUE(p.ok());
  const Layout l = LayoutFor(*p);
  auto shm = SharedMemoryRegion::Create(l.total);
  ASSERT_TRUE(shm.ok());
  Fill(*p, l, **shm);
  ASSERT_TRUE(client_->RegisterSystemRegion("busy", (*shm)->key(), 0, l.total).ok());
  absl::StatusOr<AttendResult> result;
  std::thread request([&] { result = client_->Attend(RegionInput(*p, l, "busy")); });
  // Wait until the request holds its lease.
  bool leased = false;
  for (int i = 0; i < 2000 && !leased; ++i) {
    auto list = client_->ListRegions();
    ASSERT_TRUE(list.ok());
    leased = list->regions_size() == 1 && list->regions(0).leases() > 0;
    if (!leased) absl::SleepFor(absl::Milliseconds(1));
  }
  auto un = client_->UnregisterRegion("busy");
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_TRUE(leased);
  EXPECT_TRUE(un->in_use());
  if (un->in_use()) {
    auto refused = client_->Attend(RegionInput(*p, l, "busy"));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(refused.status().message().find("region busy is being unregistered"),
              std::string::npos)
        << refused.status();
  }
  request.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(CheckResult(*p, ReadBack(*p, l, **shm, *result), 1e-5, 1e-4).ok());
  // Unmapped after the call ended (the reactor releases its leases as it finishes).
  double mapped = -1;
  for (int i = 0; i < 200 && mapped != 0; ++i) {
    auto text = server_->ScrapeMetrics();
    ASSERT_TRUE(text.ok());
    mapped = MetricSum(*text, "attnserve_regions").value_or(-1);
    if (mapped != 0) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(mapped, 0);
  EXPECT_EQ(client_->ListRegions()->regions_size(), 0);
  ExpectGoodRequest("after_unregister");
}

// The child half of CallerDiesWithARegion: registers a region and is killed.
TEST(ShmChild, RegisterAndDie) {
  const char* target = std::getenv("ATTN_SHM_CHILD_TARGET");
  if (target == nullptr) GTEST_SKIP() << "only run by CallerDiesWithARegion";
  client::ClientOptions options;
  options.target = target;
  options.max_attempts = 1;
  auto c = client::AttnClient::Create(options);
  ASSERT_TRUE(c.ok());
  auto shm = SharedMemoryRegion::Create(1 << 20, std::getenv("ATTN_SHM_CHILD_KEY"));
  ASSERT_TRUE(shm.ok()) << shm.status();
  std::memset((*shm)->data(), 0, 1 << 20);
  ASSERT_TRUE((*c)->RegisterSystemRegion("orphan", (*shm)->key(), 0, 1 << 20).ok());
  raise(SIGKILL);  // no unregister, no unlink, no unmap
}

TEST_F(ShmTest, CallerDiesWithARegion) {
  const std::string key = absl::StrCat("/attn_orphan_", getpid());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A fresh process image: gRPC does not survive fork, exec does.
    setenv("ATTN_SHM_CHILD_TARGET", server_->target().c_str(), 1);
    setenv("ATTN_SHM_CHILD_KEY", key.c_str(), 1);
    execl("/proc/self/exe", "shm_child", "--gtest_filter=ShmChild.RegisterAndDie",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  auto list = client_->ListRegions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->regions_size(), 1);
  EXPECT_EQ(list->regions(0).name(), "orphan");
  ExpectGoodRequest("orphan_present");
  auto un = client_->UnregisterRegion("orphan");
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_FALSE(un->in_use());
  shm_unlink(key.c_str());
  EXPECT_TRUE(server_->Running());
  ExpectGoodRequest("orphan_gone");
}

}  // namespace
}  // namespace attnserve::testing
