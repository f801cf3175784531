// Times the pattern compiler on long sequences and reports what each layout costs.
//
//   compile_bench [tokens=1048576] [--json]
//
// For every spec: compile time, AdmittedPairs() time, kept blocks, sparsity (fraction of block
// pairs skipped), admitted token pairs, and the layout's bytes. Each layout is also checked: CSR
// well formed (row_ptr non-decreasing from 0 to kept, columns ascending and in range) and, for
// dense specs, AdmittedPairs() equal to N^2 (N(N+1)/2 causal). A failed check exits non-zero.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/spec/attention_spec.h"
#include "core/spec/block_layout.h"
#include "core/spec/pattern_compiler.h"

namespace attnserve {
namespace {

struct BenchCase {
  std::string name;
  AttentionSpec spec;
  std::optional<int64_t> expected_pairs;  // known in closed form (dense)
};

AttentionSpec Spec(AttentionPattern pattern, bool causal) {
  AttentionSpec spec;
  spec.pattern = std::move(pattern);
  spec.causal = causal;
  return spec;
}

bool WellFormed(const BlockLayout& layout) {
  if (static_cast<int64_t>(layout.row_ptr.size()) != layout.num_blocks + 1) return false;
  if (layout.row_ptr.front() != 0 || layout.row_ptr.back() != layout.kept_blocks()) return false;
  if (layout.mask.size() != layout.col_idx.size()) return false;
  for (int64_t i = 0; i < layout.num_blocks; ++i) {
    if (layout.row_ptr[i] > layout.row_ptr[i + 1]) return false;
    for (int64_t e = layout.row_ptr[i]; e < layout.row_ptr[i + 1]; ++e) {
      if (layout.col_idx[e] < 0 || layout.col_idx[e] >= layout.num_blocks) return false;
      if (e > layout.row_ptr[i] && layout.col_idx[e - 1] >= layout.col_idx[e]) return false;
    }
  }
  return true;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Run(int64_t n, bool json) {
  const std::vector<BenchCase> cases = {
      {"dense", Spec(DenseSpec{}, false), n * n},
      {"dense causal", Spec(DenseSpec{}, true), n * (n + 1) / 2},
      {"window(n/200)", Spec(WindowSpec{n / 200}, false), std::nullopt},
      {"window(n/2000) causal", Spec(WindowSpec{n / 2000}, true), std::nullopt},
      {"local_window(40) b128", Spec(BlockSparseSpec{128, LocalWindowGen{40}}, false),
       std::nullopt},
      {"local_window(3) b128", Spec(BlockSparseSpec{128, LocalWindowGen{3}}, false), std::nullopt},
      {"random(0.01) b128", Spec(BlockSparseSpec{128, RandomGen{0.01, 1}}, false), std::nullopt},
      {"random(0.001) b64 causal", Spec(BlockSparseSpec{64, RandomGen{0.001, 1}}, true),
       std::nullopt},
      {"strided(256,8) b128", Spec(BlockSparseSpec{128, StridedGen{256, 8}}, false), std::nullopt},
      {"global_local(4,8) b64", Spec(BlockSparseSpec{64, GlobalLocalGen{4, 8}}, true),
       std::nullopt},
      {"dilated_sparse(1,2,4..) b64",
       Spec(BlockSparseSpec{64, DilatedSparseGen{{1, 2, 4, 8, 16, 32, 64, 128, 256}}}, false),
       std::nullopt},
  };
  bool all_ok = true;
  if (!json) {
    std::printf("tokens %lld\n\n", static_cast<long long>(n));
    std::printf(
        "| spec | compile ms | pairs ms | kept blocks | sparsity | pairs kept | MB | check |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---|\n");
  }
  for (const BenchCase& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    auto layout = CompileBlockLayout(c.spec, n);
    const double compile_s = Seconds(start);
    if (!layout.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), layout.status().ToString().c_str());
      all_ok = false;
      continue;
    }
    const auto pairs_start = std::chrono::steady_clock::now();
    const int64_t pairs = layout->AdmittedPairs();
    const double pairs_s = Seconds(pairs_start);
    const bool ok = WellFormed(*layout) && (!c.expected_pairs || pairs == *c.expected_pairs);
    all_ok &= ok;
    const double pair_fraction = static_cast<double>(pairs) / (static_cast<double>(n) * n);
    if (json) {
      std::printf(
          "{\"spec\": \"%s\", \"tokens\": %lld, \"compile_s\": %.6f, \"admitted_pairs_s\": %.6f, "
          "\"kept_blocks\": %lld, \"sparsity\": %.6f, \"admitted_pairs\": %lld, "
          "\"layout_bytes\": %lld, \"check\": %s}\n",
          c.name.c_str(), static_cast<long long>(n), compile_s, pairs_s,
          static_cast<long long>(layout->kept_blocks()), layout->sparsity(),
          static_cast<long long>(pairs), static_cast<long long>(layout->MemoryBytes()),
          ok ? "true" : "false");
    } else {
      std::printf("| %s | %.2f | %.2f | %lld | %.5f | %.5f | %.2f | %s |\n", c.name.c_str(),
                  compile_s * 1e3, pairs_s * 1e3, static_cast<long long>(layout->kept_blocks()),
                  layout->sparsity(), pair_fraction, layout->MemoryBytes() / 1e6,
                  ok ? "ok" : "FAILED");
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  int64_t tokens = int64_t{1} << 20;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      tokens = std::strtoll(argv[i], nullptr, 10);
      if (tokens < 1) {
        std::fprintf(stderr, "usage: %s [tokens >= 1] [--json]\n", argv[0]);
        return 2;
      }
    }
  }
  return attnserve::Run(tokens, json);
}
