// A context split over two GPUs, end to end on loopback: a real grpc::Server on two CUDA devices
// holding the same rows twice, once split over both GPUs (shards = 2: each GPU attends Q to its
// rows in place, the root copies the other partial from its GPU and merges them) and once
// on one GPU (shards = 1). Decode steps (Nq 1..4, GQA, causal dense and window) and a 64-row chunk
// across the shard boundary must give the single-GPU result and match the float64 reference on
// fresh seeded inputs (the client's output buffers start as NaN bytes). Skips below 2 GPUs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cuda/cuda_device.h"
#include "core/parallel/context_parallel.h"
#include "core/reference/reference.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/grpc/service.h"
#include "server/grpc/service_test_support.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHkv = 2, kDim = 128;
constexpr int64_t kRowBytes = kHkv * kDim * 2;  // bf16
constexpr int64_t kRows = 5000;                 // the context

class ShardedContextGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPUS(2);
    absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices = MakeCudaDevices({0, 1});
    ASSERT_TRUE(devices.ok()) << devices.status();
    pool_ = *DevicePool::FromDevices(*std::move(devices));
    metrics_ = *Metrics::Create(MetricsOptions{.listen = ""}, pool_->devices());
    scheduler_ = *Scheduler::Create(SchedulerOptions{}, pool_.get(), metrics_.get(),
                                    MakeMultiDevicePlanner());
    ServiceOptions options;
    options.contexts.memory_budget_bytes = int64_t{1} << 30;
    service_ =
        *AttentionServiceImpl::Create(options, pool_.get(), scheduler_.get(), metrics_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    const uint64_t seed = std::random_device{}();
    seed_ = seed;
    for (HostTensor* t : {&k_, &v_}) *t = *HostTensor::Create(DType::kBF16, {1, kRows, kHkv, kDim});
    FillUniform(k_, seed + 1);
    FillUniform(v_, seed + 2);
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    scheduler_->Shutdown();
    server_.reset();
    service_.reset();
    scheduler_.reset();
    metrics_.reset();
    pool_.reset();
  }

  grpc::Status Create(const std::string& name, int64_t capacity, int shards,
                      v1::ContextStatus* out) {
    return service_testing::CreateBf16Context(stub_.get(), name, kHkv, kDim, capacity,
                                              /*ttl_s=*/0, shards, out);
  }

  grpc::Status Append(const std::string& name, int64_t from, int64_t n, v1::ContextStatus* out) {
    return service_testing::AppendContextRows(stub_.get(), name, k_, v_, from, n, from, out);
  }

  // One attend of `nq` query rows (hq query heads) against context `name`; checks the answer
  // against the reference over the context's first `rows` rows. `q_seed` varies the query.
  // Thread-safe (the fixture is read only).
  void ExpectAttendMatches(const std::string& name, int64_t rows, int64_t nq, int64_t hq,
                           std::optional<int64_t> q_offset, const std::string& spec_json,
                           AttentionOutputs* result = nullptr, uint64_t q_seed = 0) {
    SCOPED_TRACE(absl::StrCat("nq=", nq, " hq=", hq, " offset=", q_offset.value_or(-1), " ",
                              spec_json, " seed=", seed_, " q_seed=", q_seed));
    v1::AttendHeader h = service_testing::Header(v1::DTYPE_BF16, 1, nq, hq, kHkv, kDim, spec_json);
    h.set_return_lse(true);
    h.set_context(name);
    if (q_offset) h.set_q_offset(*q_offset);
    service_testing::Inputs in;  // Q alone: an attend against a context
    in.q = *HostTensor::Create(DType::kBF16, {1, nq, hq, kDim});
    FillUniform(in.q, seed_ + 100 + static_cast<uint64_t>(nq * 7 + hq) + 1000 * q_seed);
    // Q in one chunk; O and LSE come back into poisoned buffers.
    const service_testing::CallResult r =
        service_testing::Attend(stub_.get(), h, in, static_cast<int64_t>(in.q.nbytes()));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    std::optional<AttentionOutputs> out = service_testing::OutputsOf(h, r);
    ASSERT_TRUE(out.has_value());
    const v1::AttendResponseHeader& header = r.header;
    const bool split = name == "split";
    EXPECT_EQ(header.placement(), split ? v1::PLACEMENT_CONTEXT_PARALLEL : v1::PLACEMENT_SINGLE);
    EXPECT_EQ(header.devices_size(), split ? 2 : 1);
    AttentionSpec spec = *SpecFromProto(h.spec());
    spec.q_offset = q_offset.value_or(rows - nq);
    HostTensor k = *HostTensor::Create(DType::kBF16, {1, rows, kHkv, kDim});
    HostTensor v = *HostTensor::Create(DType::kBF16, {1, rows, kHkv, kDim});
    std::memcpy(k.data(), k_.data(), k.nbytes());
    std::memcpy(v.data(), v_.data(), v.nbytes());
    auto ref = ReferenceAttention(spec, in.q, k, v);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const ErrorStats e = CompareToReference(*ref, out->o, &out->lse);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.o_rel, ReferenceOTolerance(DType::kBF16));
    // The GPU kernels compute in bf16 with float32 accumulation: LSE within 2e-3 (as the other
    // GPU tests of bf16 inputs).
    EXPECT_LE(e.lse_max_abs, 2e-3);
    if (result != nullptr) *result = std::move(*out);
  }

  uint64_t seed_ = 0;
  HostTensor k_, v_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

