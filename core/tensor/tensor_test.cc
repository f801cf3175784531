#include "core/tensor/tensor.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHostTensorAlignment == 0; }

// Keys default to the query count; kv_tokens sets another (decode, chunked prefill).
TEST(AttentionShapeTest, KvLenDefaultsToTokens) {
  AttentionShape s{2, 128, 8, 2, 64};
  EXPECT_EQ(s.kv_tokens, 0);
  EXPECT_EQ(s.kv_len(), 128);
  s.kv_tokens = 4097;
  EXPECT_EQ(s.kv_len(), 4097);
  EXPECT_EQ(s.tokens, 128);
}

TEST(HostTensorTest, CreateSetsShapeAndSize) {
  auto t = HostTensor::Create(DType::kBF16, {1, 8192, 16, 128});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kBF16);
  EXPECT_EQ(t->rank(), 4);
  EXPECT_EQ(t->dim(1), 8192);
  EXPECT_EQ(t->numel(), 1 * 8192 * 16 * 128);
  EXPECT_EQ(t->nbytes(), 8192u * 16 * 128 * 2);
  EXPECT_FALSE(t->empty());
  EXPECT_EQ(t->DebugString(), "[1, 8192, 16, 128] bf16");
}

TEST(HostTensorTest, BuffersAre64ByteAligned) {
  std::vector<HostTensor> keep;  // held together so that the allocator cannot reuse one block
  for (DType dtype : kAllDTypes) {
    for (int64_t n : {1, 3, 7, 63, 64, 65, 1000, 4097}) {
      auto t = HostTensor::Create(dtype, {n});
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_TRUE(IsAligned(t->data())) << t->DebugString();
      keep.push_back(*std::move(t));
    }
  }
}

TEST(HostTensorTest, ScalarAndZeroSizedTensors) {
  auto scalar = HostTensor::Create(DType::kF32, {});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(scalar->DebugString(), "[] f32");
  scalar->SetFloat(0, 2.5f);
  EXPECT_EQ(scalar->GetFloat(0), 2.5f);

  MemoryTracker tracker;
  auto zero = HostTensor::Create(DType::kF16, {4, 0, 1 << 30}, &tracker);
  ASSERT_TRUE(zero.ok()) << zero.status();  // a zero dim means no overflow, whatever the others
  EXPECT_EQ(zero->numel(), 0);
  EXPECT_EQ(zero->nbytes(), 0u);
  EXPECT_FALSE(zero->empty());  // a valid tensor, unlike a default-constructed one
  EXPECT_TRUE(IsAligned(zero->data()));
  EXPECT_EQ(tracker.in_use_bytes(), 0);
  zero->FillBytes(0xff);
  zero->ToFloat32(nullptr);

  HostTensor none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.numel(), 0);
}

TEST(HostTensorTest, NegativeDimIsInvalidArgument) {
  auto t = HostTensor::Create(DType::kF32, {2, -1, 3});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("[2, -1, 3] f32"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("dim 1 is -1"));
}

TEST(HostTensorTest, AllocationFailureIsResourceExhausted) {
  MemoryTracker tracker;
  // 4 PB: fits in int64 but not in any address space, so the allocation itself fails.
  auto t = HostTensor::Create(DType::kF32, {1000000000000, 8, 128}, &tracker);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("tensor [1000000000000, 8, 128] f32: 4096000000000000 bytes exceeds"));
  EXPECT_EQ(tracker.in_use_bytes(), 0);
  EXPECT_EQ(tracker.peak_bytes(), 0);
}

TEST(HostTensorTest, SizeOverflowIsResourceExhausted) {
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40},
        std::vector<int64_t>{int64_t{1} << 62, 2},  // numel fits, bytes do not
        std::vector<int64_t>{3, int64_t{1} << 62, 5, 7}}) {
    auto t = HostTensor::Create(DType::kF32, dims);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("overflow"));
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("] f32:"));
  }
}

TEST(MemoryTrackerTest, CountsInUseAndPeak) {
  MemoryTracker tracker;
  {
    auto a = HostTensor::Create(DType::kF32, {10, 10}, &tracker);  // 400 bytes
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(tracker.in_use_bytes(), 400);
    {
      auto b = HostTensor::Create(DType::kBF16, {3, 5}, &tracker);  // 30 bytes
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(tracker.in_use_bytes(), 430);
      EXPECT_EQ(tracker.peak_bytes(), 430);
    }
    EXPECT_EQ(tracker.in_use_bytes(), 400);
    EXPECT_EQ(tracker.peak_bytes(), 430);  // peak remembers
    tracker.ResetPeak();
    EXPECT_EQ(tracker.peak_bytes(), 400);
  }
  EXPECT_EQ(tracker.in_use_bytes(), 0);
  EXPECT_EQ(tracker.peak_bytes(), 400);
  // An untracked tensor touches no tracker.
  auto untracked = HostTensor::Create(DType::kF32, {100});
  ASSERT_TRUE(untracked.ok());
  EXPECT_EQ(tracker.in_use_bytes(), 0);
}

