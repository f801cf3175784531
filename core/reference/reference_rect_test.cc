// The reference on requests that are not square (DESIGN "The math": positions, packed batches):
// hand-computed tiny cases, and the identities that define the rules (decode and chunked prefill
// are rows of a square run, a packed batch is its sequences run alone) for every spec kind.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/reference/reference.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_test_util.h"

namespace attnserve {
namespace {

using ::attnserve::testing::FreshSeed;
using ::attnserve::testing::MakeRandomInputs;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int32_t kBlock = 64;

// Rows [begin, end) of dim 1 of a [B, N, H, D] tensor.
HostTensor Rows(const HostTensor& t, int64_t begin, int64_t end) {
  HostTensor out = *HostTensor::Create(t.dtype(), {t.dim(0), end - begin, t.dim(2), t.dim(3)});
  const size_t row = static_cast<size_t>(t.dim(2) * t.dim(3)) * DTypeSize(t.dtype());
  if (end == begin) return out;
  for (int64_t b = 0; b < t.dim(0); ++b) {
    std::memcpy(out.data() + b * (end - begin) * row, t.data() + (b * t.dim(1) + begin) * row,
                (end - begin) * row);
  }
  return out;
}

// [1, sum N_i, H, D]: the tensors one after the other along dim 1.
HostTensor Concat(const std::vector<const HostTensor*>& parts) {
  int64_t n = 0;
  for (const HostTensor* p : parts) n += p->dim(1);
  const HostTensor& first = *parts.front();
  HostTensor out = *HostTensor::Create(first.dtype(), {1, n, first.dim(2), first.dim(3)});
  size_t at = 0;
  for (const HostTensor* p : parts) {
    if (p->nbytes() == 0) continue;
    std::memcpy(out.data() + at, p->data(), p->nbytes());
    at += p->nbytes();
  }
  return out;
}

// Rows [begin, end) of a result for B = 1, `heads` query heads of `d` and n rows in all.
ReferenceResult ResultRows(const ReferenceResult& r, int64_t n, int64_t heads, int64_t d,
                           int64_t begin, int64_t end) {
  ReferenceResult out;
  out.o.assign(r.o.begin() + begin * heads * d, r.o.begin() + end * heads * d);
  for (int64_t h = 0; h < heads; ++h) {
    out.lse.insert(out.lse.end(), r.lse.begin() + h * n + begin, r.lse.begin() + h * n + end);
  }
  return out;
}

void ExpectSame(const ReferenceResult& a, const ReferenceResult& b) {
  ASSERT_EQ(a.o.size(), b.o.size());
  ASSERT_EQ(a.lse.size(), b.lse.size());
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], 1e-12) << "o[" << i << "]";
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(a.lse[i]) || std::isinf(b.lse[i])) {
      ASSERT_EQ(a.lse[i], b.lse[i]) << "lse[" << i << "]";
    } else {
      ASSERT_NEAR(a.lse[i], b.lse[i], 1e-12) << "lse[" << i << "]";
    }
  }
}

// A csr layout over nb blocks whose top-left corners agree across nb: row i keeps blocks 0,
// i - 2, i and i + 1.
CsrGen CsrFor(int64_t nb) {
  CsrGen g;
  g.row_ptr.push_back(0);
  for (int64_t i = 0; i < nb; ++i) {
    std::set<int64_t> cols = {0, i};
    if (i >= 2) cols.insert(i - 2);
    if (i + 1 < nb) cols.insert(i + 1);
    g.col_idx.insert(g.col_idx.end(), cols.begin(), cols.end());
    g.row_ptr.push_back(static_cast<int64_t>(g.col_idx.size()));
  }
  return g;
}

