#include "bench/cuda/cases.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace attnserve::bench {
namespace {

AttentionShape Shape(int64_t b, int64_t n, int64_t hq, int64_t hkv, int64_t d) {
  return AttentionShape{b, n, hq, hkv, d};
}

// Random generator keep fraction giving `sparsity` skipped at nb blocks: each row keeps the
// diagonal plus round(keep * nb) others.
double KeepFor(double sparsity, int64_t nb) {
  const double kept_per_row = (1.0 - sparsity) * static_cast<double>(nb);
  return std::max(0.0, (kept_per_row - 1.0) / static_cast<double>(nb));
}
// Local window width giving ~`sparsity`: 2W + 1 kept blocks per row.
int64_t WidthFor(double sparsity, int64_t nb) {
  const double kept_per_row = (1.0 - sparsity) * static_cast<double>(nb);
  return std::max<int64_t>(0, std::llround((kept_per_row - 1.0) / 2.0));
}

}  // namespace

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  // Dense: bf16, D = 128, Hq = Hkv = 16, B * N = 16384 tokens (B = 1 at 65536).
  for (int64_t n : {4096, 16384, 65536}) {
    for (bool causal : {false, true}) {
      Case c;
      c.name = absl::StrCat("dense_n", n, causal ? "_causal" : "");
      c.group = "dense";
      c.spec.pattern = DenseSpec{};
      c.spec.causal = causal;
      c.shape = Shape(std::max<int64_t>(1, 16384 / n), n, 16, 16, 128);
      cases.push_back(c);
    }
  }
  // Dense at D = 64 (the other head dim the kernels implement), N = 16384, B = 1, Hq = Hkv = 16:
  // a group of its own so that "dense" keeps its D = 128 cases only.
  for (bool causal : {false, true}) {
    Case c;
    c.name = absl::StrCat("dense_d64_n16384", causal ? "_causal" : "");
    c.group = "dense_d64";
    c.spec.pattern = DenseSpec{};
    c.spec.causal = causal;
    c.shape = Shape(1, 16384, 16, 16, 64);
    cases.push_back(c);
  }
  // Block sparse at N = 65536 (block 128, 512 blocks): 90% and 99% skipped.
  {
    const int64_t n = 65536, nb = n / 128;
    for (double s : {0.90, 0.99}) {
      const std::string tag = s < 0.95 ? "s90" : "s99";
      Case c;
      c.group = "sparse";
      c.shape = Shape(1, n, 16, 16, 128);
      c.dump_csr = true;
      c.name = absl::StrCat("sparse_random_", tag);
      c.spec.pattern = BlockSparseSpec{128, RandomGen{KeepFor(s, nb), 2024}};
      cases.push_back(c);
      c.name = absl::StrCat("sparse_local_window_", tag);
      c.spec.pattern = BlockSparseSpec{128, LocalWindowGen{WidthFor(s, nb)}};
      cases.push_back(c);
    }
  }
  // The random layout's L2 footprint: sparse_random_s99's rows (the diagonal and 4 random blocks
  // each, so the same 8192 items of 5 tiles) over N = 32768 and 32 heads, so that a head's K/V
  // is 16 MB instead of 32. Against sparse_random_s99 it says what the L2 capacity costs the
  // random layout (whose rows share no tiles, unlike local_window's).
  {
    const int64_t n = 32768, nb = n / 128;
    Case c;
    c.group = "sparse_l2";
    c.shape = Shape(1, n, 32, 32, 128);
    c.dump_csr = true;
    c.name = "sparse_random_s98_n32768_h32";
    c.spec.pattern = BlockSparseSpec{128, RandomGen{4.0 / static_cast<double>(nb), 2024}};
    cases.push_back(c);
  }
  // Block sparse at layout block 64 (N = 65536, 1024 blocks): the kernels' other block size.
  {
    const int64_t n = 65536, nb = n / 64;
    for (double s : {0.90, 0.99}) {
      Case c;
      c.group = "sparse_b64";
      c.shape = Shape(1, n, 16, 16, 128);
      c.name = absl::StrCat("sparse_b64_random_", s < 0.95 ? "s90" : "s99");
      c.spec.pattern = BlockSparseSpec{64, RandomGen{KeepFor(s, nb), 2025}};
      cases.push_back(c);
    }
  }
  // Dilated (LongNet): segments [2048, 4096, 8192, 16384], rates [1, 2, 4, 8], Hq = 8.
  for (int64_t n : {65536, 1048576}) {
    Case c;
    c.name = absl::StrCat("dilated_n", n);
    c.group = "dilated";
    c.spec.pattern = DilatedSpec{{2048, 4096, 8192, 16384}, {1, 2, 4, 8}};
    c.shape = Shape(1, n, 8, 8, 128);
    if (n > 65536) c.iters = 3;
    cases.push_back(c);
  }
  // Pattern compile of 1M tokens at 99.9% skipped (and the run, which is cheap).
  {
    const int64_t n = 1048576, nb = n / 128;
    Case c;
    c.name = "compile_n1048576_s999";
    c.group = "compile";
    c.spec.pattern = BlockSparseSpec{128, RandomGen{KeepFor(0.999, nb), 77}};
    c.shape = Shape(1, n, 8, 8, 128);
    c.dump_csr = true;
    c.iters = 3;
    cases.push_back(c);
  }
  // Heavy: dense causal over 1M tokens; block sparse 99.9% at 8M tokens.
  {
    Case c;
    c.name = "huge_dense_causal_n1048576";
    c.group = "huge";
    c.spec.pattern = DenseSpec{};
    c.spec.causal = true;
    c.shape = Shape(1, 1048576, 8, 8, 128);
    c.warmup = 0;
    c.iters = 1;
    cases.push_back(c);
  }
  {
    const int64_t n = 8388608, nb = n / 128;
    Case c;
    c.name = "huge_sparse_n8388608_s999";
    c.group = "huge";
    c.spec.pattern = BlockSparseSpec{128, RandomGen{KeepFor(0.999, nb), 88}};
    c.shape = Shape(1, n, 4, 4, 128);
    c.warmup = 1;
    c.iters = 2;
    cases.push_back(c);
  }
  return cases;
}

bool Selected(const Case& c, const std::string& sel) {
  if (sel == "all") return true;
  for (absl::string_view s : absl::StrSplit(sel, ',')) {
    if (s == c.name || s == c.group) return true;
  }
  return false;
}

std::string DescribeSpec(const AttentionSpec& spec) {
  std::string s(PatternName(spec.pattern));
  if (const auto* bs = std::get_if<BlockSparseSpec>(&spec.pattern)) {
    absl::StrAppend(&s, "/", std::string(GeneratorName(bs->generator)), "/b", bs->block_size);
    if (const auto* r = std::get_if<RandomGen>(&bs->generator)) {
      absl::StrAppendFormat(&s, "/keep=%.6f", r->keep);
    }
    if (const auto* w = std::get_if<LocalWindowGen>(&bs->generator)) {
      absl::StrAppend(&s, "/width=", w->width);
    }
  }
  if (const auto* d = std::get_if<DilatedSpec>(&spec.pattern)) {
    absl::StrAppend(&s, "/w=[", absl::StrJoin(d->segment_lengths, ","), "]/r=[",
                    absl::StrJoin(d->dilation_rates, ","), "]");
  }
  if (spec.causal) s += "/causal";
  return s;
}

}  // namespace attnserve::bench
