// The Hopper (sm_90a, wgmma) forward kernels (core/cuda/flash_fwd_sm90), forced through
// FlashKernelOptions (arch kSm90), against float64 references:
// - spec level (CudaAttentionPlan -> RunAttentionForward) vs core/reference, in this file: dense,
//   causal, window (causal and not), block-sparse random / local_window / caller CSR (empty rows),
//   dilated (the accumulate epilogue), ragged N, GQA, several batches, bf16 and f16, head dims
//   64/128, blocks 64/128, CSRs of kFull blocks and dense over whole key blocks (the mask-free
//   variant), keys scaled up along the sequence and spiked keys (the kept-max tiles' fallback,
//   an item's first tile's included);
//   every run checks which kernel ran (the plan reports it);
// - params level (RunAttentionForward on BuildFlashFwdParams) vs a float64 loop, in
//   flash_sm90_piece_test.cc: rectangular CSR pieces with seqlen_k != seqlen and global position
//   offsets (ring pieces), all three mask kinds, accumulate mode merging two key pieces;
// - sm90 vs sm80 on N = 16384 (dense causal, block-sparse 90% skipped at blocks 128 and 64), in
//   this file.
// Every sm90 run (the persistent schedule, at layout blocks 64 and 128) is checked against the
// same reference and for which kernel ran ("sm90v3"); the persistent schedule runs once
// per work-item order (head- and position-major). The spec and piece cases cap the persistent
// grid at kPersistentTestCtas CTAs, so that each CTA runs many work items of different lengths
// (empty CSR rows included) back to back; the large cases run the full grid.
// Outputs are poisoned (0xFF bytes = NaN) before every launch; inputs are fresh seeded uniforms.
// Skips where there is no GPU, the GPU is not compute capability 9.x, or the build lacks sm_90a.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_attention.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_launch.cuh"
#include "core/reference/reference.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/dtype.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/gpu/flash_sm90_test_util.h"
#include "tests/testing/attention_test_util.h"
#include "tests/testing/gpu_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::sm90_test::ExpectedSm90Kernel;
using ::attnserve::sm90_test::ForcedSm90;
using ::attnserve::sm90_test::kLseTol;
using ::attnserve::sm90_test::OTol;
using ::attnserve::sm90_test::TestSchedules;
using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;
using ::attnserve::testing::PlanRunResult;
using ::attnserve::testing::RunPlanOnGpu;
using ::attnserve::testing::ShapeString;

// ---- spec level: CudaAttentionPlan vs core/reference ------------------------------------------

struct Case {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
  DType dtype;
  // The plan's CSR is kFull blocks over whole key blocks: with TMA the mask-free variant runs.
  bool all_full = false;
  // > 0: key row j (of N) scaled by 1 + key_ramp * j / N (ScaleKeysAlong).
  float key_ramp = 0.f;
  // > 0: key rows j with j % 128 == 16 scaled by key_spike (SpikeKeys).
  float key_spike = 0.f;
};

// Key row j of every batch scaled by scale_of(j, N) (1 leaves it alone), rounded back to the
// dtype.
template <typename ScaleOf>
void ScaleKeyRows(HostTensor& k, ScaleOf scale_of) {
  const int64_t n = k.dims()[1];
  const int64_t row = k.dims()[2] * k.dims()[3];  // heads x head_dim elements per key position
  std::vector<float> f(static_cast<size_t>(k.numel()));
  ConvertToFloat32(k.dtype(), k.data(), f.data(), f.size());
  for (int64_t b = 0; b < k.dims()[0]; ++b) {
    for (int64_t j = 0; j < n; ++j) {
      const float scale = scale_of(j, n);
      if (scale == 1.f) continue;
      for (int64_t i = 0; i < row; ++i) f[static_cast<size_t>((b * n + j) * row + i)] *= scale;
    }
  }
  ConvertFromFloat32(k.dtype(), f.data(), k.data(), f.size());
}