TEST(MemoryTrackerTest, PeakIsExactUnderContention) {
  MemoryTracker tracker;
  constexpr int kThreads = 4;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&tracker] {
      for (int j = 0; j < kIters; ++j) {
        tracker.Allocate(8);
        tracker.Free(8);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(tracker.in_use_bytes(), 0);
  EXPECT_GE(tracker.peak_bytes(), 8);
  EXPECT_LE(tracker.peak_bytes(), 8 * kThreads);
  // One big allocation after the storm must be seen as the peak, not lost to a stale CAS.
  tracker.Allocate(1000);
  EXPECT_EQ(tracker.peak_bytes(), 1000);
  tracker.Free(1000);
}

TEST(HostTensorTest, MoveConstructTransfersOwnershipAndCharge) {
  MemoryTracker tracker;
  auto made = HostTensor::Create(DType::kF16, {2, 3}, &tracker);
  ASSERT_TRUE(made.ok());
  HostTensor a = *std::move(made);
  a.SetFloat(5, 1.5f);
  const std::byte* p = a.data();
  HostTensor b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(a.numel(), 0);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.GetFloat(5), 1.5f);
  EXPECT_EQ(tracker.in_use_bytes(), 12);  // charged once, not twice
  { HostTensor sink(std::move(b)); }
  EXPECT_EQ(tracker.in_use_bytes(), 0);
}

TEST(HostTensorTest, MoveAssignFreesTheOldBuffer) {
  MemoryTracker t1, t2;
  HostTensor a = *HostTensor::Create(DType::kF32, {100}, &t1);
  HostTensor b = *HostTensor::Create(DType::kF32, {10}, &t2);
  EXPECT_EQ(t1.in_use_bytes(), 400);
  EXPECT_EQ(t2.in_use_bytes(), 40);
  a = std::move(b);  // a's old buffer goes back to t1; a now carries t2's charge
  EXPECT_EQ(t1.in_use_bytes(), 0);
  EXPECT_EQ(t2.in_use_bytes(), 40);
  EXPECT_EQ(a.numel(), 10);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  HostTensor& self = a;
  a = std::move(self);  // self-move leaves it intact
  EXPECT_EQ(a.numel(), 10);
  EXPECT_EQ(t2.in_use_bytes(), 40);
  a = HostTensor();
  EXPECT_EQ(t2.in_use_bytes(), 0);
}

TEST(HostTensorTest, GetSetFloatRoundToDType) {
  const float x = 1.0f + 0x1p-9f + 0x1p-12f;  // needs 12 mantissa bits
  for (DType dtype : kAllDTypes) {
    auto t = HostTensor::Create(dtype, {4});
    ASSERT_TRUE(t.ok());
    t->SetFloat(2, x);
    EXPECT_EQ(t->GetFloat(2), RoundToDType(x, dtype)) << DTypeName(dtype);
    t->SetFloat(3, -0.25f);
    EXPECT_EQ(t->GetFloat(3), -0.25f);
  }
  auto h = HostTensor::Create(DType::kF16, {1});
  h->SetFloat(0, 1.0f);
  EXPECT_EQ(h->data_as<uint16_t>()[0], 0x3c00);
}

TEST(HostTensorTest, ToAndFromFloat32MatchScalarConversions) {
  for (DType dtype : kAllDTypes) {
    // Odd lengths exercise the SIMD tails.
    for (int64_t n : {1, 7, 8, 9, 1023}) {
      std::vector<float> in(n);
      for (int64_t i = 0; i < n; ++i) in[i] = std::sin(0.37f * i) * 1000.0f + 0x1p-20f * i;
      auto t = HostTensor::Create(dtype, {n});
      ASSERT_TRUE(t.ok());
      t->FromFloat32(in.data());
      std::vector<float> out(n, -7.0f);
      t->ToFloat32(out.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], RoundToDType(in[i], dtype)) << DTypeName(dtype) << " i=" << i;
        ASSERT_EQ(t->GetFloat(i), out[i]);
      }
    }
  }
}

TEST(HostTensorTest, FillBytesFfIsNanInEveryDType) {
  for (DType dtype : kAllDTypes) {
    auto t = HostTensor::Create(dtype, {33});
    ASSERT_TRUE(t.ok());
    t->FillBytes(0xff);
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isnan(t->GetFloat(i)));
    t->FillBytes(0);
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->GetFloat(i), 0.0f);
  }
}

