#include "core/dist/ring_step_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "Eigen/Core"
#include "core/cpu/merge.h"

namespace attnserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedConst = Eigen::Map<const RowMajorF, 0, Eigen::OuterStride<>>;

// Per-thread scratch, grown on demand, so a step's inner loop does not allocate per tile.
struct Scratch {
  RowMajorF s;  // (tile rows, tile keys) scores, then probabilities
  RowMajorF o;  // (tile rows, D) unnormalised output
  std::vector<float> m, l, lse;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Online softmax of one (batch, head, query tile) over the tile's kept key tiles, then the LSE
// merge of the result into the accumulator rows.
void RunItem(const RingStepArgs& a, int64_t b, const HeadPair& hp, int64_t qt) {
  const RectLayout& lay = *a.layout;
  const int64_t d = a.head_dim;
  const int64_t tile = lay.tile;
  const int64_t rows = std::min<int64_t>(tile, lay.q_len - qt * tile);
  const int64_t q_pos0 = lay.q_begin + qt * tile;  // sequence position of the tile's row 0
  const int64_t q_stride = a.q_heads * d;
  const int64_t kv_stride = a.kv_heads * d;
  const float* q_ptr = a.q + ((b * a.q_rows + a.q_row0 + qt * tile) * a.q_heads + hp.q_head) * d;
  const StridedConst q_tile(q_ptr, rows, d, Eigen::OuterStride<>(q_stride));

  Scratch& sc = ThreadScratch();
  sc.o.setZero(rows, d);
  sc.m.assign(rows, kNegInf);
  sc.l.assign(rows, 0.f);
  for (int64_t e = lay.row_ptr[qt]; e < lay.row_ptr[qt + 1]; ++e) {
    const int64_t kt = lay.col_idx[e];
    const int64_t keys = std::min<int64_t>(tile, lay.k_len - kt * tile);
    const int64_t k_pos0 = lay.k_begin + kt * tile;
    const int64_t kv_off = ((b * a.kv_rows + a.k_row0 + kt * tile) * a.kv_heads + hp.kv_head) * d;
    const StridedConst k_tile(a.k + kv_off, keys, d, Eigen::OuterStride<>(kv_stride));
    const StridedConst v_tile(a.v + kv_off, keys, d, Eigen::OuterStride<>(kv_stride));
    sc.s.noalias() = (q_tile * k_tile.transpose()) * a.scale;  // (rows, keys)
    const BlockMask mask = lay.mask[e];
    if (mask != BlockMask::kFull) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = q_pos0 + r;
        int64_t lo = k_pos0, hi = k_pos0 + keys - 1;
        if (mask == BlockMask::kCausalDiagonal) {
          hi = std::min(hi, i);
        } else {
          lo = std::max(lo, lay.rule.Lo(i));
          hi = std::min(hi, lay.rule.Hi(i));
        }
        for (int64_t c = 0; c < keys; ++c) {
          const int64_t kpos = k_pos0 + c;
          if (kpos < lo || kpos > hi) sc.s(r, c) = kNegInf;
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float tile_max = sc.s.row(r).maxCoeff();
      const float m_new = std::max(sc.m[r], tile_max);
      if (m_new == kNegInf) {  // nothing admitted for this row yet: exp(-inf - -inf) is NaN
        sc.s.row(r).setZero();
        continue;
      }
      const float alpha = std::exp(sc.m[r] - m_new);  // 0 when m was -inf
      float sum = 0.f;
      for (int64_t c = 0; c < keys; ++c) {
        const float p = std::exp(sc.s(r, c) - m_new);
        sc.s(r, c) = p;
        sum += p;
      }
      sc.l[r] = sc.l[r] * alpha + sum;
      sc.m[r] = m_new;
      sc.o.row(r) *= alpha;
    }
    sc.o.noalias() += sc.s.leftCols(keys) * v_tile;
  }
  sc.lse.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (sc.l[r] > 0.f) {
      sc.o.row(r) /= sc.l[r];
      sc.lse[r] = sc.m[r] + std::log(sc.l[r]);
    } else {
      sc.lse[r] = kNegInf;
    }
  }
  const int64_t acc_row0 = a.q_row0 + qt * tile;
  float* acc_o = a.acc_o + ((b * a.q_rows + acc_row0) * a.q_heads + hp.q_head) * d;
  float* acc_lse = a.acc_lse + (b * a.q_heads + hp.q_head) * a.q_rows + acc_row0;
  MergePartialRows(rows, d, acc_o, q_stride, acc_lse, 1, sc.o.data(), d, sc.lse.data(), 1);
}

}  // namespace

absl::Status RingStepCpu(const RingStepArgs& a, ThreadPool* pool, const std::atomic<bool>* cancel) {
  const RectLayout& lay = *a.layout;
  if (lay.kept_tiles() == 0) return absl::OkStatus();
  // Only query tiles with kept key tiles are work items.
  std::vector<int64_t> tiles;
  for (int64_t qt = 0; qt < lay.num_q_tiles(); ++qt) {
    if (lay.row_ptr[qt + 1] > lay.row_ptr[qt]) tiles.push_back(qt);
  }
  const int64_t per_bh = static_cast<int64_t>(tiles.size());
  const int64_t heads = static_cast<int64_t>(a.heads->size());
  const int64_t items = a.batch * heads * per_bh;
  std::atomic<bool> cancelled{false};
  auto run = [&](int64_t item) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      cancelled.store(true, std::memory_order_relaxed);
      return;
    }
    const int64_t qt = tiles[item % per_bh];
    const int64_t bh = item / per_bh;
    RunItem(a, bh / heads, (*a.heads)[bh % heads], qt);
  };
  if (pool != nullptr && items > 1) {
    pool->ParallelFor(items, run);
  } else {
    for (int64_t i = 0; i < items; ++i) run(i);
  }
  if (cancelled.load()) return absl::CancelledError("ring step cancelled");
  return absl::OkStatus();
}

}  // namespace attnserve