// Key rows scaled up along the sequence (1 + ramp * j / N), so that the row maxima grow from key
// tile to key tile (with ramp 16 over 16 tiles, by several scaled units each) and pass the kept
// max's 2^8 every few tiles: the kernel's kept-max tiles then find a probability past it and take
// the tile's maxima after all (KeptMaxMissed), many times per item. A build whose fallback
// leaves out the O rescale fails these cases.
void ScaleKeysAlong(HostTensor& k, float ramp) {
  ScaleKeyRows(k, [ramp](int64_t j, int64_t n) {
    return 1.f + ramp * static_cast<float>(j) / static_cast<float>(n);
  });
}

// Key row 16 of every 128-key block scaled by `factor`: with factor 40 its scores spread ~20
// scaled (log2) units either way where the others spread ~0.5, so in about a third of the rows
// it beats every other key by more than 2^8, and it lies outside the quarter of the columns
// whose maxima an item's first tile starts from (OnlineSoftmax::EstimateFirstMax: key groups 0,
// 4, 8, 12 of 8 keys): that tile's kept max misses in nearly every warp and takes the tile's
// maxima after all, while O still holds the previous item's output. A build that rescales O
// there fails these cases.
void SpikeKeys(HostTensor& k, float factor) {
  ScaleKeyRows(k, [factor](int64_t j, int64_t) { return j % 128 == 16 ? factor : 1.f; });
}

// Row i keeps block 0, block i - 2 and block i; every fifth row keeps nothing (O = 0, LSE = -inf).
CsrGen TestCsr(int64_t nb) {
  CsrGen g;
  g.row_ptr.push_back(0);
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 5 != 3) {
      std::vector<int64_t> cols = {0};
      if (i - 2 > 0) cols.push_back(i - 2);
      if (i > 0) cols.push_back(i);
      for (int64_t c : cols) g.col_idx.push_back(c);
    }
    g.row_ptr.push_back(static_cast<int64_t>(g.col_idx.size()));
  }
  return g;
}

