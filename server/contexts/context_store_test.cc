// The context store on a CPU device: rows appended in pieces read back exactly, growth keeps the
// rows and the views taken before it, limits answer with the right codes, memory goes back to
// zero, expiry spares contexts in use, and racing appends never interleave.
#include "server/contexts/context_store.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "core/cpu/cpu_device.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

constexpr int64_t kHeads = 2, kDim = 8;
constexpr int64_t kRowBytes = kHeads * kDim * 2;  // bf16

// `rows` rows whose every byte is `fill + row` (mod 256), so a row's origin can be read back.
std::vector<uint8_t> Rows(int64_t rows, int fill) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * kRowBytes));
  for (int64_t r = 0; r < rows; ++r) {
    std::memset(out.data() + r * kRowBytes, (fill + r) & 0xFF, kRowBytes);
  }
  return out;
}

ContextConfig ShardTestConfig(const std::string& name, int64_t capacity = 0) {
  ContextConfig c;
  c.name = name;
  c.dtype = DType::kBF16;
  c.kv_heads = kHeads;
  c.head_dim = kDim;
  c.capacity_tokens = capacity;
  return c;
}

class ContextStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { device_ = MakeCpuDevice(0, 1); }
  std::unique_ptr<ContextStore> MakeStore(int64_t budget, int64_t initial = 4) {
    ContextStoreOptions o;
    o.memory_budget_bytes = budget;
    o.initial_tokens = initial;
    o.sweep_interval = absl::ZeroDuration();
    return *ContextStore::Create(o, {device_.get()});
  }
  static ContextConfig Config(const std::string& name, int64_t capacity = 0) {
    return ShardTestConfig(name, capacity);
  }
  std::unique_ptr<Device> device_;
};

TEST_F(ContextStoreTest, AppendsInPiecesGrowAndReadBack) {
  auto store = MakeStore(1 << 20, /*initial=*/4);
  ASSERT_TRUE(store->CreateContext("", Config("c")).ok());
  const std::vector<uint8_t> k1 = Rows(3, 10), v1 = Rows(3, 100);
  ASSERT_TRUE(store->Append("", "c", 3, k1.data(), v1.data(), 0).ok());
  auto before_growth = store->Acquire("", "c");  // holds the 4-row storage
  ASSERT_TRUE(before_growth.ok());
  const std::vector<uint8_t> k2 = Rows(6, 50), v2 = Rows(6, 150);
  auto info = store->Append("", "c", 6, k2.data(), v2.data(), 3);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tokens, 9);
  EXPECT_GE(info->reserved_tokens, 9);
  auto view = store->Acquire("", "c");
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->tokens, 9);
  EXPECT_FALSE(view->on_device);
  EXPECT_EQ(std::memcmp(view->k_data, k1.data(), k1.size()), 0);
  EXPECT_EQ(std::memcmp(view->k_data + k1.size(), k2.data(), k2.size()), 0);
  EXPECT_EQ(std::memcmp(view->v_data + v1.size(), v2.data(), v2.size()), 0);
  // The view taken before the growth still reads its 3 rows.
  EXPECT_EQ(before_growth->tokens, 3);
  EXPECT_EQ(std::memcmp(before_growth->k_data, k1.data(), k1.size()), 0);
}

TEST_F(ContextStoreTest, EachOwnerHasItsOwnNames) {
  auto store = MakeStore(1 << 20);
  ASSERT_TRUE(store->CreateContext("alice", Config("c", 8)).ok());
  ASSERT_TRUE(store->CreateContext("bob", Config("c", 16)).ok());  // bob's own "c"
  EXPECT_EQ(store->CreateContext("alice", Config("c", 8)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Get("", "c").status().code(), absl::StatusCode::kNotFound);
  const std::vector<uint8_t> k = Rows(2, 1), v = Rows(2, 2);
  ASSERT_TRUE(store->Append("alice", "c", 2, k.data(), v.data(), 0).ok());
  EXPECT_EQ(store->Get("alice", "c")->tokens, 2);
  EXPECT_EQ(store->Get("bob", "c")->tokens, 0);
  EXPECT_EQ(store->Get("bob", "c")->config.capacity_tokens, 16);
  ASSERT_EQ(store->List("alice").size(), 1u);
  EXPECT_EQ(store->List("alice")[0].config.name, "c");
  ASSERT_TRUE(store->Delete("alice", "c").ok());
  absl::Status gone = store->Get("alice", "c").status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(gone.message()).find("(deleted)"), std::string::npos) << gone;
  // Alice's tombstone is hers: bob's "c" is still there, and unaffected.
  EXPECT_TRUE(store->Get("bob", "c").ok());
  EXPECT_EQ(store->Totals().contexts, 1);
}