// Rows [begin, begin + n) of a [1, N, H, D] tensor, as a tensor of their own.
HostTensor RowsOf(const HostTensor& t, int64_t begin, int64_t n) {
  HostTensor out = *HostTensor::Create(t.dtype(), {1, n, t.dim(2), t.dim(3)});
  const int64_t row = t.dim(2) * t.dim(3) * static_cast<int64_t>(DTypeSize(t.dtype()));
  std::memcpy(out.data(), t.data() + begin * row, static_cast<size_t>(n * row));
  return out;
}

// One GPU: each shard's request (PlanKeyShard: the query rows that may see the shard, positions
// shifted) through the CUDA plan, merged by LSE on the host, equals the whole request's
// reference. This is what every GPU of a sharded context computes.
TEST(KeyShardGpuTest, ShardPartialsOnOneGpuMergeToReference) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::FreshSeed();
  const struct {
    AttentionShape shape;
    int64_t q_offset;
    std::vector<int64_t> cuts;
  } cases[] = {{{1, 1, 16, 2, 128, 3000}, 2999, {1100}},
               {{1, 4, 8, 8, 64, 3000}, 2996, {700, 1800}},
               {{1, 64, 8, 2, 128, 2000}, 960, {1000}},
               {{1, 40, 4, 2, 64, 1000}, 1000, {500}}};
  const std::vector<std::pair<AttentionPattern, bool>> specs = {
      {DenseSpec{}, true}, {DenseSpec{}, false}, {WindowSpec{300}, true}};
  for (const auto& c : cases) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      const testing::QkvInputs in = testing::MakeRandomInputs(c.shape, dtype, seed);
      for (const auto& [pattern, causal] : specs) {
        AttentionSpec spec = testing::SpecOf(pattern, causal);
        spec.q_offset = c.q_offset;
        SCOPED_TRACE(absl::StrCat(std::string(PatternName(spec.pattern)), causal ? " causal" : "",
                                  " nq=", c.shape.tokens, " ", std::string(DTypeName(dtype)),
                                  " seed=", seed));
        auto whole = ReferenceAttention(spec, in.q, in.k, in.v);
        ASSERT_TRUE(whole.ok()) << whole.status();
        auto merger = KeyShardMerger::Create(c.shape);
        ASSERT_TRUE(merger.ok());
        std::vector<int64_t> bounds = {0};
        bounds.insert(bounds.end(), c.cuts.begin(), c.cuts.end());
        bounds.push_back(c.shape.kv_len());
        for (size_t s = 0; s + 1 < bounds.size(); ++s) {
          auto plan = PlanKeyShard(spec, c.shape, bounds[s], bounds[s + 1] - bounds[s]);
          ASSERT_TRUE(plan.ok()) << plan.status();
          if (plan->q_rows == 0) continue;
          const HostTensor q = RowsOf(in.q, plan->q_row0, plan->q_rows);
          const HostTensor k = RowsOf(in.k, bounds[s], bounds[s + 1] - bounds[s]);
          const HostTensor v = RowsOf(in.v, bounds[s], bounds[s + 1] - bounds[s]);
          auto part = testing::RunPlanOnGpu(plan->spec, q, k, v);
          ASSERT_TRUE(part.ok()) << "shard " << s << ": " << part.status();
          ASSERT_TRUE(
              (*merger)
                  ->Merge(plan->q_row0, AttentionOutputs{std::move(part->o), std::move(part->lse)})
                  .ok());
        }
        auto merged = (*merger)->Finish(dtype, nullptr);
        ASSERT_TRUE(merged.ok());
        const ErrorStats e = CompareToReference(*whole, merged->o, &merged->lse);
        EXPECT_EQ(e.nonfinite, 0);
        EXPECT_LE(e.o_rel, ReferenceOTolerance(DType::kBF16));  // computed in bf16 on GPUs
        // LSE: bf16 inputs 2e-3; f32 inputs are rounded to bf16 first (3e-2, as the other GPU
        // tests; measured 1.2e-3 on an H200).
        EXPECT_LE(e.lse_max_abs, dtype == DType::kF32 ? 3e-2 : 2e-3);
      }
    }
  }
}