std::vector<Case> SpecCases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, AttentionPattern pattern, bool causal, AttentionShape shape,
                 DType dt) {
    Case c;
    c.spec.pattern = std::move(pattern);
    c.spec.causal = causal;
    c.shape = shape;
    c.dtype = dt;
    c.name = absl::StrCat(name, causal ? "_causal" : "", "_b", shape.batch, "_n", shape.tokens,
                          "_hq", shape.q_heads, "_hkv", shape.kv_heads, "_d", shape.head_dim,
                          "_", std::string(DTypeName(dt)));
    cases.push_back(std::move(c));
  };
  // Shapes are kept small: the float64 reference is single-threaded (~40 s for all cases).
  const AttentionShape s1{1, 1000, 4, 2, 128};  // ragged N (1000 = 7 x 128 + 104), GQA 2:1
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const bool all = dt == DType::kBF16;  // f16: a subset of the layouts
    for (bool causal : {false, true}) {
      add("dense", DenseSpec{}, causal, s1, dt);
      add("dense", DenseSpec{}, causal, {1, 130, 2, 2, 64}, dt);
      // D = 64 dense: items of 192 query rows (1000 = 5 x 192 + 40) over 128-key tiles.
      add("dense", DenseSpec{}, causal, {2, 1000, 4, 2, 64}, dt);
      // D = 128 shorter than one 176-key tile (one ragged tile, one query item).
      add("dense", DenseSpec{}, causal, {1, 130, 2, 1, 128}, dt);
      if (all) add("dense_gqa4", DenseSpec{}, causal, {2, 520, 8, 2, 128}, dt);
      add("window100", WindowSpec{100}, causal, s1, dt);
      for (int32_t bs : {64, 128}) {
        const std::string b = absl::StrCat("bs", bs, "_");
        auto sparse = [&](BlockGenerator g) { return BlockSparseSpec{bs, std::move(g)}; };
        add(b + "random", sparse(RandomGen{0.3, 1234}), causal, s1, dt);
        if (all || bs == 64) add(b + "local_window", sparse(LocalWindowGen{1}), causal, s1, dt);
        if (all || bs == 128) {
          add(b + "csr", sparse(TestCsr(NumBlocks(1000, bs))), causal, {2, 1000, 4, 1, 128}, dt);
        }
        if (all) add(b + "random_d64", sparse(RandomGen{0.3, 77}), causal, {1, 1000, 4, 2, 64}, dt);
      }
      // Dilated: per-branch launches in accumulate mode (f32 LSE-merge epilogue).
      add("dilated", DilatedSpec{{128, 256, 512}, {1, 2, 4}}, causal, s1, dt);
    }
  }
  // Block-sparse layouts of kFull blocks over whole key blocks (1024 = 8 x 128, non-causal):
  // the mask-free CSR variant (Sm90FullTiles) with TMA, the default one with cp.async; the CSR
  // with empty rows gives items without tiles.
  for (DType dt : {DType::kBF16, DType::kF16}) {
    add("bs128_random_full", BlockSparseSpec{128, RandomGen{0.3, 4321}}, false,
        {1, 1024, 4, 2, 128}, dt);
    cases.back().all_full = true;
  }
  add("bs128_random_full_d64", BlockSparseSpec{128, RandomGen{0.3, 99}}, false,
      {1, 1024, 4, 2, 64}, DType::kBF16);
  cases.back().all_full = true;
  add("bs128_csr_full", BlockSparseSpec{128, TestCsr(8)}, false, {2, 1024, 4, 1, 128},
      DType::kBF16);
  cases.back().all_full = true;
  // The dense non-causal layout over whole key blocks takes the same variant (its plan has no
  // CSR, so all_full stays false).
  add("dense_whole_blocks", DenseSpec{}, false, {1, 1024, 4, 2, 128}, DType::kBF16);
  // Keys scaled up along the sequence (ScaleKeysAlong): the kept-max tiles miss their max. The
  // CSR of kFull blocks (mask-free variant), dense non-causal over whole key blocks (the same
  // variant at 128-key tiles, the masked 176-key variant where the key tile is 176) and causal.
  const AttentionShape ramp{1, 2048, 4, 2, 128};
  add("bs128_random_full_ramp", BlockSparseSpec{128, RandomGen{0.7, 31}}, false, ramp,
      DType::kBF16);
  cases.back().all_full = true;
  cases.back().key_ramp = 16.f;
  for (bool causal : {false, true}) {
    add("dense_ramp", DenseSpec{}, causal, ramp, DType::kBF16);
    cases.back().key_ramp = 16.f;
  }
  add("dense_ramp", DenseSpec{}, false, {1, 2048, 4, 2, 64}, DType::kF16);
  cases.back().key_ramp = 16.f;
  // A key far above the others in every key block, outside the columns an item's first tile
  // estimates its max from (SpikeKeys): the CSR of kFull blocks (mask-free variant, D = 128 and
  // 64) and a CSR with masks (causal), whose unmasked first tiles take the same path.
  add("bs128_random_full_spike", BlockSparseSpec{128, RandomGen{0.3, 57}}, false,
      {1, 2048, 4, 2, 128}, DType::kBF16);
  cases.back().all_full = true;
  cases.back().key_spike = 40.f;
  add("bs128_random_full_spike", BlockSparseSpec{128, RandomGen{0.3, 58}}, false,
      {1, 2048, 4, 2, 64}, DType::kF16);
  cases.back().all_full = true;
  cases.back().key_spike = 40.f;
  add("bs128_random_spike", BlockSparseSpec{128, RandomGen{0.3, 59}}, true, {1, 2000, 4, 2, 128},
      DType::kBF16);
  cases.back().key_spike = 40.f;
  // Long ragged row (4097 = 32 blocks + 1 token), cheap heads for the float64 reference.
  add("dense_long", DenseSpec{}, true, {1, 4097, 2, 1, 64}, DType::kBF16);
  add("bs128_random_long", BlockSparseSpec{128, RandomGen{0.2, 5}}, false, {1, 4097, 2, 2, 128},
      DType::kBF16);
  return cases;
}

class FlashSm90SpecTest : public ::testing::TestWithParam<Case> {};

