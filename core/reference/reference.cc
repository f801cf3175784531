#include "core/reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Flat index of element (b, n, h, d) of a [B, N, H, D] tensor.
inline int64_t Index4(int64_t b, int64_t n, int64_t h, int64_t d, int64_t N, int64_t H,
                      int64_t D) {
  return ((b * N + n) * H + h) * D + d;
}

// The inputs as float64 (exact for every dtype), so the oracle does no rounding of its own
// beyond float64 arithmetic.
std::vector<double> ToDouble(const HostTensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.GetFloat(i);
  return out;
}

// One softmax over the keys `admits` accepts, for query row i of (b, h) against the key rows
// [k_row, k_row + k_len): writes O (D doubles) and returns the LSE (-inf with O = 0 when no key is
// admitted). `admits` takes the key's index within the range, which is its position.
class RowAttention {
 public:
  RowAttention(const std::vector<double>& q, const std::vector<double>& k,
               const std::vector<double>& v, const AttentionShape& s, double scale)
      : q_(q), k_(k), v_(v), s_(s), scale_(scale), scores_(s.kv_len()) {}

  template <typename Admits>
  double Run(int64_t b, int64_t h, int64_t i, int64_t k_row, int64_t k_len, Admits&& admits,
             double* o) {
    const int64_t Nq = s_.tokens, Nkv = s_.kv_len(), D = s_.head_dim;
    const int64_t kvh = h / (s_.q_heads / s_.kv_heads);
    const double* qi = &q_[Index4(b, i, h, 0, Nq, s_.q_heads, D)];
    double max_score = kNegInf;
    for (int64_t j = 0; j < k_len; ++j) {
      if (!admits(j)) {
        scores_[j] = kNegInf;
        continue;
      }
      const double* kj = &k_[Index4(b, k_row + j, kvh, 0, Nkv, s_.kv_heads, D)];
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
      scores_[j] = dot * scale_;
      max_score = std::max(max_score, scores_[j]);
    }
    std::fill(o, o + D, 0.0);
    if (max_score == kNegInf) return kNegInf;
    double denom = 0;
    for (int64_t j = 0; j < k_len; ++j) {
      if (scores_[j] == kNegInf) continue;
      const double p = std::exp(scores_[j] - max_score);
      denom += p;
      const double* vj = &v_[Index4(b, k_row + j, kvh, 0, Nkv, s_.kv_heads, D)];
      for (int64_t d = 0; d < D; ++d) o[d] += p * vj[d];
    }
    for (int64_t d = 0; d < D; ++d) o[d] /= denom;
    return max_score + std::log(denom);
  }

 private:
  const std::vector<double>& q_;
  const std::vector<double>& k_;
  const std::vector<double>& v_;
  AttentionShape s_;
  double scale_;
  std::vector<double> scores_;
};

// One attention problem of the request, straight from DESIGN "The math": query rows
// [q_row, q_row + q_len) at positions from q_pos, key rows [k_row, k_row + k_len) at positions
// from k_pos (spec.k_offset; 0 unless the keys are a piece of a longer sequence). An unpacked
// request is one (for every batch element), a packed one one per sequence.
struct Problem {
  int64_t q_row, q_len, q_pos, k_row, k_len, k_pos = 0;
  int64_t extent() const { return std::max(q_pos + q_len, k_pos + k_len); }
};

std::vector<Problem> Problems(const AttentionSpec& spec, const AttentionShape& s) {
  if (!IsPacked(spec)) return {{0, s.tokens, spec.q_offset, 0, s.kv_len(), spec.k_offset}};
  std::vector<Problem> out;
  const std::vector<int64_t>& cq = spec.cu_seqlens_q;
  const std::vector<int64_t>& ck = spec.cu_seqlens_k;
  for (size_t i = 0; i + 1 < cq.size(); ++i) {
    const int64_t q_len = cq[i + 1] - cq[i], k_len = ck[i + 1] - ck[i];
    out.push_back({cq[i], q_len, k_len - q_len, ck[i], k_len});
  }
  return out;
}

