// The region registry on real POSIX shared memory: registration checks, leases that keep an
// unregistered region mapped, limits, totals, release at shutdown, and CUDA IPC without CUDA.
#include "server/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/regions/region_refs.h"

namespace attnserve {
namespace {

// A shm object of `bytes` bytes, unlinked on destruction.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes) {
    static std::atomic<int> counter{0};
    key_ = absl::StrCat("/attn_reg_test_", getpid(), "_", counter.fetch_add(1));
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    close(fd);
  }
  ~ShmObject() { shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }
  void Resize(int64_t bytes) {
    const int fd = shm_open(key_.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, bytes), 0);
    close(fd);
  }

 private:
  std::string key_;
};

TEST(RegionRegistryTest, RegisterListUnregister) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(1 << 20);
  auto info = registry->RegisterSystem("", "in", shm.key(), 4096, 8192);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes, 8192);
  EXPECT_EQ(info->offset, 4096);
  EXPECT_EQ(info->shm_key, shm.key());
  EXPECT_EQ(info->kind, RegionKind::kSystem);
  EXPECT_FALSE(info->page_locked);  // no HostMemory given
  std::vector<RegionInfo> list = registry->List("");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "in");
  EXPECT_EQ(registry->Totals().regions[0], 1);
  EXPECT_EQ(registry->Totals().bytes[0], 8192);

  auto out = registry->Unregister("", "in");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->in_use);
  EXPECT_TRUE(registry->List("").empty());
  EXPECT_EQ(registry->Totals().regions[0], 0);
  EXPECT_EQ(registry->Unregister("", "in").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry->Acquire("", "in").status().code(), absl::StatusCode::kNotFound);
}

TEST(RegionRegistryTest, RegionsAreScopedToTheirOwner) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(8192);
  ASSERT_TRUE(registry->RegisterSystem("alice", "r", shm.key(), 0, 4096).ok());
  EXPECT_EQ(registry->List("alice").size(), 1u);
  EXPECT_TRUE(registry->List("bob").empty());
  EXPECT_TRUE(registry->List("").empty());
  EXPECT_EQ(registry->Acquire("bob", "r").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry->Unregister("bob", "r").status().code(), absl::StatusCode::kNotFound);
  // Each owner has its own names: bob's "r" is another region, and alice's stays hers.
  absl::StatusOr<RegionInfo> bobs = registry->RegisterSystem("bob", "r", shm.key(), 4096, 64);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_EQ(registry->List("bob").size(), 1u);
  EXPECT_EQ(registry->List("bob")[0].bytes, 64);
  EXPECT_EQ(registry->List("alice")[0].bytes, 4096);
  EXPECT_EQ(registry->RegisterSystem("alice", "r", shm.key(), 0, 64).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry->Acquire("alice", "r").ok());
  EXPECT_TRUE(registry->Unregister("alice", "r").ok());
  EXPECT_EQ(registry->Acquire("alice", "r").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry->Acquire("bob", "r").ok());
  EXPECT_TRUE(registry->Unregister("bob", "r").ok());
}

TEST(RegionRegistryTest, WritesThroughTheMappingAreSeenByTheCaller) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(8192);
  ASSERT_TRUE(registry->RegisterSystem("", "r", shm.key(), 64, 4096).ok());
  auto lease = registry->Acquire("", "r");
  ASSERT_TRUE(lease.ok()) << lease.status();
  const char msg[] = "hello";
  ASSERT_TRUE((*lease)->CopyIn(0, msg, sizeof(msg)).ok());
  const int fd = shm_open(shm.key().c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  char back[sizeof(msg)] = {};
  ASSERT_EQ(pread(fd, back, sizeof(back), 64), static_cast<ssize_t>(sizeof(back)));
  close(fd);
  EXPECT_STREQ(back, "hello");
}

TEST(RegionRegistryTest, RegistrationErrorsNameTheField) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(4096);
  auto expect = [&](absl::StatusOr<RegionInfo> r, absl::StatusCode code, const std::string& text) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status();
  };
  expect(registry->RegisterSystem("", "big", shm.key(), 0, 8192),
         absl::StatusCode::kInvalidArgument, "system.bytes: offset 0 + 8192 bytes exceeds");
  expect(registry->RegisterSystem("", "past", shm.key(), 4096, 64),
         absl::StatusCode::kInvalidArgument, "exceeds shared memory object");
  expect(registry->RegisterSystem("", "odd", shm.key(), 32, 64),
         absl::StatusCode::kInvalidArgument, "system.offset");
  expect(registry->RegisterSystem("", "zero", shm.key(), 0, 0), absl::StatusCode::kInvalidArgument,
         "system.bytes: must be >= 1");
  expect(registry->RegisterSystem("", "none", "/attn_no_such_object_x", 0, 64),
         absl::StatusCode::kNotFound, "system.shm_key");
  expect(registry->RegisterSystem("", "slash", "no_slash", 0, 64),
         absl::StatusCode::kInvalidArgument, "system.shm_key");
  expect(registry->RegisterSystem("", "bad name!", shm.key(), 0, 64),
         absl::StatusCode::kInvalidArgument, "name:");
  expect(registry->RegisterSystem("", "", shm.key(), 0, 64), absl::StatusCode::kInvalidArgument,
         "name:");
  ASSERT_TRUE(registry->RegisterSystem("", "a", shm.key(), 0, 64).ok());
  expect(registry->RegisterSystem("", "a", shm.key(), 0, 64), absl::StatusCode::kAlreadyExists,
         "already registered");
  EXPECT_EQ(registry->List("").size(), 1u);  // failed registrations leave nothing behind
}