// The plan of `c` run with `kernel`'s options on poisoned device outputs.
absl::StatusOr<PlanRunResult> RunPlan(const Case& c, const ::attnserve::testing::QkvInputs& in,
                                      const FlashKernelOptions& kernel) {
  CudaAttentionPlan::Options options;
  options.kernel = kernel;
  return RunPlanOnGpu(c.spec, in.q, in.k, in.v, options);
}

TEST_P(FlashSm90SpecTest, MatchesReference) {
  SKIP_WITHOUT_SM90();
  const Case& c = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat(c.name, " ", ShapeString(c.shape, c.dtype), " seed=", seed));
  auto in = MakeRandomInputs(c.shape, c.dtype, seed);
  if (c.key_ramp > 0.f) ScaleKeysAlong(in.k, c.key_ramp);
  if (c.key_spike > 0.f) SpikeKeys(in.k, c.key_spike);
  auto ref = ReferenceAttention(c.spec, in.q, in.k, in.v);
  ASSERT_TRUE(ref.ok()) << ref.status();
  // The persistent schedule runs once per work-item order: head-major and position-major,
  // whatever the layout's default.
  // The persistent schedule runs with TMA loads (its default) and with cp.async loads, in both
  // item orders. Also groups of 3 (head, batch, segment) pairs: uneven groups where hz is not a
  // multiple. The D = 64 dense and causal cases take items of 192 query rows by default (with
  // TMA; cp.async runs 128); one more run asks for 128, one for 192 with groups of 3. The D = 128
  // dense and causal cases run once more with K/V tiles of 176 keys in each item order (1000 keys
  // = 5 x 176 + 120, 520 = 2 x 176 + 168, 130 < 176: ragged last tiles; causal items of 128 rows
  // over tiles of 176 keys), the other cases run their default there. Those runs take clusters of
  // two CTAs on the dense and causal cases by default (520 keys are five query blocks: the last
  // cluster's second row is past the end); one more run asks for single CTAs, and one runs
  // the clusters on the whole GPU (the grid sized by the resident clusters) instead of the capped
  // grid. The CSR cases with TMA loads deal their items dynamically by default (the capped grid
  // has more than two rounds of them; cp.async loads deal statically); one more run asks for the
  // static deal with TMA.
  struct Run {
    Sm90Schedule schedule;
    Sm90ItemOrder order;
    bool tma;
    int head_group;
    Sm90QueryTile query_tile = Sm90QueryTile::kAuto;
    Sm90KeyTile key_tile = Sm90KeyTile::kAuto;
    Sm90Cluster cluster = Sm90Cluster::kAuto;
    int max_ctas = sm90_test::kPersistentTestCtas;
    Sm90ItemDeal deal = Sm90ItemDeal::kAuto;
  };
  std::vector<Run> runs;
  for (const Sm90Schedule schedule : TestSchedules()) {
    if (schedule == Sm90Schedule::kPersistent) {
      for (bool tma : {true, false}) {
        runs.push_back({schedule, Sm90ItemOrder::kHead, tma, 0});
        runs.push_back({schedule, Sm90ItemOrder::kPosition, tma, 0});
      }
      runs.push_back({schedule, Sm90ItemOrder::kAuto, true, 3});
      runs.push_back({schedule, Sm90ItemOrder::kAuto, true, 0, Sm90QueryTile::k128});
      runs.push_back({schedule, Sm90ItemOrder::kAuto, true, 3, Sm90QueryTile::k192});
      runs.push_back({schedule, Sm90ItemOrder::kHead, true, 0, Sm90QueryTile::kAuto,
                      Sm90KeyTile::k176});
      runs.push_back({schedule, Sm90ItemOrder::kPosition, true, 3, Sm90QueryTile::kAuto,
                      Sm90KeyTile::k176});
      runs.push_back({schedule, Sm90ItemOrder::kAuto, true, 0, Sm90QueryTile::kAuto,
                      Sm90KeyTile::k128});
      runs.push_back({schedule, Sm90ItemOrder::kHead, true, 0, Sm90QueryTile::kAuto,
                      Sm90KeyTile::k176, Sm90Cluster::k1});
      runs.push_back({schedule, Sm90ItemOrder::kAuto, true, 0, Sm90QueryTile::kAuto,
                      Sm90KeyTile::k176, Sm90Cluster::k2, 0});
      runs.push_back({schedule, Sm90ItemOrder::kHead, true, 0, Sm90QueryTile::kAuto,
                      Sm90KeyTile::kAuto, Sm90Cluster::kAuto, sm90_test::kPersistentTestCtas,
                      Sm90ItemDeal::kStatic});
    } else {
      runs.push_back({schedule, Sm90ItemOrder::kAuto, false, 0});
    }
  }
  for (const auto& [schedule, order, tma, head_group, query_tile, key_tile, cluster, max_ctas,
                    deal] : runs) {
    SCOPED_TRACE(absl::StrCat("schedule ", std::string(Sm90ScheduleName(schedule)),
                              ", item order ", std::string(Sm90ItemOrderName(order)),
                              tma ? ", tma" : ", cp.async", ", head group ", head_group,
                              ", query tile ", std::string(Sm90QueryTileName(query_tile)),
                              ", key tile ", std::string(Sm90KeyTileName(key_tile)),
                              ", cluster ", std::string(Sm90ClusterName(cluster)),
                              ", max ctas ", max_ctas, ", deal ",
                              std::string(Sm90ItemDealName(deal))));
    FlashKernelOptions options = ForcedSm90(schedule, max_ctas, order);
    options.sm90_cluster = cluster;
    options.sm90_tma = tma;
    options.persistent_head_group = head_group;
    options.sm90_query_tile = query_tile;
    options.sm90_key_tile = key_tile;
    options.sm90_item_deal = deal;
    absl::StatusOr<PlanRunResult> run = RunPlan(c, in, options);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->kernel, ExpectedSm90Kernel(schedule)) << FlashKernelName(run->kernel);
    EXPECT_EQ(run->all_full_blocks, c.all_full);
    const ErrorStats e = CompareToReference(*ref, run->o, &run->lse);
    EXPECT_EQ(e.nonfinite, 0) << "unwritten or non-finite outputs";
    EXPECT_LE(e.o_rel, OTol(c.dtype)) << "o max abs err " << e.o_max_abs << " / max|ref| "
                                      << e.o_ref_max_abs;
    EXPECT_LE(e.lse_max_abs, kLseTol);
    EXPECT_GT(e.checked, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, FlashSm90SpecTest, ::testing::ValuesIn(SpecCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- TMA maps: a plain [B, N, H, D] layout is addressable, a misaligned one falls back --------

TEST(FlashSm90TmaTest, MapsEncodeForPlainLayoutsAndRefuseMisalignedOnes) {
  SKIP_WITHOUT_SM90();
  // Q [B = 2, N = 1000, Hq = 8, D = 128] and K, V [2, 1000, Hkv = 4, 128] bf16, as the params
  // builder lays them out.
  constexpr int64_t kB = 2, kN = 1000, kHq = 8, kH = 4, kD = 128;
  const int64_t q_elems = kB * kN * kHq * kD, kv_elems = kB * kN * kH * kD;
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, (q_elems + 2 * kv_elems) * 2 + 64), cudaSuccess);
  FlashFwdParams p;
  p.head_dim = kD;
  p.dtype = DType::kBF16;
  p.batch = kB;
  p.num_heads = kHq;
  p.kv_group = kHq / kH;
  p.seqlen = kN;
  p.q = buf;
  p.k = static_cast<char*>(buf) + q_elems * 2;
  p.v = static_cast<const char*>(p.k) + kv_elems * 2;
  p.q_row_stride = kHq * kD;
  p.q_head_stride = kD;
  p.q_batch_stride = kN * kHq * kD;
  p.k_row_stride = p.v_row_stride = kH * kD;
  p.k_head_stride = p.v_head_stride = kD;
  p.k_batch_stride = p.v_batch_stride = kN * kH * kD;
  Sm90TmaMaps maps;
  EXPECT_EQ(MakeSm90TmaMaps(p, 128, &maps), cudaSuccess);
  const void* k = p.k;
  p.k = static_cast<const char*>(k) + 2;  // not 16-byte aligned: TMA cannot address it
  EXPECT_EQ(MakeSm90TmaMaps(p, 128, &maps), cudaErrorNotSupported);
  p.k = k;
  p.q_row_stride = kHq * kD + 4;  // an 8-byte remainder in the row pitch
  EXPECT_EQ(MakeSm90TmaMaps(p, 128, &maps), cudaErrorNotSupported);
  cudaFree(buf);
}