TEST(FillUniformTest, DeterministicInRangeAndRoundedToDType) {
  for (DType dtype : kAllDTypes) {
    auto a = HostTensor::Create(dtype, {3, 5000});
    auto b = HostTensor::Create(dtype, {3, 5000});
    auto c = HostTensor::Create(dtype, {3, 5000});
    FillUniform(*a, 42, -2.0f, 3.0f);
    FillUniform(*b, 42, -2.0f, 3.0f);
    FillUniform(*c, 43, -2.0f, 3.0f);
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0) << "same seed, same bytes";
    EXPECT_NE(std::memcmp(a->data(), c->data(), a->nbytes()), 0) << "seeds must matter";
    double sum = 0;
    for (int64_t i = 0; i < a->numel(); ++i) {
      const float v = a->GetFloat(i);
      ASSERT_GE(v, -2.0f);
      ASSERT_LE(v, 3.0f);  // rounding to a 16-bit dtype may reach hi itself
      if (dtype == DType::kF32) {
        ASSERT_LT(v, 3.0f);
      }
      ASSERT_EQ(RoundToDType(v, dtype), v);
      sum += v;
    }
    EXPECT_NEAR(sum / a->numel(), 0.5, 0.05) << DTypeName(dtype);
  }
}

TEST(FillUniformTest, ValuesArePinnedAcrossPlatforms) {
  // splitmix64 outputs for seed 0 are published (e.g. in Vigna's reference code):
  // 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, ...; the top 24 bits give u = k * 2^-24.
  auto t = HostTensor::Create(DType::kF32, {2});
  FillUniform(*t, 0, 0.0f, 1.0f);
  EXPECT_EQ(t->GetFloat(0), static_cast<float>(0xe220a8u) * 0x1p-24f);
  EXPECT_EQ(t->GetFloat(1), static_cast<float>(0x6e789eu) * 0x1p-24f);
  // The value of element i does not depend on the tensor's size or chunking.
  auto big = HostTensor::Create(DType::kF32, {10000});
  auto small = HostTensor::Create(DType::kF32, {5000});
  FillUniform(*big, 7);
  FillUniform(*small, 7);
  EXPECT_EQ(std::memcmp(big->data(), small->data(), small->nbytes()), 0);
}

// A HostMemory that records what it hands out and takes back.
class CountingHostMemory final : public HostMemory {
 public:
  void* Allocate(size_t bytes) override {
    ++allocations;
    allocated_bytes += bytes;
    return plain_.Allocate(bytes);
  }
  void Free(void* p, size_t bytes) override {
    ++frees;
    freed_bytes += bytes;
    plain_.Free(p, bytes);
  }
  absl::Status Register(void*, size_t) override { return absl::OkStatus(); }
  void Unregister(void*) override {}
  bool page_locked() const override { return true; }

  int allocations = 0, frees = 0;
  size_t allocated_bytes = 0, freed_bytes = 0;

 private:
  PlainHostMemory plain_;
};

TEST(HostTensorTest, HostMemorySuppliesAndTakesBackTheBytes) {
  CountingHostMemory memory;
  MemoryTracker tracker;
  {
    auto t = HostTensor::Create(DType::kBF16, {3, 5, 7}, &tracker, &memory);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->page_locked());
    EXPECT_FALSE(t->is_view());
    EXPECT_TRUE(IsAligned(t->data()));
    EXPECT_EQ(memory.allocations, 1);
    EXPECT_GE(memory.allocated_bytes, t->nbytes());
    EXPECT_EQ(tracker.in_use_bytes(), static_cast<int64_t>(t->nbytes()));
    HostTensor moved = *std::move(t);  // the deleter travels with the buffer
    EXPECT_EQ(memory.frees, 0);
  }
  EXPECT_EQ(memory.frees, 1);
  EXPECT_EQ(memory.freed_bytes, memory.allocated_bytes);
  EXPECT_EQ(tracker.in_use_bytes(), 0);
  auto plain = HostTensor::Create(DType::kF32, {4});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->page_locked());
}

TEST(HostTensorTest, WrapViewsMemoryItDoesNotOwnAndKeepsTheOwnerAlive) {
  auto backing = std::make_shared<std::vector<float>>(64 + 16);
  // 64-byte aligned start inside the vector.
  auto* base = reinterpret_cast<std::byte*>(backing->data());
  std::byte* aligned = base + (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  const size_t available = backing->size() * sizeof(float) - static_cast<size_t>(aligned - base);
  std::weak_ptr<std::vector<float>> watch = backing;
  {
    auto view = HostTensor::Wrap(DType::kF32, {2, 8}, aligned, available, backing);
    backing.reset();
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(view->is_view());
    EXPECT_EQ(view->data(), aligned);
    view->SetFloat(3, 2.5f);
    EXPECT_EQ(reinterpret_cast<float*>(aligned)[3], 2.5f);
    EXPECT_FALSE(watch.expired());  // the view holds the owner
  }
  EXPECT_TRUE(watch.expired());
}

TEST(HostTensorTest, WrapRefusesTooLittleMemoryAndMisalignedData) {
  alignas(64) static std::byte buffer[256];
  auto too_big = HostTensor::Wrap(DType::kF32, {65}, buffer, 256, nullptr);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(), HasSubstr("needs 260 bytes, only 256 available"));
  auto misaligned = HostTensor::Wrap(DType::kF32, {4}, buffer + 4, 252, nullptr);
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(misaligned.status().message(), HasSubstr("aligned"));
  EXPECT_EQ(HostTensor::Wrap(DType::kF32, {-1}, buffer, 256, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve
