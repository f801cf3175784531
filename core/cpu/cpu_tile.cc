#include "core/cpu/cpu_tile.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/tensor/dtype.h"

namespace attnserve {
namespace cpu_detail {

TileScratch& ThreadScratch() {
  thread_local TileScratch scratch;
  return scratch;
}

absl::Status RunItems(ThreadPool* pool, const std::atomic<bool>* cancel, int64_t n,
                      const std::function<void(int64_t)>& fn) {
  std::atomic<bool> stopped{false};
  auto item = [&](int64_t i) {
    if (stopped.load(std::memory_order_relaxed)) return;
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      stopped.store(true, std::memory_order_relaxed);
      return;
    }
    ScopedFlushDenormals ftz;
    fn(i);
  };
  if (pool != nullptr) {
    pool->ParallelFor(n, item);
  } else {
    for (int64_t i = 0; i < n; ++i) item(i);
  }
  if (stopped.load()) return absl::CancelledError("request cancelled");
  return absl::OkStatus();
}

// Sets the entries of one key tile's columns that its mask does not admit to `value` (-inf on the
// scores before the softmax; 0 on the probabilities after it, because the vectorised exp maps
// -inf to a tiny positive value, not to 0). Every rule admits one interval of keys per query
// (IntervalRule), so a mask is two contiguous fills per row, never a per-element predicate.
// [k_lo, k_hi) are the tile's key positions and `col0` their first column in the (rows, ld) tile.
void FillOutsideMask(BlockMask kind, const IntervalRule& rule, int64_t q_pos, int64_t rows,
                     int64_t k_lo, int64_t k_hi, float* tile, int64_t ld, int64_t col0,
                     float value) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t qpos = q_pos + r;
    int64_t lo = k_lo, hi = k_hi;  // admissible keys [lo, hi)
    if (kind == BlockMask::kCausalDiagonal) {
      hi = std::min(hi, qpos + 1);
    } else {
      lo = std::max(lo, rule.Lo(qpos));
      hi = std::min(hi - 1, rule.Hi(qpos)) + 1;  // Hi may be INT64_MAX: no + 1 on it
    }
    float* row = tile + r * ld + col0;
    if (hi <= lo) {
      std::fill(row, row + (k_hi - k_lo), value);
      continue;
    }
    std::fill(row, row + (lo - k_lo), value);
    std::fill(row + (hi - k_lo), row + (k_hi - k_lo), value);
  }
}

