// The page-locked host memory of the CUDA backend (core/cuda/pinned_host_pool.h) and the promise
// it serves: a request whose buffers come from the device's host memory is copied without a
// single pageable byte, and still equals the float64 reference.
#include "core/cuda/pinned_host_pool.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/host_copy.h"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::QkvInputs;

constexpr size_t kMiB = size_t{1} << 20;

TEST(PinnedHostPoolTest, SizeClassesBoundTheSlack) {
  EXPECT_EQ(PinnedHostPool::SizeClass(1), 2 * kMiB);
  EXPECT_EQ(PinnedHostPool::SizeClass(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(PinnedHostPool::SizeClass(2 * kMiB + 1), 4 * kMiB);
  for (size_t bytes : {33 * kMiB, 100 * kMiB, 1000 * kMiB, 2048 * kMiB, 3333 * kMiB}) {
    const size_t cls = PinnedHostPool::SizeClass(bytes);
    EXPECT_GE(cls, bytes);
    EXPECT_LE(static_cast<double>(cls), 1.25 * static_cast<double>(bytes)) << bytes;
    EXPECT_EQ(PinnedHostPool::SizeClass(cls), cls) << "a class is its own class";
  }
}

TEST(PinnedHostPoolTest, BlocksArePageLockedAndReused) {
  SKIP_WITHOUT_GPU();
  PinnedHostPool pool(int64_t{64} << 20);
  void* a = pool.Allocate(3 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(IsPageLocked(a));
  EXPECT_EQ(pool.stats().in_use_bytes, static_cast<int64_t>(4 * kMiB));
  pool.Free(a, 3 * kMiB);
  EXPECT_EQ(pool.stats().cached_bytes, static_cast<int64_t>(4 * kMiB));
  void* b = pool.Allocate(4 * kMiB);  // same class: the cached block, no new page-locking
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.stats().allocations, 1);
  pool.Free(b, 4 * kMiB);
  pool.Trim();
  EXPECT_EQ(pool.stats().cached_bytes, 0);
}

TEST(PinnedHostPoolTest, PastTheCapBlocksArePageableAndCounted) {
  SKIP_WITHOUT_GPU();
  PinnedHostPool pool(int64_t{6} << 20);
  void* pinned = pool.Allocate(4 * kMiB);
  ASSERT_NE(pinned, nullptr);
  void* over = pool.Allocate(4 * kMiB);  // 8 MiB in use would pass the 6 MiB cap
  ASSERT_NE(over, nullptr);
  EXPECT_TRUE(IsPageLocked(pinned));
  EXPECT_FALSE(IsPageLocked(over));
  EXPECT_EQ(pool.stats().fallback_bytes, static_cast<int64_t>(4 * kMiB));
  std::memset(over, 0x5A, 4 * kMiB);
  pool.Free(over, 4 * kMiB);
  pool.Free(pinned, 4 * kMiB);
  // Cached blocks make room for a new one within the cap.
  void* again = pool.Allocate(6 * kMiB);
  EXPECT_TRUE(IsPageLocked(again));
  EXPECT_LE(pool.stats().in_use_bytes + pool.stats().cached_bytes, int64_t{6} << 20);
  pool.Free(again, 6 * kMiB);
}

TEST(PinnedHostPoolTest, RegisteredCallerMemoryIsPageLockedUntilUnregistered) {
  SKIP_WITHOUT_GPU();
  PinnedHostPool pool;
  const size_t bytes = 8 * kMiB;
  void* mem = std::aligned_alloc(4096, bytes);
  ASSERT_NE(mem, nullptr);
  EXPECT_FALSE(IsPageLocked(mem));
  ASSERT_TRUE(pool.Register(mem, bytes).ok());
  EXPECT_TRUE(IsPageLocked(mem));
  EXPECT_EQ(pool.stats().registered_bytes, static_cast<int64_t>(bytes));
  pool.Unregister(mem);
  EXPECT_FALSE(IsPageLocked(mem));
  EXPECT_EQ(pool.stats().registered_bytes, 0);
  std::free(mem);
}

// Copies `in` into tensors from `memory` (the server's request buffers come from there).
QkvInputs CopyInto(const QkvInputs& in, HostMemory* memory) {
  auto copy = [&](const HostTensor& t) {
    HostTensor out = *HostTensor::Create(t.dtype(), t.dims(), nullptr, memory);
    std::memcpy(out.data(), t.data(), t.nbytes());
    return out;
  };
  return QkvInputs{copy(in.q), copy(in.k), copy(in.v)};
}

// Poisons cached blocks of the output sizes, so an output the device forgets to write fails.
void PoisonPoolBlocks(HostMemory& memory, size_t o_bytes, size_t lse_bytes) {
  void* o = memory.Allocate(o_bytes);
  void* lse = memory.Allocate(lse_bytes);
  std::memset(o, 0xFF, o_bytes);
  std::memset(lse, 0xFF, lse_bytes);
  memory.Free(o, o_bytes);
  memory.Free(lse, lse_bytes);
}

TEST(PinnedRequestPathTest, PageLockedRequestCopiesNoPageableByteAndMatchesReference) {
  SKIP_WITHOUT_GPU();
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  Device& device = *(*made)[0];
  EXPECT_TRUE(device.host_memory().page_locked());
  const AttentionShape shape{1, 1000, 8, 2, 128};  // GQA, N not a multiple of the block
  AttentionSpec spec;
  spec.causal = true;
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QkvInputs plain = MakeRandomInputs(shape, DType::kBF16, seed);
  const QkvInputs locked = CopyInto(plain, &device.host_memory());
  auto ref = ReferenceAttention(spec, plain.q, plain.k, plain.v);
  ASSERT_TRUE(ref.ok()) << ref.status();

  PoisonPoolBlocks(device.host_memory(), plain.q.nbytes(), shape.q_heads * shape.tokens * 4);
  const DeviceStats before = device.Stats();
  RunInfo info;
  auto out = device.Run(spec, locked.q, locked.k, locked.v, RunControl{}, &info);
  ASSERT_TRUE(out.ok()) << out.status();
  const DeviceStats after = device.Stats();
  EXPECT_EQ(after.pageable_copy_bytes - before.pageable_copy_bytes, 0);
  const int64_t in_bytes = static_cast<int64_t>(plain.q.nbytes() + plain.k.nbytes() +
                                                plain.v.nbytes());
  EXPECT_EQ(after.copy_h2d_bytes - before.copy_h2d_bytes, in_bytes);
  EXPECT_EQ(after.copy_d2h_bytes - before.copy_d2h_bytes,
            static_cast<int64_t>(out->o.nbytes() + out->lse.nbytes()));
  EXPECT_TRUE(out->o.page_locked());
  EXPECT_GT(info.kernel_seconds, 0);
  EXPECT_GT(info.copy_seconds, 0);
  EXPECT_LE(info.copy_seconds + info.kernel_seconds, info.compute_seconds * 1.01);
  EXPECT_EQ(info.copy_bytes, in_bytes + static_cast<int64_t>(out->o.nbytes() + out->lse.nbytes()));

  double max_ref = 0, max_err = 0, max_lse = 0;
  for (int64_t i = 0; i < out->o.numel(); ++i) {
    const double r = ref->o[i];
    const double g = out->o.GetFloat(i);
    ASSERT_TRUE(std::isfinite(g)) << "O[" << i << "] not written";
    max_ref = std::max(max_ref, std::abs(r));
    max_err = std::max(max_err, std::abs(g - r));
  }
  for (int64_t i = 0; i < out->lse.numel(); ++i) {
    max_lse = std::max(max_lse, std::abs(out->lse.GetFloat(i) - ref->lse[i]));
  }
  EXPECT_LE(max_err / max_ref, 1e-2);
  EXPECT_LE(max_lse, 2e-3);

  // RunInto: the copies back land in the caller's (page-locked, poisoned) memory directly.
  AttentionOutputs into;
  into.o = *HostTensor::Create(DType::kBF16, out->o.dims(), nullptr, &device.host_memory());
  into.lse = *HostTensor::Create(DType::kF32, out->lse.dims(), nullptr, &device.host_memory());
  into.o.FillBytes(0xFF);
  into.lse.FillBytes(0xFF);
  const DeviceStats before_into = device.Stats();
  ASSERT_TRUE(device.RunInto(spec, locked.q, locked.k, locked.v, RunControl{}, nullptr, into).ok());
  EXPECT_EQ(device.Stats().pageable_copy_bytes - before_into.pageable_copy_bytes, 0);
  EXPECT_EQ(std::memcmp(into.o.data(), out->o.data(), out->o.nbytes()), 0)
      << "RunInto wrote what Run returned";
  EXPECT_EQ(std::memcmp(into.lse.data(), out->lse.data(), out->lse.nbytes()), 0);

  // The same request from pageable memory: the counter sees exactly the inputs (the outputs
  // are the device's own page-locked buffers).
  const DeviceStats before2 = device.Stats();
  auto out2 = device.Run(spec, plain.q, plain.k, plain.v, RunControl{}, nullptr);
  ASSERT_TRUE(out2.ok()) << out2.status();
  EXPECT_EQ(device.Stats().pageable_copy_bytes - before2.pageable_copy_bytes, in_bytes);
}

}  // namespace
}  // namespace attnserve