// ---- the persistent schedule's head groups (host heuristic, no GPU needed) --------------------

TEST(FlashSm90ScheduleTest, HeadGroupsKeepKvInL2AndCausalGroupsTwoWaves) {
  FlashFwdParams p;
  p.num_heads = 16;
  p.batch = 1;
  p.num_segs = 1;
  p.head_dim = 128;
  p.seqlen = 16384;  // K + V of one head: 8 MiB
  p.num_q_blocks = 128;
  constexpr int64_t kL2 = 50 << 20;
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kAuto), 3);  // 25 MiB / 8 MiB
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kPosition), 16);
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kHead), 1);
  p.seqlen = 65536;  // 32 MiB a head: one head per group
  p.num_q_blocks = 512;
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kAuto), 1);
  // Implicit causal: one group (heavy-first over every head) unless one head's K/V fills the
  // L2 share.
  p.dense_causal = true;
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kAuto), 1);  // N = 65536
  p.seqlen = 16384;
  p.num_q_blocks = 128;
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kAuto), 16);
  // Never more pairs than there are.
  p.dense_causal = false;
  p.num_heads = 2;
  EXPECT_EQ(Sm90HeadGroup(p, 132, kL2, Sm90ItemOrder::kAuto), 2);
}

// ---- forced sm90 where it cannot run is an error, not a fallback --------------------------------