// The tiled online softmax of one query tile: walks its kept key tiles, merging runs of adjacent
// tiles into score tiles of up to kMaxKeysPerTile keys (at least one tile). Per score tile:
// S = scale * Q K^T (GEMM), mask only the kCausalDiagonal / kPartial tiles of the run, running
// max / denominator update, O = alpha * O + P V (GEMM). Rows with no admissible key end with
// O = 0 and LSE = -inf.
BlockResult AttendQueryTile(const QueryTile& in, TileScratch& t) {
  const int64_t d = in.d;
  const int64_t tile = in.tile;
  const int64_t rows = in.rows;
  const int64_t key_tiles = NumBlocks(in.k_len, tile);
  t.Reserve(rows, std::max(kMaxKeysPerTile, tile), d);

  Tile o_acc(t.o.data(), rows, d);
  o_acc.setZero();
  std::fill_n(t.m.data(), rows, kNegInf);
  std::fill_n(t.l.data(), rows, 0.f);
  const ConstTile q_tile(in.q, rows, d, Eigen::OuterStride<>(in.q_stride));  // (rows, D)

  for (int64_t e = 0; e < in.entries;) {
    const int64_t j0 = in.col_idx[e];
    if (j0 >= key_tiles) break;  // columns ascend: the rest lie past the key rows
    // Extend the run while the next kept tile is adjacent and the score tile has room.
    int64_t e_last = e;
    while (e_last + 1 < in.entries && in.col_idx[e_last + 1] == in.col_idx[e_last] + 1 &&
           in.col_idx[e_last + 1] < key_tiles &&
           (in.col_idx[e_last + 1] - j0 + 1) * tile <= kMaxKeysPerTile) {
      ++e_last;
    }
    const int64_t k0 = j0 * tile;  // key rows [k0, k1) of the run
    const int64_t k1 = std::min<int64_t>((in.col_idx[e_last] + 1) * tile, in.k_len);
    const int64_t cols = k1 - k0;

    Tile s(t.s.data(), rows, cols);  // (rows, cols)
    const ConstTile k_tile(in.k + k0 * in.kv_stride, cols, d,
                           Eigen::OuterStride<>(in.kv_stride));  // (cols, D)
    // The scalar folds into the GEMM's alpha (Eigen's blas_traits), so scaling costs nothing.
    s.noalias() = (in.scale * q_tile) * k_tile.transpose();

    bool masked = false;
    for (int64_t x = e; x <= e_last; ++x) {
      if (in.mask[x] == BlockMask::kFull) continue;
      masked = true;
      const int64_t b_lo = static_cast<int64_t>(in.col_idx[x]) * tile;
      const int64_t b_hi = std::min(b_lo + tile, in.k_len);
      FillOutsideMask(in.mask[x], *in.rule, in.q_pos, rows, in.k_pos + b_lo, in.k_pos + b_hi,
                      s.data(), cols, b_lo - k0, kNegInf);
    }

    for (int64_t r = 0; r < rows; ++r) {
      auto srow = s.row(r).array();
      const float m_old = t.m[r];
      const float m_new = std::max(m_old, srow.maxCoeff());
      // A row with nothing admitted yet keeps m = -inf; shifting by 0 instead keeps exp() away
      // from (-inf) - (-inf).
      const float shift = m_new == kNegInf ? 0.f : m_new;
      srow = (srow - shift).exp();
      t.alpha[r] = std::exp(m_old - shift);  // 0 when m_old = -inf, 1 when the max is unchanged
      t.m[r] = m_new;
    }
    if (masked) {
      for (int64_t x = e; x <= e_last; ++x) {
        if (in.mask[x] == BlockMask::kFull) continue;
        const int64_t b_lo = static_cast<int64_t>(in.col_idx[x]) * tile;
        const int64_t b_hi = std::min(b_lo + tile, in.k_len);
        FillOutsideMask(in.mask[x], *in.rule, in.q_pos, rows, in.k_pos + b_lo, in.k_pos + b_hi,
                        s.data(), cols, b_lo - k0, 0.f);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float a = t.alpha[r];
      t.l[r] = t.l[r] * a + s.row(r).sum();
      if (a != 1.f) o_acc.row(r) *= a;
    }
    const ConstTile v_tile(in.v + k0 * in.kv_stride, cols, d,
                           Eigen::OuterStride<>(in.kv_stride));  // (cols, D)
    o_acc.noalias() += s * v_tile;
    e = e_last + 1;
  }

  // Normalise; the LSE reuses t.alpha as its output row.
  for (int64_t r = 0; r < rows; ++r) {
    if (t.m[r] == kNegInf || t.l[r] == 0.f) {
      o_acc.row(r).setZero();
      t.alpha[r] = kNegInf;
    } else {
      o_acc.row(r) *= 1.f / t.l[r];
      t.alpha[r] = t.m[r] + std::log(t.l[r]);
    }
  }
  return BlockResult{t.o.data(), t.alpha.data(), rows};
}

// Query block `qb` of a square layout over one contiguous (n, D) head slice (q pre-scaled),
// positions 0..n-1 on both axes.
QueryTile SquareQueryTile(const BlockLayout& layout, const IntervalRule& rule, int64_t qb,
                          const HeadSlice& in) {
  const int64_t bs = layout.block_size;
  const int64_t q0 = qb * bs;
  const int64_t e0 = layout.row_ptr[qb];
  return QueryTile{.q = in.q + q0 * in.d,
                   .q_stride = in.d,
                   .rows = std::min(bs, in.n - q0),
                   .q_pos = q0,
                   .k = in.k,
                   .v = in.v,
                   .kv_stride = in.d,
                   .k_len = in.n,
                   .k_pos = 0,
                   .d = in.d,
                   .tile = bs,
                   .scale = 1.f,
                   .col_idx = layout.col_idx.data() + e0,
                   .mask = layout.mask.data() + e0,
                   .entries = layout.row_ptr[qb + 1] - e0,
                   .rule = &rule};
}

// Copies `n` float32 values into a `dtype` buffer at element offset `offset`.
void StoreRow(const float* src, int64_t n, HostTensor& dst, int64_t offset) {
  switch (dst.dtype()) {
    case DType::kF32:
      std::memcpy(dst.data_as<float>() + offset, src, n * sizeof(float));
      break;
    case DType::kF16: {
      uint16_t* out = dst.data_as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(src[i]);
      break;
    }
    case DType::kBF16: {
      uint16_t* out = dst.data_as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(src[i]);
      break;
    }
  }
}

// Reads `n` values of a `dtype` buffer at element offset `offset` as float32 times `scale`.
void LoadRow(const HostTensor& src, int64_t offset, int64_t n, float scale, float* dst) {
  switch (src.dtype()) {
    case DType::kF32: {
      const float* in = src.data_as<float>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = in[i] * scale;
      break;
    }
    case DType::kF16: {
      const uint16_t* in = src.data_as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(in[i]) * scale;
      break;
    }
    case DType::kBF16: {
      const uint16_t* in = src.data_as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(in[i]) * scale;
      break;
    }
  }
}

}  // namespace cpu_detail
}  // namespace attnserve