TEST_F(ContextStoreTest, LimitsAnswerWithTheirCodes) {
  auto store = MakeStore(/*budget=*/64 * kRowBytes, /*initial=*/4);
  EXPECT_EQ(store->CreateContext("", Config("bad name")).status().code(),
            absl::StatusCode::kInvalidArgument);
  ContextConfig heads = Config("h");
  heads.kv_heads = 0;
  EXPECT_NE(store->CreateContext("", heads).status().message().find("kv_heads"), std::string::npos);
  ASSERT_TRUE(store->CreateContext("", Config("fixed", 4)).ok());
  EXPECT_EQ(store->CreateContext("", Config("fixed")).status().code(),
            absl::StatusCode::kAlreadyExists);
  const std::vector<uint8_t> rows = Rows(5, 1);
  auto past = store->Append("", "fixed", 5, rows.data(), rows.data(), std::nullopt);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
  EXPECT_NE(past.status().message().find("capacity"), std::string::npos);
  auto wrong = store->Append("", "fixed", 1, rows.data(), rows.data(), 2);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Get("", "fixed")->tokens, 0) << "a refused append adds nothing";
  // The budget (64 rows of K and V together = 32 rows per context's K+V): a growable context
  // grows until the budget says no.
  ASSERT_TRUE(store->CreateContext("", Config("grow")).ok());
  const std::vector<uint8_t> many = Rows(40, 1);
  EXPECT_EQ(store->Append("", "grow", 40, many.data(), many.data(), std::nullopt).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->CreateContext("", Config("huge", 1000)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Append("", "nope", 1, rows.data(), rows.data(), std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
}

// --max-contexts: one more is RESOURCE_EXHAUSTED naming the flag; a delete makes room again.
TEST_F(ContextStoreTest, MaxContextsBoundsHowManyAreHeld) {
  ContextStoreOptions o;
  o.memory_budget_bytes = 1 << 20;
  o.initial_tokens = 4;
  o.sweep_interval = absl::ZeroDuration();
  o.max_contexts = 2;
  auto store = *ContextStore::Create(o, {device_.get()});
  ASSERT_TRUE(store->CreateContext("", Config("a")).ok());
  ASSERT_TRUE(store->CreateContext("", Config("b")).ok());
  const absl::Status third = store->CreateContext("", Config("c")).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_NE(third.message().find("max-contexts"), std::string::npos) << third;
  ASSERT_TRUE(store->Delete("", "a").ok());
  EXPECT_TRUE(store->CreateContext("", Config("c")).ok());
}

TEST_F(ContextStoreTest, DeleteWhileInUseFreesWhenTheRequestEnds) {
  auto store = MakeStore(1 << 20);
  const int64_t base = device_->Stats().memory_used_bytes;
  ASSERT_TRUE(store->CreateContext("", Config("c", 16)).ok());
  EXPECT_GT(device_->Stats().memory_used_bytes, base) << "counted in the device's memory";
  auto view = store->Acquire("", "c");
  ASSERT_TRUE(view.ok());
  auto in_use = store->Delete("", "c");
  ASSERT_TRUE(in_use.ok());
  EXPECT_EQ(*in_use, 1);
  auto again = store->Acquire("", "c");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find("deleted"), std::string::npos) << again.status();
  EXPECT_GT(store->Totals().bytes[0], 0) << "the request still holds the memory";
  view->hold.reset();
  EXPECT_EQ(store->Totals().bytes[0], 0);
  EXPECT_EQ(store->Totals().contexts, 0);
  EXPECT_EQ(device_->Stats().memory_used_bytes, base);
}

TEST_F(ContextStoreTest, ExpirySparesContextsInUse) {
  auto store = MakeStore(1 << 20);
  ContextConfig a = Config("idle"), b = Config("busy");
  a.ttl = b.ttl = absl::Milliseconds(50);
  ASSERT_TRUE(store->CreateContext("", a).ok());
  ASSERT_TRUE(store->CreateContext("", b).ok());
  auto view = store->Acquire("", "busy");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(store->Sweep(absl::Now()), 0) << "nothing is idle for 50 ms yet";
  EXPECT_EQ(store->Sweep(absl::Now() + absl::Seconds(1)), 1);
  auto gone = store->Get("", "idle");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("expired"), std::string::npos) << gone.status();
  EXPECT_TRUE(store->Get("", "busy").ok());
  view->hold.reset();
  EXPECT_EQ(store->Sweep(absl::Now() + absl::Seconds(1)), 1);
}

TEST_F(ContextStoreTest, RacingAppendsNeverInterleave) {
  auto store = MakeStore(int64_t{1} << 24, /*initial=*/2);
  ASSERT_TRUE(store->CreateContext("", Config("c")).ok());
  constexpr int kPerThread = 20;
  constexpr int64_t kRows = 3;
  auto worker = [&](int id) {
    for (int i = 0; i < kPerThread; ++i) {
      const std::vector<uint8_t> k = Rows(kRows, id * 64 + i);  // first row tells the append
      ASSERT_TRUE(store->Append("", "c", kRows, k.data(), k.data(), std::nullopt).ok());
    }
  };
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  auto view = store->Acquire("", "c");
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->tokens, 2 * kPerThread * kRows);
  for (int64_t a = 0; a < 2 * kPerThread; ++a) {  // every append's rows are contiguous
    const uint8_t first = static_cast<uint8_t>(view->k_data[a * kRows * kRowBytes]);
    for (int64_t r = 1; r < kRows; ++r) {
      EXPECT_EQ(static_cast<uint8_t>(view->k_data[(a * kRows + r) * kRowBytes]),
                static_cast<uint8_t>(first + r))
          << "append " << a << " row " << r;
    }
  }
}