// Every spec kind (each block_sparse generator), for a problem of nb blocks of kBlock.
std::vector<std::pair<std::string, AttentionSpec>> AllKinds(int64_t nb, bool causal) {
  std::vector<std::pair<std::string, AttentionSpec>> kinds = {
      {"dense", AttentionSpec{DenseSpec{}}},
      {"window", AttentionSpec{WindowSpec{7}}},
      {"dilated", AttentionSpec{DilatedSpec{{16, 48, 512}, {1, 4, 8}}}},
      {"local_window", AttentionSpec{BlockSparseSpec{kBlock, LocalWindowGen{1}}}},
      {"dilated_sparse", AttentionSpec{BlockSparseSpec{kBlock, DilatedSparseGen{{2}}}}},
      {"global_local", AttentionSpec{BlockSparseSpec{kBlock, GlobalLocalGen{1, 0}}}},
      {"strided", AttentionSpec{BlockSparseSpec{kBlock, StridedGen{3, 0}}}},
      {"random", AttentionSpec{BlockSparseSpec{kBlock, RandomGen{0.4, 77}}}},
      {"csr", AttentionSpec{BlockSparseSpec{kBlock, CsrFor(nb)}}},
  };
  for (auto& [name, spec] : kinds) spec.causal = causal;
  return kinds;
}

class ReferenceRectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = FreshSeed();
    RecordProperty("seed", std::to_string(seed_));
    std::printf("seed %llu (replay with ATTN_TEST_SEED)\n", static_cast<unsigned long long>(seed_));
  }
  uint64_t seed_ = 0;
};

// One query (D = 1, scale 1, q = 1) against keys k = (0, 1), v = (1, 3): scores (0, 1).
TEST_F(ReferenceRectTest, HandComputedOffsets) {
  auto q = *HostTensor::Create(DType::kF32, {1, 1, 1, 1});
  auto k = *HostTensor::Create(DType::kF32, {1, 2, 1, 1});
  auto v = *HostTensor::Create(DType::kF32, {1, 2, 1, 1});
  q.SetFloat(0, 1.f);
  k.SetFloat(0, 0.f);
  k.SetFloat(1, 1.f);
  v.SetFloat(0, 1.f);
  v.SetFloat(1, 3.f);
  AttentionSpec spec;
  spec.scale = 1.f;
  spec.causal = true;
  // At position 0 (offset 0) the causal query sees key 0 only: O = v0, LSE = 0.
  auto r = *ReferenceAttention(spec, q, k, v);
  EXPECT_DOUBLE_EQ(r.o[0], 1.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.0);
  // At position 1 (bottom-right: offset Nkv - Nq) it sees both: O = (1 + 3e) / (1 + e).
  spec.q_offset = 1;
  r = *ReferenceAttention(spec, q, k, v);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.o[0], (1 + 3 * e) / (1 + e), 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(1 + e), 1e-15);
  // A window of 0 at position 1 sees key 1 only; at position 2 (offset = Nkv) no key at all.
  spec.causal = false;
  spec.pattern = WindowSpec{0};
  r = *ReferenceAttention(spec, q, k, v);
  EXPECT_DOUBLE_EQ(r.o[0], 3.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 1.0);
  spec.q_offset = 2;
  r = *ReferenceAttention(spec, q, k, v);
  EXPECT_EQ(r.o[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
}

// Dilated segments by global position: with segment 2 and rate 1 the query at position 2 is in
// segment 1 and sees only key 2; the one at position 3 sees keys 2 and 3, of which only key 2
// exists when Nkv = 3.
TEST_F(ReferenceRectTest, HandComputedDilatedSegments) {
  auto q = *HostTensor::Create(DType::kF32, {1, 2, 1, 1});
  auto k = *HostTensor::Create(DType::kF32, {1, 3, 1, 1});
  auto v = *HostTensor::Create(DType::kF32, {1, 3, 1, 1});
  for (int64_t i = 0; i < 2; ++i) q.SetFloat(i, 1.f);
  for (int64_t j = 0; j < 3; ++j) {
    k.SetFloat(j, static_cast<float>(j));
    v.SetFloat(j, static_cast<float>(10 * (j + 1)));
  }
  AttentionSpec spec;
  spec.pattern = DilatedSpec{{2}, {1}};
  spec.scale = 1.f;
  spec.q_offset = 2;
  auto r = *ReferenceAttention(spec, q, k, v);
  EXPECT_DOUBLE_EQ(r.o[0], 30.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 2.0);
  EXPECT_DOUBLE_EQ(r.o[1], 30.0);
  EXPECT_DOUBLE_EQ(r.lse[1], 2.0);
  // Rate 2 at head 0 (offset 0): the query at position 3 is outside the set: O = 0, LSE = -inf.
  spec.pattern = DilatedSpec{{2}, {2}};
  r = *ReferenceAttention(spec, q, k, v);
  EXPECT_DOUBLE_EQ(r.o[0], 30.0);
  EXPECT_EQ(r.o[1], 0.0);
  EXPECT_EQ(r.lse[1], -kInf);
}

// Decode and the last chunk of a prefill: queries [p, N) at offset p against all N keys are rows
// p..N-1 of the square run, for every kind, causal or not (same keys, same extent).
TEST_F(ReferenceRectTest, LastChunkEqualsRowsOfSquareRun) {
  const int64_t N = 200, Hq = 4, D = 8;
  auto in = MakeRandomInputs(AttentionShape{1, N, Hq, 2, D}, DType::kF32, seed_);
  for (bool causal : {false, true}) {
    for (const auto& [name, spec] : AllKinds(NumBlocks(N, kBlock), causal)) {
      SCOPED_TRACE(name + (causal ? " causal" : ""));
      const ReferenceResult full = *ReferenceAttention(spec, in.q, in.k, in.v);
      for (int64_t p : {N - 1, int64_t{70}, int64_t{128}}) {
        SCOPED_TRACE(p);
        AttentionSpec chunk = spec;
        chunk.q_offset = p;
        auto r = ReferenceAttention(chunk, Rows(in.q, p, N), in.k, in.v);
        ASSERT_TRUE(r.ok()) << r.status();
        ExpectSame(*r, ResultRows(full, N, Hq, D, p, N));
      }
    }
  }
}

// Chunked prefill: queries [p, p + c) at offset p against keys [0, p + c) are rows p..p+c-1 of the
// causal square run of any longer sequence. Random is the exception: its block count follows the
// extent (DESIGN), so its chunk equals the square run of length p + c only (the test above).
TEST_F(ReferenceRectTest, CausalChunkEqualsRowsOfLongerSquareRun) {
  const int64_t N = 260, Hq = 4, D = 8;
  auto in = MakeRandomInputs(AttentionShape{1, N, Hq, 2, D}, DType::kF32, seed_);
  const auto full_kinds = AllKinds(NumBlocks(N, kBlock), true);
  for (const auto& [p, c] : {std::pair<int64_t, int64_t>{70, 50}, {0, 64}, {64, 1}, {100, 90}}) {
    const auto chunk_kinds = AllKinds(NumBlocks(p + c, kBlock), true);
    for (size_t x = 0; x < full_kinds.size(); ++x) {
      const auto& [name, spec] = full_kinds[x];
      if (name == "random") continue;
      SCOPED_TRACE(name + " p=" + std::to_string(p) + " c=" + std::to_string(c));
      const ReferenceResult full = *ReferenceAttention(spec, in.q, in.k, in.v);
      AttentionSpec chunk = chunk_kinds[x].second;  // csr: the top-left corner of the same layout
      chunk.q_offset = p;
      auto r = ReferenceAttention(chunk, Rows(in.q, p, p + c), Rows(in.k, 0, p + c),
                                  Rows(in.v, 0, p + c));
      ASSERT_TRUE(r.ok()) << r.status();
      ExpectSame(*r, ResultRows(full, N, Hq, D, p, p + c));
    }
  }
}

// A packed batch is its sequences run alone (each bottom-right aligned), whatever their lengths:
// empty ones, one without queries, decode, square, chunks.
TEST_F(ReferenceRectTest, PackedEqualsSequencesRunAlone) {
  const int64_t Hq = 4, Hkv = 2, D = 8;
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{1, 150}, {0, 0}, {70, 70},
                                                         {30, 200}, {0, 20}, {64, 129}};
  std::vector<HostTensor> qs, ks, vs;
  std::vector<int64_t> cu_q = {0}, cu_k = {0};
  int64_t longest = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [nq, nkv] = seqs[s];
    auto q = *HostTensor::Create(DType::kF32, {1, nq, Hq, D});
    auto kv = MakeRandomInputs(AttentionShape{1, std::max<int64_t>(nkv, 1), Hq, Hkv, D},
                               DType::kF32, seed_ + s);
    FillUniform(q, seed_ * 7 + s, -2.f, 2.f);
    qs.push_back(std::move(q));
    ks.push_back(Rows(kv.k, 0, nkv));
    vs.push_back(Rows(kv.v, 0, nkv));
    cu_q.push_back(cu_q.back() + nq);
    cu_k.push_back(cu_k.back() + nkv);
    longest = std::max(longest, nkv);
  }
  std::vector<const HostTensor*> qp, kp, vp;
  for (size_t s = 0; s < seqs.size(); ++s) {
    qp.push_back(&qs[s]);
    kp.push_back(&ks[s]);
    vp.push_back(&vs[s]);
  }
  const HostTensor q = Concat(qp), k = Concat(kp), v = Concat(vp);
  for (bool causal : {false, true}) {
    const auto kinds = AllKinds(NumBlocks(longest, kBlock), causal);
    for (size_t x = 0; x < kinds.size(); ++x) {
      AttentionSpec packed = kinds[x].second;
      SCOPED_TRACE(kinds[x].first + (causal ? " causal" : ""));
      packed.cu_seqlens_q = cu_q;
      packed.cu_seqlens_k = cu_k;
      auto all = ReferenceAttention(packed, q, k, v);
      ASSERT_TRUE(all.ok()) << all.status();
      for (size_t s = 0; s < seqs.size(); ++s) {
        const auto [nq, nkv] = seqs[s];
        if (nq == 0) continue;
        SCOPED_TRACE(s);
        AttentionSpec alone = AllKinds(NumBlocks(nkv, kBlock), causal)[x].second;
        alone.q_offset = nkv - nq;
        auto r = ReferenceAttention(alone, qs[s], ks[s], vs[s]);
        ASSERT_TRUE(r.ok()) << r.status();
        ExpectSame(*r, ResultRows(*all, q.dim(1), Hq, D, cu_q[s], cu_q[s + 1]));
      }
    }
  }
}

// More queries than keys from offset 0: the causal rows past the last key see every key, so row
// i >= Nkv equals the dense (non-causal) row; a window leaves the far rows with no key at all.
TEST_F(ReferenceRectTest, MoreQueriesThanKeys) {
  const int64_t Nq = 40, Nkv = 10, D = 8;
  auto in = MakeRandomInputs(AttentionShape{1, Nq, 2, 1, D}, DType::kF32, seed_);
  const HostTensor k = Rows(in.k, 0, Nkv), v = Rows(in.v, 0, Nkv);
  AttentionSpec causal;
  causal.causal = true;
  const ReferenceResult c = *ReferenceAttention(causal, in.q, k, v);
  const ReferenceResult d = *ReferenceAttention(AttentionSpec{}, in.q, k, v);
  ExpectSame(ResultRows(c, Nq, 2, D, Nkv - 1, Nq), ResultRows(d, Nq, 2, D, Nkv - 1, Nq));
  AttentionSpec window;
  window.pattern = WindowSpec{5};
  const ReferenceResult w = *ReferenceAttention(window, in.q, k, v);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < Nq; ++i) {
      EXPECT_EQ(std::isinf(w.lse[h * Nq + i]), i > Nkv - 1 + 5) << i;
    }
  }
}

TEST_F(ReferenceRectTest, RejectsBadOffsetsAndPacking) {
  auto q = *HostTensor::Create(DType::kF32, {1, 4, 1, 8});
  auto k = *HostTensor::Create(DType::kF32, {1, 6, 1, 8});
  AttentionSpec spec;
  spec.q_offset = 7;
  auto r = ReferenceAttention(spec, q, k, k);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.q_offset"), std::string::npos) << r.status();
  spec.q_offset = 0;
  spec.cu_seqlens_q = {0, 3, 4};
  spec.cu_seqlens_k = {0, 2, 6};  // sequence 0: 3 queries, 2 keys
  r = ReferenceAttention(spec, q, k, k);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.cu_seqlens_q[1]"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace attnserve