TEST(FlashSm90DispatchTest, ForcedUnsupportedIsUnimplemented) {
  FlashFwdParams p;
  p.head_dim = 96;
  p.block_size = 128;
  p.dtype = DType::kBF16;
  std::string why;
  EXPECT_FALSE(FlashFwdSm90Supports(p, &why));
  EXPECT_FALSE(why.empty());
  FlashKernelOptions options;
  options.arch = FlashKernelArch::kSm90;
  {
    auto k = FlashKernelFor(p, options);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kUnimplemented) << k.status();
  }
  options.arch = FlashKernelArch::kSm80;
  {
    auto k = FlashKernelFor(p, options);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(FlashKernelName(*k), "sm80");
  }
}

// The mask-free variant: a CSR known to hold kFull entries only, or the dense non-causal layout,
// over whole key blocks, block 128.
TEST(FlashSm90DispatchTest, FullTilesOnlyForWholeFullBlocks) {
  static const int32_t kCol = 0;
  FlashFwdParams p;
  p.block_size = 128;
  p.seqlen = 1000;
  EXPECT_FALSE(Sm90FullTiles(p)) << "implicit dense layout, ragged last key block";
  p.seqlen = 1024;
  p.col_idx = &kCol;
  EXPECT_FALSE(Sm90FullTiles(p)) << "a CSR not known to be all kFull";
  p.csr_all_full = true;
  EXPECT_TRUE(Sm90FullTiles(p));
  p.seqlen_k = 1000;
  EXPECT_FALSE(Sm90FullTiles(p)) << "ragged last key block";
  p.seqlen_k = 896;
  EXPECT_TRUE(Sm90FullTiles(p)) << "rectangular, whole key blocks";
  p.block_size = 64;
  EXPECT_FALSE(Sm90FullTiles(p)) << "block 64 has its own variant";
  p.block_size = 128;
  p.col_idx = nullptr;
  EXPECT_TRUE(Sm90FullTiles(p)) << "implicit dense, non-causal, whole key blocks";
  p.dense_causal = true;
  EXPECT_FALSE(Sm90FullTiles(p)) << "implicit causal: its diagonal tiles are masked";
}

