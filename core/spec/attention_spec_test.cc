#include "core/spec/attention_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

constexpr AttentionShape kShape{
    .batch = 1, .tokens = 1000, .q_heads = 8, .kv_heads = 8, .head_dim = 64};

AttentionShape ShapeWith(int64_t batch, int64_t tokens, int64_t q_heads, int64_t kv_heads,
                         int64_t head_dim) {
  return AttentionShape{batch, tokens, q_heads, kv_heads, head_dim};
}

AttentionSpec Spec(AttentionPattern pattern, bool causal = false, float scale = 0.f) {
  AttentionSpec spec;
  spec.pattern = std::move(pattern);
  spec.causal = causal;
  spec.scale = scale;
  return spec;
}

AttentionSpec Sparse(BlockGenerator generator, int32_t block_size = 128) {
  return Spec(BlockSparseSpec{block_size, std::move(generator)});
}

// One CSR entry per row: col_idx[e] = e, except where overridden.
CsrGen Diagonal(int64_t nb) {
  CsrGen g;
  for (int64_t i = 0; i <= nb; ++i) g.row_ptr.push_back(i);
  for (int64_t i = 0; i < nb; ++i) g.col_idx.push_back(i);
  return g;
}

struct InvalidCase {
  std::string name;
  AttentionSpec spec;
  AttentionShape shape;
  std::string field;    // must appear in the message
  std::string message;  // when non-empty, the whole message
};

