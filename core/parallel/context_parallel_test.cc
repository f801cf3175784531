// Context parallel: a request's keys split by sequence into shards, each shard's partial computed
// on its own (the float64 reference and the CPU backend on the shard's request, keys at a position
// offset), merged by LSE, equals the whole request's reference; and the group strategy does the
// same on two CPU devices. Fresh seeded inputs, outputs poisoned where a backend writes them.
#include "core/parallel/context_parallel.h"

#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_device.h"
#include "core/reference/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::MatchesReference;
using ::attnserve::testing::SpecOf;

// Rows [begin, begin + n) of a [1, N, H, D] tensor, as a tensor of their own.
HostTensor Rows(const HostTensor& t, int64_t begin, int64_t n) {
  HostTensor out = *HostTensor::Create(t.dtype(), {1, n, t.dim(2), t.dim(3)});
  const int64_t row = t.dim(2) * t.dim(3) * static_cast<int64_t>(DTypeSize(t.dtype()));
  std::memcpy(out.data(), t.data() + begin * row, static_cast<size_t>(n * row));
  return out;
}

// A reference result as tensors (f32 O, LSE) for the merger.
AttentionOutputs AsOutputs(const ReferenceResult& r, const AttentionShape& s) {
  AttentionOutputs out{*HostTensor::Create(DType::kF32, {1, s.tokens, s.q_heads, s.head_dim}),
                       *HostTensor::Create(DType::kF32, {1, s.q_heads, s.tokens})};
  for (size_t i = 0; i < r.o.size(); ++i) out.o.SetFloat(static_cast<int64_t>(i), r.o[i]);
  for (size_t i = 0; i < r.lse.size(); ++i) out.lse.SetFloat(static_cast<int64_t>(i), r.lse[i]);
  return out;
}

struct Case {
  std::string name;
  AttentionShape shape;  // kv_tokens: the whole context
  int64_t q_offset;
  std::vector<int64_t> cuts;  // shard boundaries inside the keys
};

std::vector<Case> Cases() {
  return {
      {"decode_gqa", {1, 1, 8, 2, 16, 203}, 202, {90}},
      {"decode4", {1, 4, 4, 4, 16, 203}, 199, {64, 150}},
      {"chunk_mid", {1, 64, 4, 2, 16, 300}, 100, {128}},     // queries on both sides of the cut
      {"chunk_before", {1, 40, 2, 1, 16, 300}, 20, {150}},   // queries before the 2nd shard
      {"queries_after", {1, 30, 2, 1, 16, 120}, 120, {60}},  // every query after every key
  };
}

std::vector<AttentionSpec> Specs() {
  std::vector<AttentionSpec> specs = {SpecOf(DenseSpec{}, false), SpecOf(DenseSpec{}, true),
                                      SpecOf(WindowSpec{37}, false), SpecOf(WindowSpec{37}, true),
                                      SpecOf(WindowSpec{0}, true)};
  return specs;
}

TEST(ContextParallelTest, ShardPartialsMergeToTheWholeReference) {
  const uint64_t seed = FreshSeed();
  for (const Case& c : Cases()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const testing::QkvInputs in = MakeRandomInputs(c.shape, dtype, seed);
      for (AttentionSpec spec : Specs()) {
        spec.q_offset = c.q_offset;
        SCOPED_TRACE(absl::StrCat(c.name, " ", std::string(DTypeName(dtype)), " ",
                                  std::string(PatternName(spec.pattern)),
                                  spec.causal ? " causal" : "", " seed=", seed));
        auto whole = ReferenceAttention(spec, in.q, in.k, in.v);
        ASSERT_TRUE(whole.ok()) << whole.status();
        auto by_reference = KeyShardMerger::Create(c.shape);
        auto by_cpu = KeyShardMerger::Create(c.shape);
        ASSERT_TRUE(by_reference.ok() && by_cpu.ok());
        std::vector<int64_t> bounds = {0};
        bounds.insert(bounds.end(), c.cuts.begin(), c.cuts.end());
        bounds.push_back(c.shape.kv_len());
        for (size_t s = 0; s + 1 < bounds.size(); ++s) {
          const int64_t start = bounds[s], rows = bounds[s + 1] - bounds[s];
          auto plan = PlanKeyShard(spec, c.shape, start, rows);
          ASSERT_TRUE(plan.ok()) << plan.status();
          if (plan->q_rows == 0) continue;
          const HostTensor q = Rows(in.q, plan->q_row0, plan->q_rows);
          const HostTensor k = Rows(in.k, start, rows), v = Rows(in.v, start, rows);
          auto ref = ReferenceAttention(plan->spec, q, k, v);
          ASSERT_TRUE(ref.ok()) << ref.status();
          ASSERT_TRUE((*by_reference)->Merge(plan->q_row0, AsOutputs(*ref, plan->shape)).ok());
          auto cpu = CpuAttention(plan->spec, q, k, v);
          ASSERT_TRUE(cpu.ok()) << cpu.status();
          EXPECT_TRUE(MatchesReference(*ref, cpu->o, &cpu->lse, dtype)) << "shard " << s;
          ASSERT_TRUE((*by_cpu)->Merge(plan->q_row0, *cpu).ok());
        }
        auto merged = (*by_reference)->Finish(DType::kF32, nullptr);
        ASSERT_TRUE(merged.ok());
        EXPECT_TRUE(MatchesReference(*whole, merged->o, &merged->lse, DType::kF32));
        merged = (*by_cpu)->Finish(dtype, nullptr);
        ASSERT_TRUE(merged.ok());
        EXPECT_TRUE(MatchesReference(*whole, merged->o, &merged->lse, dtype));
      }
    }
  }
}