// Two devices, each with a share of 40 rows of K + V: contexts larger than a share are split.
class ShardedContextStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) devices_.push_back(MakeCpuDevice(i, 1));
  }
  std::unique_ptr<ContextStore> MakeStore(int64_t initial) {
    ContextStoreOptions o;
    o.memory_budget_bytes = 2 * 40 * 2 * kRowBytes;
    o.initial_tokens = initial;
    o.sweep_interval = absl::ZeroDuration();
    return *ContextStore::Create(o, {devices_[0].get(), devices_[1].get()});
  }
  // The context's rows as one buffer, read through the view's shards.
  static std::vector<uint8_t> ReadK(const ContextView& view) {
    std::vector<uint8_t> out;
    for (const ContextShardView& s : view.shards) {
      EXPECT_EQ(s.start, static_cast<int64_t>(out.size()) / kRowBytes) << "shards in row order";
      out.insert(out.end(), reinterpret_cast<const uint8_t*>(s.k_data),
                 reinterpret_cast<const uint8_t*>(s.k_data) + s.tokens * kRowBytes);
    }
    return out;
  }
  std::vector<std::unique_ptr<Device>> devices_;
};

TEST_F(ShardedContextStoreTest, FixedCapacityIsSplitAndAppendsCrossTheBoundary) {
  auto store = MakeStore(4);
  ContextConfig c = ShardTestConfig("c", 60);
  auto created = store->CreateContext("", c);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->shards.size(), 2u);
  EXPECT_EQ(created->device, "cpu:0,cpu:1");
  EXPECT_EQ(created->shards[0].reserved_tokens, 30);
  EXPECT_EQ(created->shards[1].start, 30);
  const std::vector<uint8_t> a = Rows(25, 1), b = Rows(20, 40);
  ASSERT_TRUE(store->Append("", "c", 25, a.data(), a.data(), 0).ok());
  auto info = store->Append("", "c", 20, b.data(), b.data(), 25);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->shards[0].tokens, 30);
  EXPECT_EQ(info->shards[1].tokens, 15);
  auto view = store->Acquire("", "c");
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(view->sharded());
  std::vector<uint8_t> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(ReadK(*view), want);
  EXPECT_GT(store->Totals().bytes[0], 0);
  EXPECT_GT(store->Totals().bytes[1], 0);
  // All or nothing: 16 more rows pass the capacity, none is added.
  const std::vector<uint8_t> more = Rows(16, 9);
  EXPECT_EQ(store->Append("", "c", 16, more.data(), more.data(), std::nullopt).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Get("", "c")->tokens, 45);
  view->hold.reset();
  ASSERT_TRUE(store->Delete("", "c").ok());
  EXPECT_EQ(store->Totals().bytes[0], 0);
  EXPECT_EQ(store->Totals().bytes[1], 0);
}

TEST_F(ShardedContextStoreTest, GrowableSpillsIntoTheNextDevice) {
  auto store = MakeStore(8);
  ASSERT_TRUE(store->CreateContext("", ShardTestConfig("g")).ok());
  std::vector<uint8_t> want;
  // 4 x 10 rows: a growth copies the rows into a storage twice as large while the old one is
  // still held, so one device's 40 rows hold 20 of a growable context; the rest spill.
  for (int i = 0; i < 4; ++i) {
    const std::vector<uint8_t> rows = Rows(10, 20 * i);
    auto info = store->Append("", "g", 10, rows.data(), rows.data(), 10 * i);
    ASSERT_TRUE(info.ok()) << "append " << i << ": " << info.status();
    want.insert(want.end(), rows.begin(), rows.end());
  }
  auto info = store->Get("", "g");
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->shards.size(), 2u);
  EXPECT_EQ(info->tokens, 40);
  EXPECT_EQ(info->shards[1].start, info->shards[0].reserved_tokens);
  auto view = store->Acquire("", "g");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(ReadK(*view), want);
  // shards = 1 never spills.
  ContextConfig one = ShardTestConfig("one");
  one.shards = 1;
  view->hold.reset();
  ASSERT_TRUE(store->Delete("", "g").ok());
  ASSERT_TRUE(store->CreateContext("", one).ok());
  const std::vector<uint8_t> big = Rows(50, 3);
  EXPECT_EQ(store->Append("", "one", 50, big.data(), big.data(), std::nullopt).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Get("", "one")->shards.size(), 1u);
  ASSERT_TRUE(store->Delete("", "one").ok());
  EXPECT_EQ(store->Totals().bytes[0], 0);
  EXPECT_EQ(store->Totals().bytes[1], 0);
}

}  // namespace
}  // namespace attnserve
