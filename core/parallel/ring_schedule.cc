#include "core/parallel/ring_schedule.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// Cuts `units` into `parts` counts, as even as possible, earlier parts taking the remainder.
std::vector<int64_t> EvenCounts(int64_t units, int64_t parts) {
  std::vector<int64_t> counts(parts, units / parts);
  for (int64_t i = 0; i < units % parts; ++i) ++counts[i];
  return counts;
}

// Ranges of `parts` consecutive pieces of [0, n) cut on multiples of `unit`.
std::vector<TokenRange> CutRanges(int64_t n, int64_t parts, int64_t unit) {
  const int64_t units = (n + unit - 1) / unit;
  std::vector<TokenRange> out;
  int64_t u = 0;
  for (int64_t c : EvenCounts(units, parts)) {
    out.push_back({std::min(u * unit, n), std::min((u + c) * unit, n)});
    u += c;
  }
  return out;
}

// Cuts range r into `parts` sub-ranges on `unit` boundaries, units shared out as evenly as
// possible (earlier parts take the remainder).
std::vector<TokenRange> CutRange(const TokenRange& r, int parts, int64_t unit) {
  std::vector<TokenRange> out;
  const int64_t units = (r.size() + unit - 1) / unit;
  int64_t cum = 0;
  for (int i = 0; i < parts; ++i) {
    const int64_t b = std::min(r.end, r.begin + cum * unit);
    cum += units / parts + (i < units % parts ? 1 : 0);
    out.push_back({b, std::min(r.end, r.begin + cum * unit)});
  }
  return out;
}

int Mod(int64_t a, int64_t m) { return static_cast<int>((a % m + m) % m); }

// Slot of stream entry X_m (see the header's policies); nslots = RingSlotTokens(...).size().
int SlotOf(const RingSchedule& s, int64_t m, int nslots) {
  if (s.slot_policy == RingSlotPolicy::kKeepHome && nslots > 1) {
    return m == 0 ? 0 : 1 + Mod(m - 1, nslots - 1);
  }
  return Mod(m, nslots);
}

// Source rank and piece of rank p's stream entry X_m.
std::pair<int, int> EntryOf(const RingSchedule& s, int p, int64_t m) {
  const int64_t mm = m % s.period();
  return {Mod(p - mm / s.kv_pieces, s.ranks), static_cast<int>(mm % s.kv_pieces)};
}

// Rank p's ticks: stream entries, slots, transfers and (query range, key range) pairs.
std::vector<RingTick> MakeTicks(const RingSchedule& s, int p) {
  const int64_t period = s.period(), T = s.ticks();
  const int c = s.kv_pieces;
  const int nslots = static_cast<int>(s.slot_tokens[p].size());
  const bool moves = s.circulate && s.ranks > 1;
  std::vector<RingTick> ticks(T);
  for (int64_t k = 0; k < T; ++k) {
    RingTick& tick = ticks[k];
    tick.q_chunk = static_cast<int>(k / period);
    std::tie(tick.source, tick.kv_piece) = EntryOf(s, p, k);
    tick.slot = SlotOf(s, k, nslots);
    tick.chunk_begins = k % period == 0;
    tick.chunk_ends = (k + 1) % period == 0;
    // The entry received this tick: X_{k+1} when the home stays put, else X_{k+c}.
    const int64_t next = s.slot_policy == RingSlotPolicy::kKeepHome ? k + 1 : k + c;
    const bool transfer =
        moves && (s.slot_policy == RingSlotPolicy::kRestoreHome ? true : next < T);
    if (transfer) {
      tick.send = {tick.slot, Mod(p + 1, s.ranks), tick.source, tick.kv_piece,
                   s.kv_piece[tick.source][tick.kv_piece].tokens};
      const auto [src, piece] = EntryOf(s, p, next);
      tick.recv = {SlotOf(s, next, nslots), Mod(p - 1, s.ranks), src, piece,
                   s.kv_piece[src][piece].tokens};
    }
    const std::vector<TokenRange>& qranges = s.q_chunk[p][tick.q_chunk].ranges;
    const std::vector<TokenRange>& kranges = s.kv_piece[tick.source][tick.kv_piece].ranges;
    for (const TokenRange& q : qranges) {
      for (const TokenRange& kr : kranges) {
        if (q.size() == 0 || kr.size() == 0) continue;
        RingPair pair;
        pair.q = q;
        pair.k = kr;
        pair.q_row = LocalRow(s.split[p], q.begin);
        pair.acc_row = LocalRow(qranges, q.begin);
        pair.k_row = LocalRow(kranges, kr.begin);
        tick.pairs.push_back(pair);
      }
    }
  }
  return ticks;
}

}  // namespace

std::vector<std::vector<TokenRange>> SplitSequence(int64_t n, int parts, SplitKind kind,
                                                   int64_t unit) {
  std::vector<std::vector<TokenRange>> out(parts);
  if (kind == SplitKind::kContiguous) {
    std::vector<TokenRange> r = CutRanges(n, parts, unit);
    for (int p = 0; p < parts; ++p) out[p] = {r[p]};
  } else {
    std::vector<TokenRange> chunks = CutRanges(n, 2 * static_cast<int64_t>(parts), unit);
    for (int p = 0; p < parts; ++p) out[p] = {chunks[p], chunks[2 * parts - 1 - p]};
  }
  return out;
}

int64_t LocalRow(const std::vector<TokenRange>& ranges, int64_t pos) {
  int64_t row = 0;
  for (const TokenRange& r : ranges) {
    if (pos >= r.begin && pos < r.end) return row + (pos - r.begin);
    row += r.size();
  }
  return row;  // pos == end of the last range (empty ranges): one past the shard
}

