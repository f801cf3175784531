// The CPU backend's tile kernel: the tiled online softmax of one query tile over its kept key
// tiles (Eigen GEMMs, masks as two contiguous fills per row), its per-thread scratch, and the row
// conversions between a tensor's dtype and float32. Internal to core/cpu: cpu_backend.cc drives
// it over layouts, dilated segments and ring pieces.
#ifndef ATTNSERVE_CORE_CPU_CPU_TILE_H_
#define ATTNSERVE_CORE_CPU_CPU_TILE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "Eigen/Core"
#include "absl/status/status.h"
#include "core/spec/attention_spec.h"
#include "core/spec/block_layout.h"
#include "core/spec/rect_layout.h"
#include "core/tensor/tensor.h"
#include "core/util/thread_pool.h"

namespace attnserve {
namespace cpu_detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys per score tile: consecutive kept key blocks are merged into one GEMM up to this width, so
// a dense row of blocks runs as a few wide GEMMs instead of many 128-key ones. 256 keeps the
// (block_size x 256) score tile plus the K and V tiles (256 x D each) inside a 512 KiB L2 for
// D <= 128. Measured on a 2-core Zen 3 (dense N=4096, D=64 and D=128 causal, thread CPU time):
// 128, 256, 512 and 1024 all land at ~0.75 of Eigen's sgemm rate, within noise.
constexpr int64_t kMaxKeysPerTile = 256;

using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Query, key and value rows are read in place from row-major buffers whose rows may be further
// apart than D (a ring shard holds every head of a row): GEMMs pack their operands anyway.
using ConstTile = Eigen::Map<const RowMajorF, 0, Eigen::OuterStride<>>;
using Tile = Eigen::Map<RowMajorF>;

// Flush-to-zero / denormals-are-zero for the duration of a work item: masked and far-below-max
// scores exponentiate to subnormals, which would otherwise slow the P * V GEMM for no accuracy
// gain. Restores the caller's mode because pool threads run other code too.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() {
#if defined(__SSE__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
#endif
  }
  ~ScopedFlushDenormals() {
#if defined(__SSE__)
    _mm_setcsr(saved_);
#endif
  }

 private:
  unsigned int saved_ = 0;
};

// Vector-aligned float buffers: Eigen's kernels peel unaligned heads (GEMV for one-row tiles
// in particular), which changes the summation order, so every buffer the core reads or writes
// has the same alignment on every thread and the results do not depend on the schedule.
using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;

// Per-thread scratch of the tiled core, grown on demand and reused across work items and runs,
// so the inner loop never allocates. Bounded by rows x (max(kMaxKeysPerTile, key tile) + D) floats.
struct TileScratch {
  AlignedFloats s;      // (rows, keys) scores, then probabilities
  AlignedFloats o;      // (rows, D) unnormalised output accumulator
  AlignedFloats m;      // (rows) running max of the scores
  AlignedFloats l;      // (rows) running softmax denominator relative to m
  AlignedFloats alpha;  // (rows) rescale factor of the previous accumulator

  void Reserve(int64_t rows, int64_t keys, int64_t d) {
    const auto r = static_cast<size_t>(rows);
    if (s.size() < r * keys) s.resize(r * keys);
    if (o.size() < r * static_cast<size_t>(d)) o.resize(r * d);
    if (m.size() < r) {
      m.resize(r);
      l.resize(r);
      alpha.resize(r);
    }
  }
};

// This thread's scratch (thread_local; grown on demand).
TileScratch& ThreadScratch();

// Runs fn(i) for i in [0, n) on `pool` (or inline when null), each item with denormals flushed,
// skipping the rest once `cancel` (may be null) reads true. Returns CANCELLED if any item was
// skipped for that reason.
absl::Status RunItems(ThreadPool* pool, const std::atomic<bool>* cancel, int64_t n,
                      const std::function<void(int64_t)>& fn);

// One (batch, head) slice of contiguous float32 rows: what the square-layout paths read. Position
// p of the slice is row p of q/k/v. `q` already carries the softmax scale.
struct HeadSlice {
  const float* q;  // (n, D)
  const float* k;  // (n, D)
  const float* v;  // (n, D)
  int64_t n;       // tokens in the slice (<= layout.seq_len; layouts are used as prefixes)
  int64_t d;       // head dim
};

// Result of one query tile: rows of normalised O and their LSE, in the thread's scratch (valid
// until the thread's next tile).
struct BlockResult {
  const float* o;    // (rows, D), row stride D
  const float* lse;  // (rows)
  int64_t rows;
};

// Everything the tile kernel reads for one query tile: its rows, the key/value rows it may visit,
// and its CSR row of kept key tiles. Positions are GLOBAL sequence positions (masks are evaluated
// on them); rows are addressed relative to the pointers. Square layouts, dilated segments and ring
// pieces all reduce to this.
struct QueryTile {
  const float* q;          // (rows, D), row stride q_stride
  int64_t q_stride;        // floats between consecutive query rows
  int64_t rows;            // query rows of the tile
  int64_t q_pos;           // position of query row 0
  const float* k;          // key row 0 of the key axis, row stride kv_stride
  const float* v;          // value row 0, row stride kv_stride
  int64_t kv_stride;       // floats between consecutive key/value rows
  int64_t k_len;           // key rows that exist; kept tiles at or past NumBlocks(k_len, tile) are
                           // ignored (dilated segments use a longer dense layout as a prefix)
  int64_t k_pos;           // position of key row 0
  int64_t d;               // head dim
  int64_t tile;            // keys per key tile (the last may be short)
  float scale;             // applied to Q K^T (1 when q already carries it)
  const int32_t* col_idx;  // kept key tiles, ascending
  const BlockMask* mask;   // one per kept tile
  int64_t entries;         // kept tiles
  const IntervalRule* rule;  // what kPartial tiles evaluate
};

// The tiled online softmax of one query tile: walks its kept key tiles, merging runs of adjacent
// tiles into score tiles of up to kMaxKeysPerTile keys (at least one tile). Per score tile:
// S = scale * Q K^T (GEMM), mask only the kCausalDiagonal / kPartial tiles of the run, running
// max / denominator update, O = alpha * O + P V (GEMM). Rows with no admissible key end with
// O = 0 and LSE = -inf.
BlockResult AttendQueryTile(const QueryTile& in, TileScratch& t);

// Query block `qb` of a square layout over one contiguous (n, D) head slice (q pre-scaled),
// positions 0..n-1 on both axes.
QueryTile SquareQueryTile(const BlockLayout& layout, const IntervalRule& rule, int64_t qb,
                          const HeadSlice& in);

// Copies `n` float32 values into a `dtype` buffer at element offset `offset`.
void StoreRow(const float* src, int64_t n, HostTensor& dst, int64_t offset);
// Reads `n` values of a `dtype` buffer at element offset `offset` as float32 times `scale`.
void LoadRow(const HostTensor& src, int64_t offset, int64_t n, float scale, float* dst);

}  // namespace cpu_detail
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CPU_CPU_TILE_H_