// Kernel and schedule names: what flags and environment variables may say, parsed once.
TEST(FlashSm90DispatchTest, OptionNamesParseAndBadOnesAreInvalidArgument) {
  EXPECT_EQ(ParseFlashKernelArch("bogus").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSm90Schedule("v4").status().code(), absl::StatusCode::kInvalidArgument);
  // The removed one-CTA-per-tile schedules: refused like an unknown name, and the message lists
  // what is accepted.
  for (const char* removed : {"v1", "single_tile", "v2", "warp_specialized"}) {
    const absl::Status status = ParseSm90Schedule(removed, "--sm90-schedule").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << removed;
    EXPECT_NE(status.message().find("persistent (or v3"), std::string_view::npos)
        << status.message();
    EXPECT_NE(status.message().find("--sm90-schedule"), std::string_view::npos)
        << status.message();
  }
  EXPECT_EQ(ParseSm90ItemOrder("diagonal").status().code(), absl::StatusCode::kInvalidArgument);
  for (const FlashKernelArch a : {FlashKernelArch::kAuto, FlashKernelArch::kSm80,
                                  FlashKernelArch::kSm90}) {
    EXPECT_EQ(*ParseFlashKernelArch(FlashKernelArchName(a)), a);
  }
  const std::pair<const char*, Sm90Schedule> old_names[] = {{"v3", Sm90Schedule::kPersistent}};
  for (const auto& [name, schedule] : old_names) {
    auto parsed = ParseSm90Schedule(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, schedule);
    EXPECT_EQ(*ParseSm90Schedule(Sm90ScheduleName(schedule)), schedule);
  }
  for (const Sm90ItemOrder o :
       {Sm90ItemOrder::kAuto, Sm90ItemOrder::kPosition, Sm90ItemOrder::kHead}) {
    EXPECT_EQ(*ParseSm90ItemOrder(Sm90ItemOrderName(o)), o);
  }
  for (const Sm90QueryTile t : {Sm90QueryTile::kAuto, Sm90QueryTile::k128, Sm90QueryTile::k192}) {
    EXPECT_EQ(*ParseSm90QueryTile(Sm90QueryTileName(t)), t);
  }
  EXPECT_EQ(ParseSm90QueryTile("256").status().code(), absl::StatusCode::kInvalidArgument);
  for (const Sm90KeyTile t : {Sm90KeyTile::kAuto, Sm90KeyTile::k128, Sm90KeyTile::k176}) {
    EXPECT_EQ(*ParseSm90KeyTile(Sm90KeyTileName(t)), t);
  }
  EXPECT_EQ(ParseSm90KeyTile("192").status().code(), absl::StatusCode::kInvalidArgument);
  for (const Sm90Cluster c : {Sm90Cluster::kAuto, Sm90Cluster::k1, Sm90Cluster::k2}) {
    EXPECT_EQ(*ParseSm90Cluster(Sm90ClusterName(c)), c);
  }
  EXPECT_EQ(ParseSm90Cluster("4").status().code(), absl::StatusCode::kInvalidArgument);
  for (const Sm90ItemDeal d : {Sm90ItemDeal::kAuto, Sm90ItemDeal::kStatic, Sm90ItemDeal::kDynamic}) {
    EXPECT_EQ(*ParseSm90ItemDeal(Sm90ItemDealName(d)), d);
  }
  EXPECT_EQ(ParseSm90ItemDeal("random").status().code(), absl::StatusCode::kInvalidArgument);
}

// The environment overrides, read once by CudaOptionsFromEnv: unset or empty keeps the default,
// v3 names the persistent schedule; v1 and v2 (the removed schedules) and v4 are configuration
// errors.
TEST(FlashSm90DispatchTest, EnvironmentOverridesAreReadOnce) {
  constexpr char kEnv[] = "ATTNSERVE_SM90_VARIANT";
  const char* old = std::getenv(kEnv);
  const std::string saved = old != nullptr ? old : "";
  setenv(kEnv, "", 1);
  auto options = CudaOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->flash.sm90_schedule, Sm90Schedule::kPersistent);
  setenv(kEnv, "v3", 1);
  options = CudaOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->flash.sm90_schedule, Sm90Schedule::kPersistent);
  setenv(kEnv, "v1", 1);
  EXPECT_EQ(CudaOptionsFromEnv().status().code(), absl::StatusCode::kInvalidArgument);
  setenv(kEnv, "v2", 1);
  EXPECT_EQ(CudaOptionsFromEnv().status().code(), absl::StatusCode::kInvalidArgument);
  setenv(kEnv, "v4", 1);
  EXPECT_EQ(CudaOptionsFromEnv().status().code(), absl::StatusCode::kInvalidArgument);
  if (old != nullptr) {
    setenv(kEnv, saved.c_str(), 1);
  } else {
    unsetenv(kEnv);
  }
}