// Queries against keys of another length, offsets, packed sequences.
void AddNonSquareCases(std::vector<InvalidCase>& cases) {
  auto add = [&](std::string name, AttentionSpec spec, AttentionShape shape, std::string field,
                 std::string message = "") {
    cases.push_back(
        {std::move(name), std::move(spec), shape, std::move(field), std::move(message)});
  };
  const AttentionSpec dense = Spec(DenseSpec{});
  AttentionShape rect = kShape;
  rect.kv_tokens = 1500;
  add("kv_tokens_negative", dense, AttentionShape{1, 1000, 8, 8, 64, -1}, "shape.kv_tokens");
  add("kv_elements_overflow", dense, AttentionShape{1, 10, 1, 1, 256, int64_t{1} << 58},
      "shape: batch * kv_tokens * kv_heads * head_dim");
  AttentionSpec offset = dense;
  offset.q_offset = -1;
  add("q_offset_negative", offset, rect, "spec.q_offset",
      "spec.q_offset: must be in [0, kv_len = 1500] (queries start within or right after the "
      "keys), got -1");
  offset.q_offset = 1501;
  add("q_offset_past_the_keys", offset, rect, "spec.q_offset");
  offset.q_offset = 1001;
  add("q_offset_square_past_the_keys", offset, kShape, "spec.q_offset");
  // Offset 1000 + 1000 tokens: 16 blocks of 128, so the csr needs 17 row pointers, not 9.
  AttentionSpec csr = Sparse(Diagonal(8));
  csr.q_offset = 1000;
  add("csr_rows_for_the_extent", csr, rect, "spec.block_sparse.csr.row_ptr",
      "spec.block_sparse.csr.row_ptr: has 9 entries, expected num_blocks + 1 = 17 (2000 tokens "
      "at block_size 128)");
  auto packed = [&](std::vector<int64_t> cq, std::vector<int64_t> ck) {
    AttentionSpec spec = dense;
    spec.cu_seqlens_q = std::move(cq);
    spec.cu_seqlens_k = std::move(ck);
    return spec;
  };
  AttentionSpec packed_offset = packed({0, 1000}, {0, 1500});
  packed_offset.q_offset = 500;
  add("packed_with_offset", packed_offset, rect, "spec.q_offset",
      "spec.q_offset: must be 0 when packed (each sequence's queries are bottom-right aligned), "
      "got 500");
  add("packed_batch_two", packed({0, 1000}, {0, 1500}), AttentionShape{2, 1000, 8, 8, 64, 1500},
      "shape.batch");
  add("packed_sizes_differ", packed({0, 500, 1000}, {0, 1500}), rect, "spec.cu_seqlens_q",
      "spec.cu_seqlens_q: has 3 entries but cu_seqlens_k has 2 (one more than the number of "
      "sequences each)");
  add("packed_k_only", packed({}, {0, 1500}), rect, "spec.cu_seqlens_q");
  add("packed_one_entry", packed({1000}, {1500}), rect, "spec.cu_seqlens_q");
  add("packed_q_start", packed({1, 1000}, {0, 1500}), rect, "spec.cu_seqlens_q[0]",
      "spec.cu_seqlens_q[0]: must be 0, got 1");
  add("packed_k_decreasing", packed({0, 0, 10, 1000}, {0, 700, 600, 1500}), rect,
      "spec.cu_seqlens_k[2]",
      "spec.cu_seqlens_k[2]: 600 is less than entry 1 = 700 (must be non-decreasing)");
  add("packed_q_end", packed({0, 10, 20, 999}, {0, 10, 20, 1500}), rect, "spec.cu_seqlens_q[3]",
      "spec.cu_seqlens_q[3]: 999 must equal shape.tokens (query rows) = 1000");
  add("packed_k_end", packed({0, 10, 20, 1000}, {0, 10, 20, 1499}), rect, "spec.cu_seqlens_k[3]",
      "spec.cu_seqlens_k[3]: 1499 must equal kv_len (key rows) = 1500");
  add("packed_more_queries_than_keys", packed({0, 10, 30, 1000}, {0, 10, 29, 1500}), rect,
      "spec.cu_seqlens_q[2]",
      "spec.cu_seqlens_q[2]: sequence 1 has 20 queries but 19 keys; queries are bottom-right "
      "aligned (offset kv_len - q_len), so they must not outnumber the keys");
  {
    std::vector<int64_t> cu(kMaxPackedSequences + 2, 1000);
    cu[0] = 0;
    std::vector<int64_t> ck(kMaxPackedSequences + 2, 1500);
    ck[0] = 0;
    add("packed_too_many_sequences", packed(cu, ck), rect, "spec.cu_seqlens_q");
  }
  // The longest sequence has 600 keys: 5 blocks of 128, so 6 row pointers, not 9.
  AttentionSpec packed_csr = Sparse(Diagonal(8));
  packed_csr.cu_seqlens_q = {0, 400, 1000};
  packed_csr.cu_seqlens_k = {0, 600, 1200};
  add("packed_csr_rows_for_the_longest_sequence", packed_csr,
      AttentionShape{1, 1000, 8, 8, 64, 1200}, "spec.block_sparse.csr.row_ptr",
      "spec.block_sparse.csr.row_ptr: has 9 entries, expected num_blocks + 1 = 6 (600 tokens at "
      "block_size 128)");
  // Key shards: 1500 keys at positions k_offset.. of a sequence of kv_total.
  const auto shard = [&](int64_t k_offset, int64_t kv_total) {
    AttentionSpec s = Spec(DenseSpec{}, true);
    s.k_offset = k_offset;
    s.kv_total = kv_total;
    return s;
  };
  add("shard_k_offset_without_kv_total", shard(10, 0), rect, "spec.k_offset");
  add("shard_k_offset_negative", shard(-1, 4000), rect, "spec.k_offset");
  add("shard_keys_past_the_sequence", shard(2501, 4000), rect, "spec.k_offset",
      "spec.k_offset: must be in [0, kv_total - kv_len = 2500] (the keys inside the 4000 of the "
      "sequence), got 2501");
  add("shard_sequence_too_long", shard(0, (int64_t{1} << 60) + 1), rect, "spec.kv_total",
      "spec.kv_total: must be <= 2^60, got 1152921504606846977");
}

