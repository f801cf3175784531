#include "core/spec/attention_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// Helper for std::visit over the pattern and generator variants.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

absl::Status Invalid(absl::string_view field, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", rule));
}

// "spec.dilated.dilation_rates" + 1 -> "spec.dilated.dilation_rates[1]".
std::string Indexed(absl::string_view field, size_t i) { return absl::StrCat(field, "[", i, "]"); }

absl::Status CheckAtLeast(absl::string_view field, int64_t value, int64_t min) {
  if (value < min) return Invalid(field, absl::StrCat("must be >= ", min, ", got ", value));
  return absl::OkStatus();
}

// a * b, or nullopt when it does not fit in int64 (both operands >= 0).
std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// The splitmix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64 as a stream: each draw advances the state by the golden-ratio increment and mixes it.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return Mix64(state_);
  }
  // Uniform-ish integer in [0, bound) by Lemire's multiply-shift: floor(x * bound / 2^64). Not
  // rejection-sampled (bias below bound / 2^64, irrelevant here) so that every draw consumes
  // exactly one output and the sequence is trivially reproducible.
  uint64_t Below(uint64_t bound) { return absl::Uint128High64(absl::uint128(Next()) * bound); }

 private:
  uint64_t state_;
};

absl::Status ValidateGenerator(const BlockGenerator& generator, int64_t num_blocks, int64_t seq_len,
                               int32_t block_size) {
  return std::visit(
      Overloaded{
          [](const LocalWindowGen& g) {
            return CheckAtLeast("spec.block_sparse.local_window.width", g.width, 0);
          },
          [](const DilatedSparseGen& g) {
            for (size_t k = 0; k < g.rates.size(); ++k) {
              ATTN_RETURN_IF_ERROR(CheckAtLeast(
                  Indexed("spec.block_sparse.dilated_sparse.rates", k), g.rates[k], 1));
            }
            return absl::OkStatus();
          },
          [](const GlobalLocalGen& g) {
            ATTN_RETURN_IF_ERROR(
                CheckAtLeast("spec.block_sparse.global_local.global_blocks", g.global_blocks, 0));
            return CheckAtLeast("spec.block_sparse.global_local.width", g.width, 0);
          },
          [](const StridedGen& g) {
            ATTN_RETURN_IF_ERROR(CheckAtLeast("spec.block_sparse.strided.stride", g.stride, 1));
            return CheckAtLeast("spec.block_sparse.strided.width", g.width, 0);
          },
          [](const RandomGen& g) {
            // Written so that NaN fails too.
            if (!(g.keep >= 0.0 && g.keep <= 1.0)) {
              return Invalid("spec.block_sparse.random.keep",
                             absl::StrCat("must be in [0, 1], got ", g.keep));
            }
            return absl::OkStatus();
          },
          [&](const CsrGen& g) {
            constexpr absl::string_view kRowPtr = "spec.block_sparse.csr.row_ptr";
            constexpr absl::string_view kColIdx = "spec.block_sparse.csr.col_idx";
            const int64_t nnz = static_cast<int64_t>(g.col_idx.size());
            if (static_cast<int64_t>(g.row_ptr.size()) != num_blocks + 1) {
              return Invalid(
                  kRowPtr, absl::StrCat("has ", g.row_ptr.size(),
                                        " entries, expected num_blocks + 1 = ", num_blocks + 1,
                                        " (", seq_len, " tokens at block_size ", block_size, ")"));
            }
            if (g.row_ptr[0] != 0) {
              return Invalid(Indexed(kRowPtr, 0), absl::StrCat("must be 0, got ", g.row_ptr[0]));
            }
            for (int64_t i = 1; i <= num_blocks; ++i) {
              if (g.row_ptr[i] < g.row_ptr[i - 1]) {
                return Invalid(Indexed(kRowPtr, i),
                               absl::StrCat(g.row_ptr[i], " is less than row_ptr[", i - 1,
                                            "] = ", g.row_ptr[i - 1], " (must be non-decreasing)"));
              }
            }
            if (g.row_ptr[num_blocks] != nnz) {
              return Invalid(Indexed(kRowPtr, num_blocks),
                             absl::StrCat(g.row_ptr[num_blocks],
                                          " must equal the size of col_idx (", nnz, ")"));
            }
            // row_ptr is now known to be non-decreasing within [0, nnz], so indexing is safe.
            for (int64_t i = 0; i < num_blocks; ++i) {
              for (int64_t e = g.row_ptr[i]; e < g.row_ptr[i + 1]; ++e) {
                const int64_t c = g.col_idx[e];
                if (c < 0 || c >= num_blocks) {
                  return Invalid(Indexed(kColIdx, e),
                                 absl::StrCat(c, " is out of range [0, ", num_blocks, ")"));
                }
                if (e > g.row_ptr[i]) {
                  const int64_t prev = g.col_idx[e - 1];
                  if (c == prev) {
                    return Invalid(Indexed(kColIdx, e),
                                   absl::StrCat("duplicate column ", c, " in row ", i));
                  }
                  if (c < prev) {
                    return Invalid(Indexed(kColIdx, e),
                                   absl::StrCat(c, " follows ", prev, " in row ", i,
                                                " (columns must ascend within a row)"));
                  }
                }
              }
            }
            return absl::OkStatus();
          },
      },
      generator);
}

