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
    ContextConfig c;
    c.name = name;
    c.dtype = DType::kBF16;
    c.kv_heads = kHeads;
    c.head_dim = kDim;
    c.capacity_tokens = capacity;
    return c;
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

TEST_F(ContextStoreTest, LimitsAnswerWithTheirCodes) {
  auto store = MakeStore(/*budget=*/64 * kRowBytes, /*initial=*/4);
  EXPECT_EQ(store->CreateContext("", Config("bad name")).status().code(),
            absl::StatusCode::kInvalidArgument);
  ContextConfig heads = Config("h");
  heads.kv_heads = 0;
  EXPECT_NE(store->CreateContext("", heads).status().message().find("kv_heads"),
            std::string::npos);
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

}  // namespace
}  // namespace attnserve