absl::StatusOr<std::vector<RingChunk>> CutShard(const std::vector<TokenRange>& ranges, int m,
                                                int64_t unit, const char* what, bool mirror) {
  std::vector<RingChunk> out;
  if (m == 1) {
    RingChunk c;
    c.ranges = ranges;
    for (const TokenRange& r : ranges) c.tokens += r.size();
    out.push_back(std::move(c));
    return out;
  }
  if (mirror && ranges.size() == 2) {
    // Chunk j = {L_j, H_{m-1-j}}: its positions sum to about N per row pair, so every chunk has
    // about the same causal work on every rank, which keeps the ranks' ticks in step.
    const std::vector<TokenRange> lo = CutRange(ranges[0], m, unit);
    const std::vector<TokenRange> hi = CutRange(ranges[1], m, unit);
    for (int j = 0; j < m; ++j) {
      RingChunk c;
      c.ranges = {lo[j], hi[m - 1 - j]};
      c.row = LocalRow(ranges, lo[j].begin);
      c.tokens = lo[j].size() + hi[m - 1 - j].size();
      out.push_back(std::move(c));
    }
    return out;
  }
  const int nr = static_cast<int>(ranges.size());
  if (nr == 0 || m % nr != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring: ", what, " = ", m, " must be a multiple of the shard's ", nr,
        " ranges (zigzag causal splits need an even count)"));
  }
  const int per = m / nr;
  int64_t row = 0;
  for (const TokenRange& r : ranges) {
    for (const TokenRange& part : CutRange(r, per, unit)) {
      RingChunk c;
      c.ranges = {part};
      c.row = row;
      c.tokens = part.size();
      row += c.tokens;
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<int64_t> RingSlotTokens(RingSlotPolicy policy, bool circulate, int ranks,
                                    int kv_pieces, int64_t own_shard_tokens,
                                    int64_t max_shard_tokens, int64_t max_kv_piece_tokens) {
  const bool moves = circulate && ranks > 1;
  if (policy == RingSlotPolicy::kKeepHome) {
    std::vector<int64_t> slots = {own_shard_tokens};
    for (int i = 0; moves && i < std::min(2, ranks - 1); ++i) slots.push_back(max_shard_tokens);
    return slots;
  }
  return std::vector<int64_t>(moves ? kv_pieces + 1 : kv_pieces, max_kv_piece_tokens);
}

int64_t RingSchedule::MaxQChunkTokens(int rank) const {
  int64_t mx = 0;
  for (const RingChunk& c : q_chunk[rank]) mx = std::max(mx, c.tokens);
  return mx;
}

absl::StatusOr<RingSchedule> MakeRingSchedule(std::vector<std::vector<TokenRange>> split,
                                              SplitKind kind, const RingScheduleOptions& options) {
  const int qc = options.q_chunks, c = options.kv_pieces;
  if (qc < 1 || c < 1 || split.empty() || options.unit < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring: q_chunks and kv_pieces must be >= 1 (got ", qc, ", ", c, ") over >= 1 ranks"));
  }
  if (options.slots == RingSlotPolicy::kKeepHome && (qc != 1 || c != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring: the keep-home slot policy is the (1, 1) schedule, got (", qc, ", ", c, ")"));
  }
  RingSchedule s;
  s.ranks = static_cast<int>(split.size());
  s.q_chunks = qc;
  s.kv_pieces = c;
  s.circulate = options.circulate;
  s.slot_policy = options.slots;
  s.split_kind = kind;
  s.split = std::move(split);
  s.shard_tokens.assign(s.ranks, 0);
  for (int p = 0; p < s.ranks; ++p) {
    for (const TokenRange& r : s.split[p]) s.shard_tokens[p] += r.size();
    s.max_shard_tokens = std::max(s.max_shard_tokens, s.shard_tokens[p]);
    ATTN_ASSIGN_OR_RETURN(
        std::vector<RingChunk> qcs,
        CutShard(s.split[p], qc, options.unit, "q_chunks", kind == SplitKind::kZigzag));
    ATTN_ASSIGN_OR_RETURN(std::vector<RingChunk> kps,
                          CutShard(s.split[p], c, options.unit, "kv_pieces"));
    for (const RingChunk& x : qcs) s.max_q_chunk_tokens = std::max(s.max_q_chunk_tokens, x.tokens);
    for (const RingChunk& x : kps) {
      s.max_kv_piece_tokens = std::max(s.max_kv_piece_tokens, x.tokens);
    }
    s.q_chunk.push_back(std::move(qcs));
    s.kv_piece.push_back(std::move(kps));
  }
  for (int p = 0; p < s.ranks; ++p) {
    s.slot_tokens.push_back(RingSlotTokens(s.slot_policy, s.circulate, s.ranks, c,
                                           s.shard_tokens[p], s.max_shard_tokens,
                                           s.max_kv_piece_tokens));
  }
  const int nslots = static_cast<int>(s.slot_tokens[0].size());
  if (s.slot_policy != RingSlotPolicy::kConsumeHome) {
    // kRestoreHome: home piece j ends the run in the slot of X_{T+j}; otherwise nothing moves.
    const bool rotates = s.slot_policy == RingSlotPolicy::kRestoreHome && s.circulate &&
                         s.ranks > 1;
    for (int j = 0; j < nslots; ++j) {
      s.next_run_slot.push_back(rotates ? SlotOf(s, s.ticks() + j, nslots) : j);
    }
  }
  for (int p = 0; p < s.ranks; ++p) s.rank_ticks.push_back(MakeTicks(s, p));
  return s;
}

}  // namespace attnserve