// Keys that are a piece of a longer sequence: dense and window only, not packed, the keys inside
// the sequence, and positions that stay far from overflowing.
absl::Status ValidateKeyShard(const AttentionSpec& spec, const AttentionShape& shape) {
  if (!IsKeyShard(spec)) {
    return Invalid("spec.k_offset",
                   absl::StrCat("must be 0 unless spec.kv_total is set, got ", spec.k_offset));
  }
  if (!std::holds_alternative<DenseSpec>(spec.pattern) &&
      !std::holds_alternative<WindowSpec>(spec.pattern)) {
    return absl::UnimplementedError(absl::StrCat(
        "spec.kv_total: keys that are a piece of a longer sequence (a sharded context) run dense "
        "and window specs only; ",
        std::string(PatternName(spec.pattern)), " is defined over the whole sequence's ",
        std::holds_alternative<DilatedSpec>(spec.pattern) ? "segments" : "blocks"));
  }
  if (IsPacked(spec)) {
    return Invalid("spec.kv_total", "must be 0 with packed sequences (cu_seqlens)");
  }
  // Every position then stays below 2^61 (q_offset <= kv_total, tokens < 2^60), so a position
  // difference plus a window clamped to the problem (the kernels' bounds) fits in int64.
  constexpr int64_t kMaxPosition = int64_t{1} << 60;
  if (spec.kv_total > kMaxPosition) {
    return Invalid("spec.kv_total", absl::StrCat("must be <= 2^60, got ", spec.kv_total));
  }
  if (spec.k_offset < 0 || spec.k_offset > spec.kv_total - shape.kv_len()) {
    return Invalid("spec.k_offset",
                   absl::StrCat("must be in [0, kv_total - kv_len = ",
                                spec.kv_total - shape.kv_len(), "] (the keys inside the ",
                                spec.kv_total, " of the sequence), got ", spec.k_offset));
  }
  return absl::OkStatus();
}

// FlashAttention's varlen convention, checked in one O(sequences) pass per vector.
absl::Status ValidatePacked(const AttentionSpec& spec, const AttentionShape& shape) {
  constexpr absl::string_view kQ = "spec.cu_seqlens_q";
  constexpr absl::string_view kK = "spec.cu_seqlens_k";
  if (spec.q_offset != 0) {
    return Invalid("spec.q_offset", absl::StrCat("must be 0 when packed (each sequence's queries ",
                                                 "are bottom-right aligned), got ", spec.q_offset));
  }
  if (shape.batch != 1) {
    return Invalid("shape.batch", absl::StrCat("must be 1 when packed (cu_seqlens), got ",
                                               shape.batch));
  }
  const std::vector<int64_t>& cq = spec.cu_seqlens_q;
  const std::vector<int64_t>& ck = spec.cu_seqlens_k;
  if (cq.size() != ck.size()) {
    return Invalid(kQ, absl::StrCat("has ", cq.size(), " entries but cu_seqlens_k has ", ck.size(),
                                    " (one more than the number of sequences each)"));
  }
  if (cq.size() < 2) {
    return Invalid(kQ, absl::StrCat("must have >= 2 entries (sequences + 1), got ", cq.size()));
  }
  if (static_cast<int64_t>(cq.size()) - 1 > kMaxPackedSequences) {
    return Invalid(kQ, absl::StrCat(cq.size() - 1, " sequences exceed the maximum ",
                                    kMaxPackedSequences));
  }
  for (const auto& [field, cu, total, total_name] :
       {std::tuple<absl::string_view, const std::vector<int64_t>*, int64_t, const char*>{
            kQ, &cq, shape.tokens, "shape.tokens (query rows)"},
        {kK, &ck, shape.kv_len(), "kv_len (key rows)"}}) {
    if ((*cu)[0] != 0) return Invalid(Indexed(field, 0), absl::StrCat("must be 0, got ", (*cu)[0]));
    for (size_t i = 1; i < cu->size(); ++i) {
      if ((*cu)[i] < (*cu)[i - 1]) {
        return Invalid(Indexed(field, i),
                       absl::StrCat((*cu)[i], " is less than entry ", i - 1, " = ", (*cu)[i - 1],
                                    " (must be non-decreasing)"));
      }
    }
    if (cu->back() != total) {
      return Invalid(Indexed(field, cu->size() - 1),
                     absl::StrCat(cu->back(), " must equal ", total_name, " = ", total));
    }
  }
  for (size_t s = 0; s + 1 < cq.size(); ++s) {
    const int64_t q_len = cq[s + 1] - cq[s];
    const int64_t kv_len = ck[s + 1] - ck[s];
    if (q_len > kv_len) {
      return Invalid(Indexed(kQ, s + 1),
                     absl::StrCat("sequence ", s, " has ", q_len, " queries but ", kv_len,
                                  " keys; queries are bottom-right aligned (offset kv_len - ",
                                  "q_len), so they must not outnumber the keys"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

float EffectiveScale(const AttentionSpec& spec, int64_t head_dim) {
  if (spec.scale != 0.f) return spec.scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

std::string_view PatternName(const AttentionPattern& p) {
  return std::visit(Overloaded{
                        [](const DenseSpec&) { return std::string_view("dense"); },
                        [](const WindowSpec&) { return std::string_view("window"); },
                        [](const DilatedSpec&) { return std::string_view("dilated"); },
                        [](const BlockSparseSpec&) { return std::string_view("block_sparse"); },
                    },
                    p);
}

std::string_view GeneratorName(const BlockGenerator& g) {
  return std::visit(Overloaded{
                        [](const LocalWindowGen&) { return std::string_view("local_window"); },
                        [](const DilatedSparseGen&) { return std::string_view("dilated_sparse"); },
                        [](const GlobalLocalGen&) { return std::string_view("global_local"); },
                        [](const StridedGen&) { return std::string_view("strided"); },
                        [](const RandomGen&) { return std::string_view("random"); },
                        [](const CsrGen&) { return std::string_view("csr"); },
                    },
                    g);
}

absl::Status ValidateShape(const AttentionShape& shape) {
  ATTN_RETURN_IF_ERROR(CheckAtLeast("shape.batch", shape.batch, 1));
  ATTN_RETURN_IF_ERROR(CheckAtLeast("shape.tokens", shape.tokens, 1));
  ATTN_RETURN_IF_ERROR(CheckAtLeast("shape.kv_tokens", shape.kv_tokens, 0));
  ATTN_RETURN_IF_ERROR(CheckAtLeast("shape.q_heads", shape.q_heads, 1));
  ATTN_RETURN_IF_ERROR(CheckAtLeast("shape.kv_heads", shape.kv_heads, 1));
  ATTN_RETURN_IF_ERROR(CheckAtLeast("shape.head_dim", shape.head_dim, 1));
  if (shape.q_heads % shape.kv_heads != 0) {
    return Invalid(
        "shape.q_heads",
        absl::StrCat(shape.q_heads, " is not a multiple of shape.kv_heads = ", shape.kv_heads));
  }
  if (shape.head_dim > kMaxHeadDim) {
    return Invalid("shape.head_dim",
                   absl::StrCat(shape.head_dim, " exceeds the maximum ", kMaxHeadDim));
  }
  // Every byte count downstream (elements * up to 8 bytes for the float64 reference) must fit in
  // int64, so the element count must stay below 2^63 / 8.
  // K and V are counted too (kv_heads <= q_heads, but kv_len may exceed tokens), and so is
  // tokens + kv_len, which bounds every position (q_offset <= kv_len).
  for (const auto& [rows, heads, what] :
       {std::tuple<int64_t, int64_t, const char*>{shape.tokens, shape.q_heads,
                                                  "batch * tokens * q_heads * head_dim"},
        {shape.kv_len(), shape.kv_heads, "batch * kv_tokens * kv_heads * head_dim"}}) {
    std::optional<int64_t> elems = CheckedMul(shape.batch, rows);
    if (elems) elems = CheckedMul(*elems, heads);
    if (elems) elems = CheckedMul(*elems, shape.head_dim);
    if (!elems || *elems > std::numeric_limits<int64_t>::max() / 8) {
      return Invalid("shape", absl::StrCat(what, " = ", shape.batch, " * ", rows, " * ", heads,
                                           " * ", shape.head_dim,
                                           " overflows int64 byte counts"));
    }
  }
  return absl::OkStatus();
}

bool IsSquare(const AttentionSpec& spec, const AttentionShape& shape) {
  return shape.kv_len() == shape.tokens && spec.q_offset == 0 && !IsPacked(spec) &&
         !IsKeyShard(spec);
}

int64_t PatternExtent(const AttentionSpec& spec, const AttentionShape& shape) {
  if (IsKeyShard(spec)) return std::max(spec.q_offset + shape.tokens, spec.kv_total);
  if (!IsPacked(spec)) return std::max(spec.q_offset + shape.tokens, shape.kv_len());
  int64_t longest = 0;
  for (size_t s = 0; s + 1 < spec.cu_seqlens_k.size(); ++s) {
    longest = std::max(longest, spec.cu_seqlens_k[s + 1] - spec.cu_seqlens_k[s]);
  }
  return longest;
}

std::optional<int64_t> WindowWithin(const AttentionSpec& spec, int64_t extent) {
  const auto* w = std::get_if<WindowSpec>(&spec.pattern);
  if (w == nullptr) return std::nullopt;
  return std::min(w->size, extent);
}

absl::Status ValidateSpecForSeqLen(const AttentionSpec& spec, int64_t seq_len) {
  return ValidateSpecForExtent(spec, seq_len, "shape.tokens");
}

absl::Status ValidateSpecForExtent(const AttentionSpec& spec, int64_t seq_len,
                                   absl::string_view seq_len_field) {
  ATTN_RETURN_IF_ERROR(CheckAtLeast(seq_len_field, seq_len, 1));
  if (!std::isfinite(spec.scale) || spec.scale < 0.f) {
    return Invalid(
        "spec.scale",
        absl::StrCat("must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ", spec.scale));
  }
  return std::visit(
      Overloaded{
          [](const DenseSpec&) { return absl::OkStatus(); },
          [](const WindowSpec& w) { return CheckAtLeast("spec.window.size", w.size, 0); },
          [](const DilatedSpec& d) {
            if (d.segment_lengths.empty()) {
              return Invalid("spec.dilated.segment_lengths", "must not be empty");
            }
            if (d.dilation_rates.empty()) {
              return Invalid("spec.dilated.dilation_rates", "must not be empty");
            }
            if (d.segment_lengths.size() != d.dilation_rates.size()) {
              return Invalid(
                  "spec.dilated",
                  absl::StrCat("segment_lengths has ", d.segment_lengths.size(),
                               " entries but dilation_rates has ", d.dilation_rates.size()));
            }
            if (static_cast<int64_t>(d.segment_lengths.size()) > kMaxDilatedBranches) {
              return Invalid("spec.dilated.segment_lengths",
                             absl::StrCat(d.segment_lengths.size(), " branches exceed the maximum ",
                                          kMaxDilatedBranches));
            }
            for (size_t k = 0; k < d.segment_lengths.size(); ++k) {
              ATTN_RETURN_IF_ERROR(CheckAtLeast(Indexed("spec.dilated.segment_lengths", k),
                                                d.segment_lengths[k], 1));
              ATTN_RETURN_IF_ERROR(
                  CheckAtLeast(Indexed("spec.dilated.dilation_rates", k), d.dilation_rates[k], 1));
              if (d.dilation_rates[k] > d.segment_lengths[k]) {
                return Invalid(Indexed("spec.dilated.dilation_rates", k),
                               absl::StrCat(d.dilation_rates[k], " exceeds segment_lengths[", k,
                                            "] = ", d.segment_lengths[k],
                                            " (dilation must not exceed the segment)"));
              }
            }
            return absl::OkStatus();
          },
          [&](const BlockSparseSpec& b) {
            if (std::find(std::begin(kSupportedBlockSizes), std::end(kSupportedBlockSizes),
                          b.block_size) == std::end(kSupportedBlockSizes)) {
              return Invalid("spec.block_sparse.block_size",
                             absl::StrCat(b.block_size, " is not supported (",
                                          absl::StrJoin(kSupportedBlockSizes, " or "), ")"));
            }
            // ceil(seq_len / block_size) without overflowing seq_len + block_size - 1.
            const int64_t nb = 1 + (seq_len - 1) / b.block_size;
            if (nb > std::numeric_limits<int32_t>::max()) {
              return Invalid(seq_len_field, absl::StrCat(seq_len, " tokens make ", nb,
                                                         " blocks; at most 2^31 - 1 supported"));
            }
            return ValidateGenerator(b.generator, nb, seq_len, b.block_size);
          },
      },
      spec.pattern);
}

absl::StatusOr<AttentionShape> AttentionShapeOf(const HostTensor& q, const HostTensor& k,
                                                const HostTensor& v) {
  for (const auto& [name, t] : {std::pair<const char*, const HostTensor*>{"q", &q},
                                {"k", &k},
                                {"v", &v}}) {
    if (t->rank() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected rank 4 [B, N, H, D], got ", t->DebugString()));
    }
  }
  if (k.dtype() != q.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("k: dtype ", std::string(DTypeName(k.dtype())),
                                                   " does not match q's ", std::string(DTypeName(q.dtype()))));
  }
  if (v.dtype() != q.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("v: dtype ", std::string(DTypeName(v.dtype())),
                                                   " does not match q's ", std::string(DTypeName(q.dtype()))));
  }
  // K/V may hold a different number of tokens than q (decode, chunked prefill, packed batches).
  if (k.dim(0) != q.dim(0) || k.dim(3) != q.dim(3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k: shape ", k.DebugString(), " does not match q's batch/head_dim ", q.DebugString()));
  }
  if (v.dims() != k.dims()) {
    return absl::InvalidArgumentError(
        absl::StrCat("v: shape ", v.DebugString(), " does not match k's ", k.DebugString()));
  }
  AttentionShape shape{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  // Left 0 ("same as tokens") for square inputs, so their shapes read exactly as before.
  if (k.dim(1) != q.dim(1)) {
    ATTN_RETURN_IF_ERROR(CheckAtLeast("k: tokens (dim 1)", k.dim(1), 1));
    shape.kv_tokens = k.dim(1);
  }
  ATTN_RETURN_IF_ERROR(ValidateShape(shape));
  return shape;
}

absl::Status ValidateSpec(const AttentionSpec& spec, const AttentionShape& shape) {
  ATTN_RETURN_IF_ERROR(ValidateShape(shape));
  if (IsKeyShard(spec) || spec.k_offset != 0) ATTN_RETURN_IF_ERROR(ValidateKeyShard(spec, shape));
  const int64_t nkv = IsKeyShard(spec) ? spec.kv_total : shape.kv_len();
  if (spec.q_offset < 0 || spec.q_offset > nkv) {
    return Invalid("spec.q_offset",
                   absl::StrCat("must be in [0, kv_len = ", nkv, "] (queries start within or ",
                                "right after the keys), got ", spec.q_offset));
  }
  if (IsPacked(spec)) {
    ATTN_RETURN_IF_ERROR(ValidatePacked(spec, shape));
    return ValidateSpecForExtent(spec, PatternExtent(spec, shape),
                                 "the longest packed sequence's kv length");
  }
  return ValidateSpecForExtent(
      spec, PatternExtent(spec, shape),
      IsSquare(spec, shape) ? "shape.tokens" : "max(spec.q_offset + shape.tokens, kv_len)");
}

// Algorithm (normative; reproduce it exactly to reproduce the layout without reading the CSR):
//   M = num_blocks - 1 candidate blocks (every block but `row`), indexed x in [0, M); candidate x
//   is block x when x < row and block x + 1 otherwise.
//   k = llround(keep * num_blocks) (round half away from zero), capped at M.
//   If k == M every candidate is taken. Otherwise the stream is splitmix64 with initial state
//   s = Mix64(seed ^ Mix64(row)), where Mix64 is the splitmix64 finaliser
//     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//     z ^ (z >> 31)
//   and each draw does s += 0x9E3779B97F4A7C15 and outputs Mix64(s). Below(n) takes one draw x
//   and returns floor(x * n / 2^64).
//   Floyd's sampling (Bentley & Floyd, CACM 1987) then draws k distinct candidates:
//     S = {}; for j in [M - k, M): t = Below(j + 1); S += (t in S ? j : t)
//   The result is S sorted ascending, mapped to block indices as above (the map is monotone).
// Time O(k log k) and memory O(k), independent of num_blocks.
std::vector<int64_t> RandomRowBlocks(int64_t row, int64_t num_blocks, double keep, uint64_t seed) {
  const int64_t m = num_blocks - 1;
  if (m <= 0 || !(keep > 0.0)) return {};
  const int64_t k = std::min<int64_t>(m, std::llround(std::min(keep, 1.0) * num_blocks));
  std::vector<int64_t> out;
  if (k <= 0) return out;
  out.reserve(k);
  if (k == m) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      if (b != row) out.push_back(b);
    }
    return out;
  }
  SplitMix64 rng(Mix64(seed ^ Mix64(static_cast<uint64_t>(row))));
  absl::flat_hash_set<int64_t> chosen;
  chosen.reserve(k);
  for (int64_t j = m - k; j < m; ++j) {
    const int64_t t = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(j) + 1));
    // Every earlier pick is < j, so when t is taken j is still free.
    const int64_t pick = chosen.contains(t) ? j : t;
    chosen.insert(pick);
    out.push_back(pick);
  }
  std::sort(out.begin(), out.end());
  for (int64_t& x : out) {
    if (x >= row) ++x;
  }
  return out;
}

}  // namespace attnserve