// Key blocks kept for query block i, as a bitmap over key blocks (O(nb) memory per row).
std::vector<bool> KeptRow(const BlockSparseSpec& bs, int64_t nb, int64_t i) {
  std::vector<bool> kept(nb, false);
  if (const auto* r = std::get_if<RandomGen>(&bs.generator)) {
    // One generator call per row instead of one per (i, j).
    kept[i] = true;
    for (int64_t j : RandomRowBlocks(i, nb, r->keep, r->seed)) kept[j] = true;
    return kept;
  }
  for (int64_t j = 0; j < nb; ++j) kept[j] = ReferenceBlockKept(bs, nb, i, j);
  return kept;
}

// Whether global position p belongs to the dilated (segment length w, rate r, offset o) set,
// and in which segment.
inline bool InDilatedSet(int64_t p, int64_t w, int64_t r, int64_t o) {
  const int64_t rel = p % w - o;
  return rel >= 0 && rel % r == 0;
}

}  // namespace

bool ReferenceBlockKept(const BlockSparseSpec& bs, int64_t num_blocks, int64_t i, int64_t j) {
  const int64_t dist = std::abs(i - j);
  return std::visit(
      [&](const auto& g) -> bool {
        using G = std::decay_t<decltype(g)>;
        if constexpr (std::is_same_v<G, LocalWindowGen>) {
          return dist <= g.width;
        } else if constexpr (std::is_same_v<G, DilatedSparseGen>) {
          return i == j || std::find(g.rates.begin(), g.rates.end(), dist) != g.rates.end();
        } else if constexpr (std::is_same_v<G, GlobalLocalGen>) {
          return i < g.global_blocks || j < g.global_blocks || dist <= g.width;
        } else if constexpr (std::is_same_v<G, StridedGen>) {
          return dist <= g.width || (g.stride > 0 && (i - j) % g.stride == 0);
        } else if constexpr (std::is_same_v<G, RandomGen>) {
          if (i == j) return true;
          const std::vector<int64_t> row = RandomRowBlocks(i, num_blocks, g.keep, g.seed);
          return std::binary_search(row.begin(), row.end(), j);
        } else {
          static_assert(std::is_same_v<G, CsrGen>);
          if (i + 1 >= static_cast<int64_t>(g.row_ptr.size())) return false;
          for (int64_t e = g.row_ptr[i]; e < g.row_ptr[i + 1]; ++e) {
            if (g.col_idx[e] == j) return true;
          }
          return false;
        }
      },
      bs.generator);
}