// ---- sm90 vs sm80 on a large case ------------------------------------------------------------

TEST(FlashSm90VsSm80Test, LargeCasesAgree) {
  SKIP_WITHOUT_SM90();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const AttentionShape shape{1, 16384, 4, 4, 128};
  auto in = MakeRandomInputs(shape, DType::kBF16, seed);
  std::vector<Case> cases(3);
  cases[0].spec.pattern = DenseSpec{};
  cases[0].spec.causal = true;
  cases[0].name = "dense_causal";
  cases[1].spec.pattern = BlockSparseSpec{128, RandomGen{0.1, 42}};
  cases[1].name = "bs128_random_90pct_skipped";
  // Layout block 64 on the full grid (two CTAs per SM).
  cases[2].spec.pattern = BlockSparseSpec{64, RandomGen{0.1, 43}};
  cases[2].name = "bs64_random_90pct_skipped";
  for (Case& c : cases) {
    c.shape = shape;
    c.dtype = DType::kBF16;
    SCOPED_TRACE(c.name);
    // sm80, then sm90 (full persistent grid) with TMA loads, then with cp.async loads; each sm90
    // run is compared with sm80.
    constexpr int kRuns = 3;
    HostTensor o[kRuns], lse[kRuns];
    FlashKernelOptions sm80;
    sm80.arch = FlashKernelArch::kSm80;
    constexpr Sm90Schedule kSchedule = Sm90Schedule::kPersistent;
    for (int i = 0; i < kRuns; ++i) {
      FlashKernelOptions options = i == 0 ? sm80 : ForcedSm90(kSchedule, /*max_ctas=*/0);
      options.sm90_tma = i != kRuns - 1;
      absl::StatusOr<PlanRunResult> run = RunPlan(c, in, options);
      ASSERT_TRUE(run.ok()) << run.status();
      o[i] = std::move(run->o);
      lse[i] = std::move(run->lse);
      const FlashKernel ran = run->kernel;
      EXPECT_EQ(ran, i == 0 ? FlashKernel::kSm80 : ExpectedSm90Kernel(kSchedule))
          << FlashKernelName(ran);
    }
    for (int run = 1; run < kRuns; ++run) {
      SCOPED_TRACE(absl::StrCat("sm90 ", std::string(Sm90ScheduleName(kSchedule)),
                                run == kRuns - 1 ? " cp.async" : "", " vs sm80"));
      std::vector<float> a(o[0].numel()), b(o[run].numel()), la(lse[0].numel()),
          lb(lse[run].numel());
      o[0].ToFloat32(a.data());
      o[run].ToFloat32(b.data());
      lse[0].ToFloat32(la.data());
      lse[run].ToFloat32(lb.data());
      double max_err = 0, max_ref = 0, lse_err = 0;
      int64_t bad = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
          ++bad;
          continue;
        }
        max_err = std::max(max_err, static_cast<double>(std::abs(a[i] - b[i])));
        max_ref = std::max(max_ref, static_cast<double>(std::abs(a[i])));
      }
      for (size_t i = 0; i < la.size(); ++i) {
        if (!std::isfinite(la[i]) || !std::isfinite(lb[i])) {
          ++bad;
          continue;
        }
        lse_err = std::max(lse_err, static_cast<double>(std::abs(la[i] - lb[i])));
      }
      EXPECT_EQ(bad, 0);
      EXPECT_GT(max_ref, 0);
      EXPECT_LE(max_err / std::max(max_ref, 1e-30), 1e-2);
      EXPECT_LE(lse_err, kLseTol);
    }  // runs
  }
}

}  // namespace
}  // namespace attnserve