TEST(RegionRegistryTest, LeaseKeepsAnUnregisteredRegionMapped) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(4096);
  ASSERT_TRUE(registry->RegisterSystem("", "r", shm.key(), 0, 4096).ok());
  auto lease = registry->Acquire("", "r");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(registry->List("")[0].leases, 1);
  auto out = registry->Unregister("", "r");
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->in_use);
  EXPECT_EQ(out->leases, 1);
  // New requests are refused; the name stays taken; the memory stays mapped and usable.
  auto again = registry->Acquire("", "r");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("region r is being unregistered"), std::string::npos);
  EXPECT_EQ(registry->RegisterSystem("", "r", shm.key(), 0, 64).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry->Unregister("", "r").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(registry->List("").size(), 1u);
  EXPECT_TRUE(registry->List("")[0].closing);
  std::memset((*lease)->host_data(), 7, 4096);
  EXPECT_EQ(registry->Totals().regions[0], 1);
  lease->reset();  // the last lease: unmapped now
  EXPECT_EQ(registry->Totals().regions[0], 0);
  EXPECT_TRUE(registry->List("").empty());
  EXPECT_TRUE(registry->RegisterSystem("", "r", shm.key(), 0, 64).ok());
}

TEST(RegionRegistryTest, MaxRegions) {
  RegionRegistryOptions options;
  options.max_regions = 2;
  auto registry = MakeRegionRegistry(options);
  ShmObject shm(4096);
  ASSERT_TRUE(registry->RegisterSystem("", "a", shm.key(), 0, 64).ok());
  ASSERT_TRUE(registry->RegisterSystem("", "b", shm.key(), 64, 64).ok());
  auto c = registry->RegisterSystem("", "c", shm.key(), 0, 64);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max-regions=2"), std::string::npos) << c.status();
  ASSERT_TRUE(registry->Unregister("", "a").ok());
  EXPECT_TRUE(registry->RegisterSystem("", "c", shm.key(), 0, 64).ok());
}

TEST(RegionRegistryTest, ReleaseAllKeepsLeasedMemoryUntilReleased) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(8192);
  ASSERT_TRUE(registry->RegisterSystem("", "a", shm.key(), 0, 4096).ok());
  ASSERT_TRUE(registry->RegisterSystem("", "b", shm.key(), 4096, 4096).ok());
  auto lease = registry->Acquire("", "a");
  ASSERT_TRUE(lease.ok());
  registry->ReleaseAll();
  EXPECT_EQ(registry->Totals().regions[0], 1);  // "a" is still leased
  EXPECT_EQ(registry->Acquire("", "b").status().code(), absl::StatusCode::kNotFound);
  std::memset((*lease)->host_data(), 1, 4096);
  registry.reset();  // the lease outlives the registry
  std::memset((*lease)->host_data(), 2, 4096);
  lease->reset();
}

TEST(RegionRegistryTest, ShrunkObjectIsRefusedInsteadOfFaulting) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(8192);
  ASSERT_TRUE(registry->RegisterSystem("", "r", shm.key(), 0, 8192).ok());
  shm.Resize(4096);
  auto lease = registry->Acquire("", "r");
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kFailedPrecondition) << lease.status();
  EXPECT_TRUE(registry->Unregister("", "r").ok());
}

TEST(RegionRegistryTest, ConcurrentLeasesAndUnregister) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(1 << 16);
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(registry->RegisterSystem("", "r", shm.key(), 0, 1 << 16).ok());
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 50; ++i) {
          auto lease = registry->Acquire("", "r");
          if (lease.ok()) std::memset((*lease)->host_data(), i, 1 << 16);
        }
      });
    }
    (void)registry->Unregister("", "r");
    for (auto& t : threads) t.join();
    EXPECT_EQ(registry->Totals().regions[0], 0);
    EXPECT_TRUE(registry->List("").empty());
  }
}

TEST(RegionRefsTest, BoundsAreCheckedAndNamed) {
  auto registry = MakeRegionRegistry({});
  ShmObject shm(8192);
  ASSERT_TRUE(registry->RegisterSystem("", "in", shm.key(), 0, 8192).ok());
  auto check = [&](int64_t offset, int64_t bytes, int64_t want, const std::string& text) {
    v1::RegionRef ref;
    ref.set_region("in");
    ref.set_offset(offset);
    ref.set_bytes(bytes);
    auto s = ResolveRegionRef(registry.get(), "", ref, "header.q_region", want, "q [..] f32");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    EXPECT_NE(s.status().message().find(text), std::string::npos) << s.status();
  };
  check(4096, 8192, 8192, "header.q_region: offset 4096 + 8192 bytes exceeds region 'in' of 8192");
  check(-64, 64, 64, "header.q_region: offset -64 must be >= 0");
  check(32, 64, 64, "multiple of 64");
  check(0, 100, 128, "header.q_region: bytes 100 != 128, the size of q");
  v1::RegionRef ref;
  ref.set_region("nope");
  ref.set_bytes(64);
  auto missing = ResolveRegionRef(registry.get(), "", ref, "header.k_region", 64, "k");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("header.k_region: no region named 'nope'"),
            std::string::npos);
  ref.set_region("in");
  auto ok = ResolveRegionRef(registry.get(), "", ref, "header.k_region", 64, "k");
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto t = TensorFromSlice(*ok, DType::kF32, {16}, nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->is_view());
}

TEST(RegionRegistryTest, CudaIpcNeedsTheCudaBackend) {
  auto registry = MakeRegionRegistry({});
  auto r = registry->RegisterCudaIpc("", "gpu", std::string(64, '\0'), 0, 1024);
  ASSERT_FALSE(r.ok());
  // A CUDA build without a GPU refuses the device; a CPU build refuses the kind.
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kFailedPrecondition ||
              r.status().code() == absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_TRUE(registry->List("").empty());
}

}  // namespace
}  // namespace attnserve