TEST_F(ShardedContextGpuTest, DecodeEqualsOneGpuAndReference) {
  v1::ContextStatus st;
  ASSERT_TRUE(Create("split", kRows, 2, &st).ok());
  ASSERT_EQ(st.shards_size(), 2);
  EXPECT_EQ(st.shards(1).start(), kRows / 2);
  ASSERT_TRUE(Create("one", kRows, 1, &st).ok());
  ASSERT_EQ(st.shards_size(), 1);
  for (const char* name : {"split", "one"}) {
    ASSERT_TRUE(Append(name, 0, 2000, nullptr).ok());
    ASSERT_TRUE(Append(name, 2000, 1000, nullptr).ok());  // crosses row 2500
    ASSERT_TRUE(Append(name, 3000, 2000, nullptr).ok());
  }
  const struct {
    int64_t nq, hq;
    std::optional<int64_t> offset;
    const char* spec;
  } cases[] = {{1, 16, std::nullopt, R"({"dense": {}, "causal": true})"},
               {4, 8, std::nullopt, R"({"dense": {}, "causal": true})"},
               {2, 8, std::nullopt, R"({"window": {"size": "3000"}, "causal": true})"},
               {3, 2, std::nullopt, R"({"dense": {}})"},
               {64, 8, 2460, R"({"dense": {}, "causal": true})"},
               {64, 8, 2400, R"({"window": {"size": "256"}, "causal": true})"}};
  for (const auto& c : cases) {
    AttentionOutputs split, one;
    ExpectAttendMatches("split", kRows, c.nq, c.hq, c.offset, c.spec, &split);
    ExpectAttendMatches("one", kRows, c.nq, c.hq, c.offset, c.spec, &one);
    if (split.o.empty() || one.o.empty()) continue;
    SCOPED_TRACE(absl::StrCat("split vs one GPU: nq=", c.nq, " ", c.spec));
    // Both round O to bf16 once; the split one merges float32 partials of bf16 O.
    double o_max = 0, lse_max = 0;
    for (int64_t i = 0; i < split.o.numel(); ++i) {
      o_max = std::max<double>(o_max, std::abs(split.o.GetFloat(i) - one.o.GetFloat(i)));
    }
    for (int64_t i = 0; i < split.lse.numel(); ++i) {
      lse_max = std::max<double>(lse_max, std::abs(split.lse.GetFloat(i) - one.lse.GetFloat(i)));
    }
    EXPECT_LE(o_max, 2e-2);
    EXPECT_LE(lse_max, 1e-3);
  }
  for (const char* name : {"split", "one"}) {
    grpc::ClientContext ctx;
    v1::DeleteContextRequest req;
    req.set_name(name);
    v1::DeleteContextResponse resp;
    ASSERT_TRUE(stub_->DeleteContext(&ctx, req, &resp).ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (service_->active_calls() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::string text = metrics_->RenderText();
  for (int d = 0; d < 2; ++d) {
    EXPECT_THAT(text,
                HasSubstr(absl::StrCat("attnserve_context_bytes{device=\"cuda:", d, "\"} 0\n")));
  }
}

// Decode steps from four client threads at once against the split context and the one-GPU one:
// a context-parallel step holds one lane of each GPU, so steps overlap one another and the
// single-GPU steps (and the split-KV workspaces of concurrent plans share the allocator); each
// answer, on its own fresh query, matches the reference.
TEST_F(ShardedContextGpuTest, ConcurrentDecodeStepsMatchReference) {
  v1::ContextStatus st;
  ASSERT_TRUE(Create("split", kRows, 2, &st).ok());
  ASSERT_TRUE(Create("one", kRows, 1, &st).ok());
  for (const char* name : {"split", "one"}) ASSERT_TRUE(Append(name, 0, kRows, nullptr).ok());
  constexpr int kThreads = 4, kSteps = 6;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kSteps; ++i) {
        const char* name = (t + i) % 4 == 3 ? "one" : "split";
        const int64_t nq = i % 2 == 0 ? 1 : 4;
        ExpectAttendMatches(name, kRows, nq, 16, std::nullopt, R"({"dense": {}, "causal": true})",
                            nullptr, static_cast<uint64_t>(1 + t * kSteps + i));
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

}  // namespace
}  // namespace attnserve