absl::StatusOr<ReferenceResult> ReferenceAttention(const AttentionSpec& spec, const HostTensor& q,
                                                   const HostTensor& k, const HostTensor& v) {
  ATTN_ASSIGN_OR_RETURN(const AttentionShape s, AttentionShapeOf(q, k, v));
  ATTN_RETURN_IF_ERROR(ValidateSpec(spec, s));

  const int64_t B = s.batch, N = s.tokens, H = s.q_heads, D = s.head_dim;
  const double scale = EffectiveScale(spec, D);
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  RowAttention row(qd, kd, vd, s, scale);

  ReferenceResult result;
  result.o.assign(static_cast<size_t>(B * N * H * D), 0.0);
  result.lse.assign(static_cast<size_t>(B * H * N), kNegInf);
  auto o_row = [&](int64_t b, int64_t i, int64_t h) { return &result.o[Index4(b, i, h, 0, N, H, D)]; };
  auto lse_at = [&](int64_t b, int64_t h, int64_t i) -> double& {
    return result.lse[(b * H + h) * N + i];
  };
  const bool causal = spec.causal;
  const std::vector<Problem> problems = Problems(spec, s);

  if (const auto* dil = std::get_if<DilatedSpec>(&spec.pattern)) {
    std::vector<double> o_k(D);
    for (const Problem& pr : problems) {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t i = 0; i < pr.q_len; ++i) {
            const int64_t p = pr.q_pos + i;
            // Branch results combine by their softmax denominators: L = log sum exp(LSE_k),
            // O = sum exp(LSE_k - L) O_k. Collected first, then combined in float64.
            std::vector<std::pair<double, std::vector<double>>> parts;
            for (size_t br = 0; br < dil->segment_lengths.size(); ++br) {
              const int64_t w = dil->segment_lengths[br], r = dil->dilation_rates[br];
              const int64_t o = h % r;
              if (!InDilatedSet(p, w, r, o)) continue;
              const int64_t seg = p / w;
              const double lse = row.Run(
                  b, h, pr.q_row + i, pr.k_row, pr.k_len,
                  [&](int64_t j) {
                    return j / w == seg && InDilatedSet(j, w, r, o) && (!causal || j <= p);
                  },
                  o_k.data());
              if (lse != kNegInf) parts.emplace_back(lse, o_k);
            }
            if (parts.empty()) continue;  // O = 0, LSE = -inf
            double m = kNegInf;
            for (const auto& part : parts) m = std::max(m, part.first);
            double sum = 0;
            for (const auto& part : parts) sum += std::exp(part.first - m);
            const double L = m + std::log(sum);
            double* out = o_row(b, pr.q_row + i, h);
            for (const auto& part : parts) {
              const double wgt = std::exp(part.first - L);
              for (int64_t d = 0; d < D; ++d) out[d] += wgt * part.second[d];
            }
            lse_at(b, h, pr.q_row + i) = L;
          }
        }
      }
    }
    return result;
  }

  // Non-dilated kinds: one softmax per row over the keys the token-level predicate admits.
  const BlockSparseSpec* bs = std::get_if<BlockSparseSpec>(&spec.pattern);
  const int64_t block = bs ? bs->block_size : 1;
  for (const Problem& pr : problems) {
    // Blocks are counted over the problem's extent (random's count depends on it).
    const int64_t nb = bs ? NumBlocks(pr.extent(), block) : 0;
    std::function<bool(int64_t, int64_t)> admits;  // (query position, key position), no causal
    std::vector<bool> kept_row;
    int64_t kept_row_block = -1;
    if (std::holds_alternative<DenseSpec>(spec.pattern)) {
      admits = [](int64_t, int64_t) { return true; };
    } else if (const auto* win = std::get_if<WindowSpec>(&spec.pattern)) {
      const int64_t w = win->size;
      admits = [w](int64_t p, int64_t j) { return std::abs(p - j) <= w; };
    } else {
      admits = [&](int64_t p, int64_t j) {
        const int64_t qb = p / block;
        if (qb != kept_row_block) {
          kept_row = KeptRow(*bs, nb, qb);
          kept_row_block = qb;
        }
        return static_cast<bool>(kept_row[j / block]);
      };
    }
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < pr.q_len; ++i) {
          const int64_t p = pr.q_pos + i;
          lse_at(b, h, pr.q_row + i) = row.Run(
              b, h, pr.q_row + i, pr.k_row, pr.k_len,
              [&](int64_t j) {
                const int64_t key = pr.k_pos + j;  // the key's position
                return (!causal || key <= p) && admits(p, key);
              },
              o_row(b, pr.q_row + i, h));
        }
      }
    }
  }
  return result;
}

double ReferenceOTolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-5;
    case DType::kF16:
      return 2e-3;
    case DType::kBF16:
      return 1e-2;
  }
  return 0;
}

ErrorStats CompareToReference(const ReferenceResult& ref, const HostTensor& o,
                              const HostTensor* lse) {
  ErrorStats st;
  const int64_t n_o = std::min<int64_t>(o.numel(), static_cast<int64_t>(ref.o.size()));
  // A size mismatch is itself an error: every missing element counts as non-finite.
  st.nonfinite += std::abs(o.numel() - static_cast<int64_t>(ref.o.size()));
  for (int64_t i = 0; i < n_o; ++i) {
    const double r = ref.o[i];
    const double x = o.GetFloat(i);
    st.o_ref_max_abs = std::max(st.o_ref_max_abs, std::abs(r));
    ++st.checked;
    if (!std::isfinite(x)) {
      ++st.nonfinite;
      continue;
    }
    st.o_max_abs = std::max(st.o_max_abs, std::abs(x - r));
  }
  if (lse != nullptr) {
    const int64_t n_l = std::min<int64_t>(lse->numel(), static_cast<int64_t>(ref.lse.size()));
    st.nonfinite += std::abs(lse->numel() - static_cast<int64_t>(ref.lse.size()));
    for (int64_t i = 0; i < n_l; ++i) {
      const double r = ref.lse[i];
      const double x = lse->GetFloat(i);
      ++st.checked;
      if (r == kNegInf) {
        if (x != kNegInf) ++st.nonfinite;
        continue;
      }
      if (!std::isfinite(x)) {
        ++st.nonfinite;
        continue;
      }
      st.lse_max_abs = std::max(st.lse_max_abs, std::abs(x - r));
    }
  }
  st.o_rel = st.o_max_abs / std::max(st.o_ref_max_abs, 1e-30);
  return st;
}

}  // namespace attnserve
