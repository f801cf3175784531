// Runs whose tensors are already in the GPU's memory (Device::RunWithDeviceIo: what a CUDA IPC
// region named by a request becomes): inputs read in place, outputs written in place, no byte
// crossing the bus for them, and the same results as the float64 reference.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_device.h"
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

// cudaMalloc'ed memory standing in for a caller's region: `owner` frees it with the last view.
DeviceTensorView DeviceCopy(const HostTensor* t, DType dtype, std::vector<int64_t> dims,
                            int poison_byte = -1) {
  DeviceTensorView v;
  v.cuda_ordinal = 0;
  v.dtype = dtype;
  v.dims = std::move(dims);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, static_cast<size_t>(v.nbytes())), cudaSuccess);
  if (t != nullptr) {
    EXPECT_EQ(cudaMemcpy(p, t->data(), t->nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  } else if (poison_byte >= 0) {
    EXPECT_EQ(cudaMemset(p, poison_byte, static_cast<size_t>(v.nbytes())), cudaSuccess);
  }
  v.data = static_cast<std::byte*>(p);
  v.owner = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  return v;
}

HostTensor ToHost(const DeviceTensorView& v) {
  HostTensor t = *HostTensor::Create(v.dtype, v.dims);
  EXPECT_EQ(cudaMemcpy(t.data(), v.data, t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return t;
}

void ExpectMatches(const ReferenceResult& ref, const HostTensor& o, const HostTensor* lse,
                   DType dtype) {
  const ErrorStats e = CompareToReference(ref, o, lse);
  EXPECT_EQ(e.nonfinite, 0) << "an output element was not written";
  // As the other GPU tests: f32 inputs are computed in bf16 (rounded on the device), so their
  // bounds are bf16's input rounding, not f32's.
  const bool f32 = dtype == DType::kF32;
  EXPECT_LE(e.o_rel, dtype == DType::kF16 ? 5e-3 : (f32 ? testing::kF32InputOTolerance : 1e-2));
  if (lse != nullptr) EXPECT_LE(e.lse_max_abs, f32 ? testing::kF32InputLseTolerance : 2e-3);
}

struct Case {
  const char* name;
  AttentionSpec spec;
  DType dtype;
};

std::vector<Case> Cases() {
  AttentionSpec causal;
  causal.causal = true;
  AttentionSpec sparse;
  sparse.pattern = BlockSparseSpec{128, LocalWindowGen{1}};
  AttentionSpec window;
  window.pattern = WindowSpec{200};
  return {{"dense_causal_bf16", causal, DType::kBF16},
          {"block_sparse_bf16", sparse, DType::kBF16},
          {"window_f16", window, DType::kF16},
          {"dense_causal_f32", causal, DType::kF32}};
}

TEST(DeviceIoTest, EverythingInPlaceCopiesNothingAndMatchesReference) {
  SKIP_WITHOUT_GPU();
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  Device& device = *(*made)[0];
  ASSERT_EQ(device.cuda_ordinal(), 0);
  const AttentionShape shape{2, 1000, 8, 2, 128};
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat("seed=", seed));
    const QkvInputs in = MakeRandomInputs(shape, c.dtype, seed);
    auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    DeviceIo io;
    io.q = DeviceCopy(&in.q, c.dtype, in.q.dims());
    io.k = DeviceCopy(&in.k, c.dtype, in.k.dims());
    io.v = DeviceCopy(&in.v, c.dtype, in.v.dims());
    io.o = DeviceCopy(nullptr, c.dtype, in.q.dims(), 0xFF);
    io.lse = DeviceCopy(nullptr, DType::kF32, {shape.batch, shape.q_heads, shape.tokens}, 0xFF);
    const DeviceStats before = device.Stats();
    RunInfo info;
    auto out = device.RunWithDeviceIo(c.spec, shape, c.dtype, HostTensor(), HostTensor(),
                                      HostTensor(), io, RunControl{}, &info, nullptr);
    ASSERT_TRUE(out.ok()) << out.status();
    const DeviceStats after = device.Stats();
    EXPECT_EQ(after.copy_h2d_bytes, before.copy_h2d_bytes) << "an input was copied in";
    EXPECT_EQ(after.copy_d2h_bytes, before.copy_d2h_bytes) << "an output was copied back";
    EXPECT_EQ(info.copy_bytes, 0);
    EXPECT_TRUE(out->o.empty());
    EXPECT_TRUE(out->lse.empty());
    EXPECT_GT(info.kernel_seconds, 0);
    const HostTensor o = ToHost(io.o);
    const HostTensor lse = ToHost(io.lse);
    ExpectMatches(*ref, o, &lse, c.dtype);
  }
}

TEST(DeviceIoTest, MixedHostAndDeviceTensors) {
  SKIP_WITHOUT_GPU();
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  Device& device = *(*made)[0];
  const AttentionShape shape{1, 777, 4, 4, 64};
  AttentionSpec spec;
  spec.causal = true;
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QkvInputs in = MakeRandomInputs(shape, DType::kBF16, seed);
  auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();

  // Q from the host, K and V in place; O and LSE returned in host memory.
  DeviceIo io;
  io.k = DeviceCopy(&in.k, DType::kBF16, in.k.dims());
  io.v = DeviceCopy(&in.v, DType::kBF16, in.v.dims());
  const DeviceStats before = device.Stats();
  RunInfo info;
  auto out = device.RunWithDeviceIo(spec, shape, DType::kBF16, in.q, HostTensor(), HostTensor(),
                                    io, RunControl{}, &info, nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(device.Stats().copy_h2d_bytes - before.copy_h2d_bytes,
            static_cast<int64_t>(in.q.nbytes()));
  ExpectMatches(*ref, out->o, &out->lse, DType::kBF16);

  // Everything in place but LSE not asked for (no view, no host destination): O only.
  DeviceIo io2;
  io2.q = DeviceCopy(&in.q, DType::kBF16, in.q.dims());
  io2.k = io.k;
  io2.v = io.v;
  io2.o = DeviceCopy(nullptr, DType::kBF16, in.q.dims(), 0xFF);
  const DeviceStats before2 = device.Stats();
  auto out2 = device.RunWithDeviceIo(spec, shape, DType::kBF16, HostTensor(), HostTensor(),
                                     HostTensor(), io2, RunControl{}, nullptr, nullptr);
  ASSERT_TRUE(out2.ok()) << out2.status();
  EXPECT_EQ(device.Stats().copy_d2h_bytes, before2.copy_d2h_bytes);
  ExpectMatches(*ref, ToHost(io2.o), nullptr, DType::kBF16);

  // O in place, LSE into the caller's host memory (a shared-memory region).
  DeviceIo io3 = io2;
  io3.o = DeviceCopy(nullptr, DType::kBF16, in.q.dims(), 0xFF);
  AttentionOutputs into;
  into.lse = testing::PoisonedLse(shape);
  auto out3 = device.RunWithDeviceIo(spec, shape, DType::kBF16, HostTensor(), HostTensor(),
                                     HostTensor(), io3, RunControl{}, nullptr, &into);
  ASSERT_TRUE(out3.ok()) << out3.status();
  ExpectMatches(*ref, ToHost(io3.o), &into.lse, DType::kBF16);
}

TEST(DeviceIoTest, AViewOfTheWrongShapeOrGpuIsRefused) {
  SKIP_WITHOUT_GPU();
  auto made = MakeCudaDevices({0});
  ASSERT_TRUE(made.ok()) << made.status();
  Device& device = *(*made)[0];
  const AttentionShape shape{1, 256, 2, 2, 64};
  const QkvInputs in = MakeRandomInputs(shape, DType::kBF16, FreshSeed());
  DeviceIo io;
  io.q = DeviceCopy(&in.q, DType::kBF16, in.q.dims());
  io.k = DeviceCopy(nullptr, DType::kBF16, {1, 128, 2, 64}, 0x11);  // half the tokens
  io.v = DeviceCopy(&in.v, DType::kBF16, in.v.dims());
  auto out = device.RunWithDeviceIo(AttentionSpec{}, shape, DType::kBF16, HostTensor(),
                                    HostTensor(), HostTensor(), io, RunControl{}, nullptr, nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal) << out.status();
  io.k = DeviceCopy(&in.k, DType::kBF16, in.k.dims());
  io.v.cuda_ordinal = 1;  // a view the assembler would never hand to cuda:0
  out = device.RunWithDeviceIo(AttentionSpec{}, shape, DType::kBF16, HostTensor(), HostTensor(),
                               HostTensor(), io, RunControl{}, nullptr, nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("cuda:1"), std::string::npos) << out.status();
}

}  // namespace
}  // namespace attnserve