// A shard far into a long sequence (kv_total up to the validator's 2^60) admits the same keys as
// near 0; the CPU backend matches the reference there.
TEST(ContextParallelTest, ShardsFarIntoTheSequenceMatchTheReference) {
  const uint64_t seed = FreshSeed();
  const AttentionShape shape{1, 24, 2, 1, 16, 40};
  const testing::QkvInputs in = MakeRandomInputs(shape, DType::kF32, seed);
  for (const int64_t total : {(int64_t{1} << 59) + 1000, int64_t{1} << 60}) {
    for (AttentionSpec spec : Specs()) {
      spec.kv_total = total;
      spec.k_offset = total - 140;
      spec.q_offset = spec.k_offset + 20;  // causal: the first queries see half the keys
      SCOPED_TRACE(absl::StrCat(std::string(PatternName(spec.pattern)),
                                spec.causal ? " causal" : "", " kv_total=", total,
                                " seed=", seed));
      ASSERT_TRUE(ValidateSpec(spec, shape).ok()) << ValidateSpec(spec, shape);
      auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
      ASSERT_TRUE(ref.ok()) << ref.status();
      auto cpu = CpuAttention(spec, in.q, in.k, in.v);
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      EXPECT_TRUE(MatchesReference(*ref, cpu->o, &cpu->lse, DType::kF32));
    }
  }
}

TEST(ContextParallelTest, RowsNoShardAdmitsStayEmpty) {
  // Window 0, causal, queries after every key: no row admits anything.
  const AttentionShape shape{1, 3, 2, 1, 8, 50};
  AttentionSpec spec = SpecOf(WindowSpec{0}, true);
  spec.q_offset = 50;
  for (int64_t start : {0, 25}) {
    auto plan = PlanKeyShard(spec, shape, start, 25);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->q_rows, 0);
  }
  auto merger = KeyShardMerger::Create(shape);
  ASSERT_TRUE(merger.ok());
  auto out = (*merger)->Finish(DType::kBF16, nullptr);
  ASSERT_TRUE(out.ok());
  for (int64_t i = 0; i < out->o.numel(); ++i) ASSERT_EQ(out->o.GetFloat(i), 0.f);
  for (int64_t i = 0; i < out->lse.numel(); ++i) ASSERT_TRUE(std::isinf(out->lse.GetFloat(i)));
}

TEST(ContextParallelTest, BlockSparseAndDilatedAreUnimplemented) {
  const AttentionShape shape{1, 1, 2, 1, 8, 256};
  AttentionSpec sparse = testing::SparseCase(64, LocalWindowGen{1}, true);
  sparse.q_offset = 255;
  EXPECT_EQ(PlanKeyShard(sparse, shape, 128, 128).status().code(),
            absl::StatusCode::kUnimplemented);
  AttentionSpec dilated = SpecOf(DilatedSpec{{64}, {2}}, true);
  dilated.q_offset = 255;
  EXPECT_EQ(PlanKeyShard(dilated, shape, 0, 128).status().code(), absl::StatusCode::kUnimplemented);
  // And the spec itself refuses a key offset for them.
  AttentionSpec shard = sparse;
  shard.kv_total = 512;
  shard.k_offset = 256;
  EXPECT_EQ(ValidateSpec(shard, shape).code(), absl::StatusCode::kUnimplemented);
}

// The strategy on two CPU devices: each rank runs its shard on its device, the result merges.
TEST(ContextParallelTest, GroupRunOnTwoCpuDevices) {
  const uint64_t seed = FreshSeed();
  std::vector<std::unique_ptr<Device>> devices;
  for (int i = 0; i < 2; ++i) devices.push_back(MakeCpuDevice(i, 2));
  const AttentionShape shape{1, 4, 8, 2, 32, 333};
  const testing::QkvInputs in = MakeRandomInputs(shape, DType::kBF16, seed);
  for (AttentionSpec spec : {SpecOf(DenseSpec{}, true), SpecOf(WindowSpec{100}, true)}) {
    SCOPED_TRACE(absl::StrCat(std::string(PatternName(spec.pattern)), " seed=", seed));
    spec.q_offset = 329;
    auto request = std::make_shared<AttentionRequest>();
    request->spec = spec;
    request->shape = shape;
    request->dtype = DType::kBF16;
    request->q = Rows(in.q, 0, shape.tokens);
    // Shards listed in row order but on devices in the other order: rank r is device r.
    for (auto [device, start, rows] :
         {std::tuple<size_t, int64_t, int64_t>{1, 0, 200}, {0, 200, 133}}) {
      KeyShard s;
      s.device = device;
      s.start = start;
      s.rows = rows;
      s.k = Rows(in.k, start, rows);
      s.v = Rows(in.v, start, rows);
      request->key_shards.push_back(std::move(s));
    }
    GroupRun run(Placement::kContextParallel, request, {devices[0].get(), devices[1].get()},
                 GroupEnv{});
    bool last[2] = {false, false};
    std::thread t0([&] { last[0] = run.RunPart(0, nullptr); });
    std::thread t1([&] { last[1] = run.RunPart(1, nullptr); });
    t0.join();
    t1.join();
    EXPECT_NE(last[0], last[1]);
    GroupResult result = run.Finish();
    ASSERT_TRUE(result.status.ok()) << result.status;
    EXPECT_EQ(result.placement, Placement::kContextParallel);
    auto ref = ReferenceAttention(spec, in.q, in.k, in.v);
    ASSERT_TRUE(ref.ok());
    EXPECT_TRUE(MatchesReference(*ref, result.outputs.o, &result.outputs.lse, DType::kBF16));
    EXPECT_TRUE(request->key_shards.empty()) << "inputs released";
  }
}

}  // namespace
}  // namespace attnserve