std::vector<InvalidCase> InvalidCases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<InvalidCase> cases;
  auto add = [&](std::string name, AttentionSpec spec, AttentionShape shape, std::string field,
                 std::string message = "") {
    cases.push_back(
        {std::move(name), std::move(spec), shape, std::move(field), std::move(message)});
  };
  const AttentionSpec dense = Spec(DenseSpec{});

  // Shape.
  add("batch_zero", dense, ShapeWith(0, 1000, 8, 8, 64), "shape.batch",
      "shape.batch: must be >= 1, got 0");
  add("tokens_zero", dense, ShapeWith(1, 0, 8, 8, 64), "shape.tokens");
  add("tokens_negative", dense, ShapeWith(1, -5, 8, 8, 64), "shape.tokens");
  add("q_heads_zero", dense, ShapeWith(1, 1000, 0, 8, 64), "shape.q_heads");
  add("kv_heads_zero", dense, ShapeWith(1, 1000, 8, 0, 64), "shape.kv_heads");
  add("head_dim_zero", dense, ShapeWith(1, 1000, 8, 8, 0), "shape.head_dim");
  add("gqa_not_multiple", dense, ShapeWith(1, 1000, 12, 8, 64), "shape.q_heads",
      "shape.q_heads: 12 is not a multiple of shape.kv_heads = 8");
  add("head_dim_too_big", dense, ShapeWith(1, 1000, 8, 8, 512), "shape.head_dim");
  add("elements_overflow", dense, ShapeWith(1, int64_t{1} << 40, 1 << 20, 1, 256),
      "shape: batch * tokens * q_heads * head_dim");
  add("bytes_overflow", dense, ShapeWith(1 << 22, int64_t{1} << 30, 1, 1, 256),
      "shape: batch * tokens * q_heads * head_dim");

  // Scale.
  add("scale_negative", Spec(DenseSpec{}, false, -1.f), kShape, "spec.scale");
  add("scale_nan", Spec(DenseSpec{}, false, nan), kShape, "spec.scale");
  add("scale_inf", Spec(DenseSpec{}, false, inf), kShape, "spec.scale");

  // Window.
  add("window_negative", Spec(WindowSpec{-1}), kShape, "spec.window.size",
      "spec.window.size: must be >= 0, got -1");

  // Dilated.
  add("dilated_empty", Spec(DilatedSpec{}), kShape, "spec.dilated.segment_lengths");
  add("dilated_rates_empty", Spec(DilatedSpec{{2048}, {}}), kShape, "spec.dilated.dilation_rates");
  add("dilated_length_mismatch", Spec(DilatedSpec{{512, 1024, 2048}, {1, 2}}), kShape,
      "spec.dilated", "spec.dilated: segment_lengths has 3 entries but dilation_rates has 2");
  add("dilated_segment_zero", Spec(DilatedSpec{{512, 0}, {1, 1}}), kShape,
      "spec.dilated.segment_lengths[1]");
  add("dilated_rate_zero", Spec(DilatedSpec{{512, 1024}, {1, 0}}), kShape,
      "spec.dilated.dilation_rates[1]", "spec.dilated.dilation_rates[1]: must be >= 1, got 0");
  add("dilated_rate_negative", Spec(DilatedSpec{{512}, {-2}}), kShape,
      "spec.dilated.dilation_rates[0]");
  add("dilated_rate_exceeds_segment", Spec(DilatedSpec{{2048}, {4096}}), kShape,
      "spec.dilated.dilation_rates[0]",
      "spec.dilated.dilation_rates[0]: 4096 exceeds segment_lengths[0] = 2048 (dilation must not "
      "exceed the segment)");
  add("dilated_too_many_branches",
      Spec(DilatedSpec{std::vector<int64_t>(kMaxDilatedBranches + 1, 64),
                       std::vector<int64_t>(kMaxDilatedBranches + 1, 1)}),
      kShape, "spec.dilated.segment_lengths");

  // Block sparse.
  add("block_size_96", Sparse(LocalWindowGen{1}, 96), kShape, "spec.block_sparse.block_size",
      "spec.block_sparse.block_size: 96 is not supported (64 or 128)");
  add("block_size_zero", Sparse(LocalWindowGen{1}, 0), kShape, "spec.block_sparse.block_size");
  add("local_window_negative", Sparse(LocalWindowGen{-1}), kShape,
      "spec.block_sparse.local_window.width");
  add("dilated_sparse_rate_zero", Sparse(DilatedSparseGen{{1, 2, 0}}), kShape,
      "spec.block_sparse.dilated_sparse.rates[2]",
      "spec.block_sparse.dilated_sparse.rates[2]: must be >= 1, got 0");
  add("dilated_sparse_rate_negative", Sparse(DilatedSparseGen{{-3}}), kShape,
      "spec.block_sparse.dilated_sparse.rates[0]");
  add("global_local_globals_negative", Sparse(GlobalLocalGen{-1, 1}), kShape,
      "spec.block_sparse.global_local.global_blocks");
  add("global_local_width_negative", Sparse(GlobalLocalGen{1, -2}), kShape,
      "spec.block_sparse.global_local.width");
  add("strided_stride_zero", Sparse(StridedGen{0, 1}), kShape, "spec.block_sparse.strided.stride");
  add("strided_stride_negative", Sparse(StridedGen{-4, 1}), kShape,
      "spec.block_sparse.strided.stride");
  add("strided_width_negative", Sparse(StridedGen{4, -1}), kShape,
      "spec.block_sparse.strided.width");
  add("random_keep_above_one", Sparse(RandomGen{1.5, 1}), kShape, "spec.block_sparse.random.keep");
  add("random_keep_negative", Sparse(RandomGen{-0.1, 1}), kShape, "spec.block_sparse.random.keep");
  add("random_keep_nan", Sparse(RandomGen{std::nan(""), 1}), kShape,
      "spec.block_sparse.random.keep");

  // CSR. 1000 tokens at block 128 -> 8 blocks.
  {
    CsrGen g = Diagonal(8);
    g.row_ptr.pop_back();
    add("csr_row_ptr_short", Sparse(g), kShape, "spec.block_sparse.csr.row_ptr");
  }
  {
    CsrGen g = Diagonal(8);
    g.row_ptr.push_back(8);
    add("csr_row_ptr_long", Sparse(g), kShape, "spec.block_sparse.csr.row_ptr");
  }
  {
    add("csr_row_ptr_for_other_block_size", Sparse(Diagonal(8), 64), kShape,
        "spec.block_sparse.csr.row_ptr");
  }
  {
    CsrGen g = Diagonal(8);
    for (int64_t& p : g.row_ptr) p += 1;
    g.col_idx.insert(g.col_idx.begin(), 0);
    add("csr_row_ptr_not_zero_start", Sparse(g), kShape, "spec.block_sparse.csr.row_ptr[0]");
  }
  {
    CsrGen g = Diagonal(8);
    g.row_ptr[4] = 2;
    add("csr_row_ptr_decreasing", Sparse(g), kShape, "spec.block_sparse.csr.row_ptr[4]");
  }
  {
    CsrGen g = Diagonal(8);
    g.col_idx.push_back(7);
    add("csr_row_ptr_last_mismatch", Sparse(g), kShape, "spec.block_sparse.csr.row_ptr[8]");
  }
  {
    // 256 blocks of 128 tokens; entry 17 (row 17) names block 300.
    CsrGen g = Diagonal(256);
    g.col_idx[17] = 300;
    add("csr_col_out_of_range", Sparse(g), ShapeWith(1, 256 * 128, 8, 8, 64),
        "spec.block_sparse.csr.col_idx[17]",
        "spec.block_sparse.csr.col_idx[17]: 300 is out of range [0, 256)");
  }
  {
    CsrGen g = Diagonal(8);
    g.col_idx[3] = -1;
    add("csr_col_negative", Sparse(g), kShape, "spec.block_sparse.csr.col_idx[3]");
  }
  {
    CsrGen g{{0, 3, 3, 3, 3, 3, 3, 3, 3}, {0, 5, 2}};
    add("csr_row_unsorted", Sparse(g), kShape, "spec.block_sparse.csr.col_idx[2]");
  }
  {
    CsrGen g{{0, 0, 3, 3, 3, 3, 3, 3, 3}, {1, 4, 4}};
    add("csr_row_duplicate", Sparse(g), kShape, "spec.block_sparse.csr.col_idx[2]",
        "spec.block_sparse.csr.col_idx[2]: duplicate column 4 in row 1");
  }

  AddNonSquareCases(cases);
  return cases;
}

class InvalidSpecTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidSpecTest, RejectedNamingTheField) {
  const InvalidCase& c = GetParam();
  const absl::Status status = ValidateSpec(c.spec, c.shape);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(c.field));
  if (!c.message.empty()) {
    EXPECT_EQ(status.message(), c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, InvalidSpecTest, ::testing::ValuesIn(InvalidCases()),
                         [](const auto& info) { return info.param.name; });

TEST(InvalidSpecTest, AtLeastThirtyCases) { EXPECT_GE(InvalidCases().size(), 30u); }

TEST(ValidateShapeTest, AcceptsValidShapes) {
  EXPECT_TRUE(ValidateShape(kShape).ok());
  EXPECT_TRUE(ValidateShape(ShapeWith(2, 1, 32, 8, kMaxHeadDim)).ok());
  EXPECT_TRUE(ValidateShape(ShapeWith(1, 1 << 20, 16, 1, 128)).ok());
  // 2^59 elements (2^62 bytes at 8 bytes each) still fit; 2^60 would not (bytes_overflow).
  EXPECT_TRUE(ValidateShape(ShapeWith(1, int64_t{1} << 40, 1 << 11, 1, 256)).ok());
}

TEST(ValidateSpecTest, AcceptsValidSpecs) {
  std::vector<AttentionSpec> valid = {
      Spec(DenseSpec{}),
      Spec(DenseSpec{}, true, 0.125f),
      Spec(WindowSpec{0}),
      Spec(WindowSpec{int64_t{1} << 62}, true),
      Spec(DilatedSpec{{2048, 4096}, {1, 2}}, true),
      Spec(DilatedSpec{{1}, {1}}),
      Spec(DilatedSpec{{16, 16}, {16, 16}}),  // rate == segment; duplicate branches
      Spec(DilatedSpec{{1 << 20}, {4}}),      // segment longer than the sequence
      Sparse(LocalWindowGen{0}),
      Sparse(LocalWindowGen{int64_t{1} << 62}, 64),
      Sparse(DilatedSparseGen{}),
      Sparse(DilatedSparseGen{{1, 1, 4, 1 << 30}}),
      Sparse(GlobalLocalGen{0, 0}),
      Sparse(GlobalLocalGen{int64_t{1} << 40, 3}),
      Sparse(StridedGen{1, 0}),
      Sparse(StridedGen{int64_t{1} << 62, 2}),
      Sparse(RandomGen{0.0, 0}),
      Sparse(RandomGen{1.0, ~uint64_t{0}}),
      Sparse(Diagonal(8)),
      Sparse(CsrGen{{0, 0, 0, 0, 0, 0, 0, 0, 0}, {}}),  // no blocks at all
      Sparse(CsrGen{{0, 8, 8, 8, 8, 8, 8, 8, 8}, {0, 1, 2, 3, 4, 5, 6, 7}}),
  };
  for (size_t i = 0; i < valid.size(); ++i) {
    EXPECT_TRUE(ValidateSpec(valid[i], kShape).ok())
        << "case " << i << ": " << ValidateSpec(valid[i], kShape);
  }
}

TEST(ValidateSpecTest, AcceptsOffsetsAndPackedSequences) {
  const AttentionShape decode{2, 1, 8, 2, 64, 4097};
  AttentionSpec spec = Spec(WindowSpec{100}, true);
  spec.q_offset = 4096;
  EXPECT_TRUE(ValidateSpec(spec, decode).ok()) << ValidateSpec(spec, decode);
  spec.q_offset = 4097;  // right after the last key
  EXPECT_TRUE(ValidateSpec(spec, decode).ok()) << ValidateSpec(spec, decode);
  // More queries than keys from offset 0, and a csr over the extent max(0 + 1000, 300).
  AttentionSpec csr = Sparse(Diagonal(8));
  EXPECT_TRUE(ValidateSpec(csr, AttentionShape{1, 1000, 8, 8, 64, 300}).ok());
  // Packed: an empty sequence, one with keys only, decode, square; the csr covers 1000 keys.
  csr.cu_seqlens_q = {0, 0, 0, 1, 999};
  csr.cu_seqlens_k = {0, 0, 30, 1030, 2030};
  const AttentionShape packed{1, 999, 8, 8, 64, 2030};
  EXPECT_TRUE(ValidateSpec(csr, packed).ok()) << ValidateSpec(csr, packed);
  // Key shards up to the longest sequence allowed (2^60 positions), queries at its end.
  AttentionSpec shard = Spec(WindowSpec{100}, true);
  shard.kv_total = int64_t{1} << 60;
  shard.k_offset = shard.kv_total - 4097;
  shard.q_offset = shard.kv_total;
  EXPECT_TRUE(ValidateSpec(shard, decode).ok()) << ValidateSpec(shard, decode);
}

TEST(ValidateSpecTest, IsSquareAndPatternExtent) {
  AttentionSpec spec;
  EXPECT_TRUE(IsSquare(spec, kShape));
  EXPECT_EQ(PatternExtent(spec, kShape), 1000);
  AttentionShape same = kShape;
  same.kv_tokens = 1000;  // set but equal: still square
  EXPECT_TRUE(IsSquare(spec, same));
  AttentionShape longer = kShape;
  longer.kv_tokens = 1200;
  EXPECT_EQ(longer.kv_len(), 1200);
  EXPECT_FALSE(IsSquare(spec, longer));
  EXPECT_EQ(PatternExtent(spec, longer), 1200);
  spec.q_offset = 700;
  EXPECT_FALSE(IsSquare(spec, same));
  EXPECT_EQ(PatternExtent(spec, longer), 1700);
  spec.q_offset = 0;
  spec.cu_seqlens_q = {0, 1000};
  spec.cu_seqlens_k = {0, 1000};
  EXPECT_TRUE(IsPacked(spec));
  EXPECT_FALSE(IsSquare(spec, kShape));  // packed, even as one square sequence
  spec.cu_seqlens_q = {0, 400, 1000};
  spec.cu_seqlens_k = {0, 700, 1200};
  EXPECT_EQ(PatternExtent(spec, longer), 700);
}

TEST(WindowWithinTest, ClampsToTheExtent) {
  EXPECT_EQ(WindowWithin(Spec(WindowSpec{9}, false), 100), 9);
  EXPECT_EQ(WindowWithin(Spec(WindowSpec{std::numeric_limits<int64_t>::max()}, true), 100), 100);
  EXPECT_EQ(WindowWithin(Spec(DenseSpec{}, false), 100), std::nullopt);
}

TEST(EffectiveScaleTest, DefaultAndExplicit) {
  EXPECT_FLOAT_EQ(EffectiveScale(Spec(DenseSpec{}), 64), 0.125f);
  EXPECT_FLOAT_EQ(EffectiveScale(Spec(DenseSpec{}), 128),
                  static_cast<float>(1.0 / std::sqrt(128.0)));
  EXPECT_FLOAT_EQ(EffectiveScale(Spec(DenseSpec{}, false, 0.5f), 64), 0.5f);
  EXPECT_FLOAT_EQ(EffectiveScale(Spec(WindowSpec{3}, true, 2.f), 256), 2.f);
}

TEST(NamesTest, PatternAndGeneratorNames) {
  EXPECT_EQ(PatternName(DenseSpec{}), "dense");
  EXPECT_EQ(PatternName(WindowSpec{}), "window");
  EXPECT_EQ(PatternName(DilatedSpec{}), "dilated");
  EXPECT_EQ(PatternName(BlockSparseSpec{}), "block_sparse");
  EXPECT_EQ(GeneratorName(LocalWindowGen{}), "local_window");
  EXPECT_EQ(GeneratorName(DilatedSparseGen{}), "dilated_sparse");
  EXPECT_EQ(GeneratorName(GlobalLocalGen{}), "global_local");
  EXPECT_EQ(GeneratorName(StridedGen{}), "strided");
  EXPECT_EQ(GeneratorName(RandomGen{}), "random");
  EXPECT_EQ(GeneratorName(CsrGen{}), "csr");
}

TEST(RandomRowBlocksTest, DistinctSortedOffDiagonalWithTheRightCount) {
  for (int64_t nb : {1, 2, 3, 10, 37, 100, 1000}) {
    for (double keep : {0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.99, 1.0}) {
      const int64_t expected = std::min<int64_t>(std::llround(keep * nb), nb - 1);
      for (int64_t row = 0; row < nb; row += std::max<int64_t>(1, nb / 7)) {
        const std::vector<int64_t> blocks = RandomRowBlocks(row, nb, keep, 1234);
        ASSERT_EQ(static_cast<int64_t>(blocks.size()), expected)
            << "nb " << nb << " keep " << keep << " row " << row;
        for (size_t e = 0; e < blocks.size(); ++e) {
          EXPECT_NE(blocks[e], row);
          EXPECT_GE(blocks[e], 0);
          EXPECT_LT(blocks[e], nb);
          if (e > 0) {
            EXPECT_LT(blocks[e - 1], blocks[e]);
          }
        }
      }
    }
  }
}

TEST(RandomRowBlocksTest, DeterministicPerSeedAndRow) {
  const std::vector<int64_t> a = RandomRowBlocks(17, 500, 0.1, 99);
  EXPECT_EQ(a, RandomRowBlocks(17, 500, 0.1, 99));
  EXPECT_NE(a, RandomRowBlocks(17, 500, 0.1, 100));
  EXPECT_NE(a, RandomRowBlocks(18, 500, 0.1, 99));
}

// Pins the documented algorithm: these values come from an independent Python implementation of
// the comment above RandomRowBlocks (splitmix64 stream, Lemire reduction, Floyd's sampling).
TEST(RandomRowBlocksTest, MatchesTheDocumentedAlgorithm) {
  EXPECT_EQ(RandomRowBlocks(5, 100, 0.1, 42),
            (std::vector<int64_t>{4, 7, 8, 16, 18, 28, 39, 69, 75, 86}));
  EXPECT_EQ(RandomRowBlocks(0, 37, 0.25, 0xDEADBEEFCAFEF00Dull),
            (std::vector<int64_t>{6, 8, 12, 16, 22, 27, 28, 30, 31}));
  EXPECT_EQ(RandomRowBlocks(36, 37, 0.25, 0xDEADBEEFCAFEF00Dull),
            (std::vector<int64_t>{2, 18, 20, 23, 24, 28, 29, 31, 35}));
}

TEST(RandomRowBlocksTest, AllOthersWhenKeepIsOne) {
  const std::vector<int64_t> blocks = RandomRowBlocks(3, 6, 1.0, 7);
  EXPECT_EQ(blocks, (std::vector<int64_t>{0, 1, 2, 4, 5}));
  EXPECT_TRUE(RandomRowBlocks(0, 1, 1.0, 7).empty());
}

TEST(RandomRowBlocksTest, SmallKeepOnHugeLayoutsDoesNotScaleWithBlocks) {
  // 2^40 blocks: anything O(nb) would not finish or not fit.
  const int64_t nb = int64_t{1} << 40;
  const std::vector<int64_t> blocks = RandomRowBlocks(nb / 2, nb, 1e-11, 5);
  EXPECT_EQ(blocks.size(), 11u);
}

TEST(RandomRowBlocksTest, RoughlyUniform) {
  // Over many rows every candidate offset should be picked about equally often.
  constexpr int64_t kNb = 50;
  constexpr int kRows = 20000;
  std::vector<int64_t> hits(kNb, 0);
  int64_t total = 0;
  for (int row_seed = 0; row_seed < kRows; ++row_seed) {
    for (int64_t b : RandomRowBlocks(0, kNb, 0.2, row_seed)) {
      ++hits[b];
      ++total;
    }
  }
  const double expected = static_cast<double>(total) / (kNb - 1);
  EXPECT_EQ(hits[0], 0);
  for (int64_t b = 1; b < kNb; ++b) EXPECT_NEAR(hits[b], expected, 0.06 * expected) << b;
}

}  // namespace
}  // namespace attnserve
