#include "core/cpu/merge.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve {

void MergePartialRows(int64_t rows, int64_t head_dim, float* o_acc, int64_t o_acc_stride,
                      float* lse_acc, int64_t lse_acc_stride, const float* o_in,
                      int64_t o_in_stride, const float* lse_in, int64_t lse_in_stride) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float la = lse_acc[r * lse_acc_stride];
    const float lb = lse_in[r * lse_in_stride];
    float* oa = o_acc + r * o_acc_stride;
    const float* ob = o_in + r * o_in_stride;
    // A -inf partial holds no keys: it must contribute nothing, and exp(-inf - -inf) would be
    // NaN, so both cases are decided before any arithmetic.
    if (lb == kNegInf) continue;
    if (la == kNegInf) {
      std::copy(ob, ob + head_dim, oa);
      lse_acc[r * lse_acc_stride] = lb;
      continue;
    }
    // Relative to the larger LSE one exponent is exactly 1 and the other <= 1 (no overflow), and
    // log1p keeps the small term's precision in L.
    const float m = std::max(la, lb);
    const float small = std::exp(std::min(la, lb) - m);
    const float inv_sum = 1.f / (1.f + small);
    const float wa = (la >= lb ? 1.f : small) * inv_sum;
    const float wb = (la >= lb ? small : 1.f) * inv_sum;
    for (int64_t d = 0; d < head_dim; ++d) oa[d] = wa * oa[d] + wb * ob[d];
    lse_acc[r * lse_acc_stride] = m + std::log1p(small);
  }
}

absl::Status MergePartials(HostTensor& acc_o, HostTensor& acc_lse, const HostTensor& in_o,
                           const HostTensor& in_lse) {
  auto check_f32 = [](const char* name, const HostTensor& t, int rank) -> absl::Status {
    if (t.dtype() != DType::kF32 || t.rank() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected a rank ", rank,
                                                     " f32 tensor, got ", t.DebugString()));
    }
    return absl::OkStatus();
  };
  for (auto s : {check_f32("acc_o", acc_o, 4), check_f32("in_o", in_o, 4),
                 check_f32("acc_lse", acc_lse, 3), check_f32("in_lse", in_lse, 3)}) {
    if (!s.ok()) return s;
  }
  if (in_o.dims() != acc_o.dims()) {
    return absl::InvalidArgumentError(absl::StrCat("in_o: shape ", in_o.DebugString(),
                                                   " does not match acc_o's ",
                                                   acc_o.DebugString()));
  }
  const int64_t B = acc_o.dim(0), N = acc_o.dim(1), H = acc_o.dim(2), D = acc_o.dim(3);
  const std::vector<int64_t> lse_dims = {B, H, N};
  for (const auto& [name, t] : {std::pair<const char*, const HostTensor*>{"acc_lse", &acc_lse},
                                {"in_lse", &in_lse}}) {
    if (t->dims() != lse_dims) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": shape ", t->DebugString(), " does not match [B, H, N] of ",
          acc_o.DebugString()));
    }
  }
  // O is [B, N, H, D] and LSE [B, H, N]: for a fixed (b, h) the rows of O are H * D apart and
  // the LSEs are contiguous.
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t o_off = (b * N * H + h) * D;
      const int64_t l_off = (b * H + h) * N;
      MergePartialRows(N, D, acc_o.data_as<float>() + o_off, H * D,
                       acc_lse.data_as<float>() + l_off, 1, in_o.data_as<float>() + o_off, H * D,
                       in_lse.data_as<float>() + l_off, 1);
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve
