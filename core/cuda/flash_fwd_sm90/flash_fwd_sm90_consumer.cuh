// flash_fwd_sm90 consumer warpgroups of the persistent kernel (_persistent_kernel.cuh): the walk
// over the CTA's work items and their key tiles, with the softmax of a tile overlapped with the
// previous tile's P V GEMM, and the pipeline carried from one item into the next. The per-tile
// math is in _mainloop.cuh, masking, softmax and epilogue in _mask, _softmax and _epilogue.cuh,
// the barriers and roles in _warp_specialized.cuh.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_CONSUMER_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_CONSUMER_CUH_

#include <climits>
#include <type_traits>

#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_stamps.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_warp_specialized.cuh"

namespace attnserve {
namespace flash_sm90 {

#if ATTNSERVE_FLASH_SM90_DEVICE

// What a consumer warpgroup carries from one work item into the next: the P V GEMM of the item's
// last tile (its P, and the stage of its V) is issued with the next item's first S GEMM, and the
// item's epilogue runs once that GEMM completed, after the first tile's softmax, under the other
// warpgroups' GEMMs, instead of between the items with this warpgroup's GEMMs stopped. (Measured
// on an H200, seven interleaved reps, bench/results/h200x2-2026-11-28-kernel6/ab-xitem: 99% of
// block pairs skipped, ~5 tiles per item, 1.9% (random) and 3.8% (local_window) faster; dense,
// causal, D = 64 and 90% level within their spread.)
template <typename Traits>
struct ConsumerCarry {
  uint32_t pa[Traits::kBlock / 16][4];  // P of the pending tile, m64k16 A fragments
  bool pending = false;   // a P V GEMM is owed for V slot `stage` (warpgroup-uniform)
  int stage = 0;          // that V slot and its full-barrier parity
  uint32_t parity = 0;
  bool owed = false;      // the previous item's epilogue is owed (warpgroup-uniform)
  int row = 0, y = 0, z = 0;  // the previous item: its query-block row, head and z
  OnlineSoftmax<Traits::kBlock, Traits::kHeadDim> softmax;  // and its statistics
};

// The O rescale after the exponentials and the P packing at 128-key tiles: with the rescale
// branch between them, ptxas hoisted half the exponentials above it and left the row sums and
// P conversions behind, so that every tile ended on two dependent chains of ~30 additions;
// after, the additions and conversions interleave with the exponentials one for one, as in
// FA4's loop. H200, nine interleaved reps (bench/results/h200-2026-11-28-kernel14, a/ and c/):
// D = 64 0.9-1.0% faster (8 or 9 reps of 9), 99% skipped 0.2-0.3% (every rep), 90% level
// (cycles too: b/l2). At 176-key tiles (D = 128 dense and causal) the same order was 1.8%
// slower in every rep (c/), so they keep the rescale first.
constexpr bool RescaleOLast(int key_tile) { return key_tile == 128; }

// The 64 scale FFMAs of the exponents (s * scale_log2 - max) before the P V wait, under the GEMM,
// instead of after it next to the exponentials (which then take the scaled values): at D = 128
// with 128-key tiles 0.6-0.8% fewer cycles at 90% skipped in three calls, 99% level; at D = 64 3.3%
// more cycles, at 176-key tiles causal 2.9% slower (bench/results/h200-2026-11-29-kernel18). The
// same FFMAs on the same values either way: the results do not change by a bit.
constexpr bool ScaleBeforePvWait(int key_tile, int head_dim) {
  return key_tile == 128 && head_dim == 128;
}

// An item's first tile as a kept-max tile too, against the maxima of a quarter of its scores
// (OnlineSoftmax::EstimateFirstMax) instead of all of them: the CSR variants at 128-key tiles,
// whose items are short where it matters (99% of block pairs skipped: ~5 tiles per item).
template <typename Traits>
constexpr bool FirstTileKept() {
  return !Traits::kImplicitOnly && Traits::kBlock == 128;
}

// The item's tiles with the softmax of tile e overlapped with the P V GEMM of tile e - 1 inside
// the warpgroup. Per tile: S(e) and P(e-1) V(e-1) are issued back to back inside the ping-pong
// window (IssueScoresAndPV); S(e) is waited for first (the older group), K(e) goes back to the
// producer, S(e) is masked and its row maxima are taken while the P V GEMM still runs; then that
// GEMM is waited for, V(e-1) goes back, O is rescaled by tile e's factor (O_e = alpha_e (O_(e-1)
// + P_(e-1) V_(e-1)): the rescale must follow the GEMM that accumulates into O), and the
// exponentials turn S(e) into P(e), packed into the registers the GEMM was reading. At tile 0 the
// pending GEMM is the previous item's last (ConsumerCarry): once it completed, `finish_prev`
// writes that item's output and zeroes O for this item. The item's own last P V stays pending
// for the next item (or for the end of ConsumePersistent). Tile 0 is a compile-time variant of
// the tile (consume_tile's kFirst) outside the loop, so the loop holds no epilogue. K and V have
// separate barriers (full / empty for K, full_v / empty_v for V): V(e) is read a tile after
// K(e), and a shared stage barrier would hold K's half idle for that tile (measured: with one
// barrier per stage the overlap was 4-30% slower, bench/results/h200-2026-11-25-kernel/). P(e-1)
// (kBlock / 4 registers) is live next to S(e) and O.
//
// The softmax of a tile S(e) in two halves around the wait for the P V GEMM of tile e - 1, as
// FA4's sm90 SASS runs it (its source takes the exponentials before the wait; ptxas leaves ~9 of
// 64 there): the row maxima (and O's factors) under the P V GEMM, the exponentials after its
// wait, so that the P packing (registers the in-flight GEMM still reads) interleaves with them.
// (H200, h200x2-2026-11-28-kernel7/ab-ew, ab-hy: causal 2.0%, D = 64 1.2-1.6% faster,
// local_window 99% 1.6% slower; h200-2026-11-29-kernel16/c-order, h-split: all 64 exponentials
// before the wait 3% slower at 176-key tiles, 16 before it within 1.5% either way.)
//
// Kept-max tiles: after an item's first tile, a tile's exponents are taken against the running
// max as it stands, without the tile's row maxima (OnlineSoftmax::StepScaleKept), and checked
// after the exponentials by this thread's sums of the probabilities (KeptMaxHeld); only where a
// sum passed 2^8 in the warp are the maxima taken after all (KeptMaxMissed; on the benchmark's
// random inputs a max rarely grows that much after the first tile; scores whose maxima keep
// growing along the keys take it often, slower then but not wrong). That takes the 64 FMNMX, the
// quad shuffles and the rescale decision per tile and thread out of the loop, and the scale
// FFMAs start as soon as S(e) landed; where the check holds a tile computes what StepMax gives
// (which keeps a max that grew by at most 2^8). H200, seven interleaved reps against the build
// before (bench/results/h200-2026-11-29-kernel19): cycles -7% at 90% skipped, -5.5% at 99%,
// -7.5% dense, -6.5% causal, -10% D = 64; time -5 to -12%. Not for a masked tile or a warp with
// a row without a finite max (all its keys masked so far): those take StepMax. An item's first
// tile (kFirst: no max yet) takes StepMax too, except in the FirstTileKept variants, where the
// maxima of a quarter of its scores stand in for the running max (EstimateFirstMax: at most the
// tile's max, so that only the 2^8 side can miss; the fallback there leaves O alone, which still
// holds the previous item's output). H200, nine interleaved reps against the build before
// (bench/results/h200-2026-11-29-kernel20): 99% skipped 0.8% (random) and 1.3% (local_window)
// fewer cycles, 0.6-0.7% less time; 90%, dense and D = 64 level. Whether a tile keeps the max is
// warp-uniform (the full tiles: warpgroup-uniform).
//
// on_scores(arrive_lane) runs after every S wait with the lane that should arrive (the
// persistent kernel's q_empty release on the item's last tile, lane 1 = no arrive otherwise: a
// C++ branch on "last" in the loop would make ptxas serialize the wgmma). lane: the thread's
// lane. The implicit-only variants (192-row items, 176-key tiles) run tile e = key tile e with a
// mask kind known from e (ImplicitFirstMaskedTile): no shared-memory read per tile. Releases go
// to every CTA of the cluster (lanes 0 .. kClusterM - 1); kNone arrives nowhere.
//
// Issue: S(e) is issued also for a tile without work (its result is not read): a conditional S
// block ends in an empty commit group, which ptxas closes with a dummy wgmma that the profile
// showed warps stalling on (2% of the dense kernel's samples; the P V group, which must stay
// conditional since without a pending tile there is no landed V to multiply, now commits inside
// its branch: IssueScoresAndPV). Rows past the query end and keys past the key end are zeros in
// smem (TMA zero-fill), so the GEMM reads only landed data.
//
// Metadata: the tile's metadata (key block, mask kind) and whether this warpgroup has work in it
// are taken under the GEMMs, after the issue: the CSR variants read the stage's slot, rewritten
// only after this warpgroup's K release (read before the barrier, dense D = 128 was 6%, causal
// 1%, 99% skipped 1% slower on an H200: h200x2-2026-11-27-kernel3/ab-meta-order); the
// implicit-only ones compute it from e (a slot read before the barrier sat on the path to the
// GEMM issue: 2.1% / 0.8% more cycles at D = 64 / 128, h200x2-2026-11-28-kernel8/cycles). The
// lane is re-read per tile at three consumer warpgroups (kept, at 160 registers, ptxas spilled
// it), kept with two (the read's latency sat right after the S wait, kernel10/a).
//
// Bounds: the per-tile tests in 32-bit key-block numbers (blk = key block of the tile, k0 = blk *
// kBlock), set up once per item instead of 64-bit position compares per tile:
//   k0 < nk                          <=> blk < blk_end (0 for a warpgroup past the query end)
//   k0 + kBlock <= nk (not ragged)   <=> blk < blk_full
//   causal tile with no admissible key (k0 > last query row + delta) <=> blk > causal_last
// Implicit-only variants: tile e (= key block e) has work iff e < work_end (before the key end,
// and e < first_masked or e <= causal_last), and is masked iff e >= mask_from (a causal diagonal
// tile or the ragged last one).
template <typename Traits, typename OnScores, typename FinishPrev>
__device__ __forceinline__ void ConsumeItemOverlapped(
    const FlashFwdParams& p, const WarpSpecializedSmem& sm, uint32_t bar_full_v,
    uint32_t bar_empty_v,
    RingPos<Traits::kKStages>& ring, RingPos<Traits::kVStages>& vring, int count,
    const PingPong<Traits::kConsumerWarpgroups>& pp,
    const RingDescs<Traits>& descs, const ConsumerRow& cr, const ThreadRows& rows,
    int64_t nk, float (&acc_o)[Traits::kHeadDim / 2],
    OnlineSoftmax<Traits::kBlock, Traits::kHeadDim>& softmax, ConsumerCarry<Traits>& c,
    int lane, Stamps& st, OnScores on_scores, FinishPrev finish_prev) {
  constexpr int kBlock = Traits::kBlock;
  constexpr bool kImplicitOnly = Traits::kImplicitOnly;
  constexpr int kClusterM = Traits::kClusterM;
  constexpr int kNone = kClusterM == 1 ? 1 : kNoArriveLane;
  // V(e-1) waited for inside the ping-pong window at 128-key tiles (FA4's order): 0.7-1.1% fewer
  // cycles at 90% and D = 64 (h200x2-2026-11-28-kernel10/d), 1% more at 176 keys (kernel8).
  constexpr bool kVWaitInWindow = Traits::kBlock == 128 && Traits::kConsumerWarpgroups >= 2;
  constexpr bool kRescaleLast = RescaleOLast(Traits::kBlock);
  constexpr bool kScaleEarly = ScaleBeforePvWait(Traits::kBlock, Traits::kHeadDim);
  // Per-item bounds (header: bounds).
  const int64_t blocks_k = (nk + kBlock - 1) / kBlock;
  int blk_end = cr.active ? static_cast<int>(min(blocks_k, int64_t{INT_MAX})) : 0;
  int blk_full = static_cast<int>(min(nk / kBlock, int64_t{INT_MAX}));
  const int64_t last_row = cr.wg_row0 + 63 + rows.delta;
  int causal_last = last_row < 0 ? -1 : static_cast<int>(min(last_row / kBlock, int64_t{INT_MAX}));
  // Pinned (an empty asm "changes" them): kept, not recomputed from 64-bit positions per tile.
  asm volatile("" : "+r"(blk_end), "+r"(blk_full), "+r"(causal_last));
  int work_end = 0;
  int mask_from = 0;
  if constexpr (kImplicitOnly) {
    work_end = min(blk_end, max(cr.first_masked, causal_last + 1));
    mask_from = min(cr.first_masked, blk_full);
    asm volatile("" : "+r"(work_end), "+r"(mask_from));
  }
  // Tile e; kFirst (tile 0, a compile-time variant outside the loop) finishes the previous item
  // instead of rescaling O, so that the loop body holds no epilogue. Its K slot (stage, parity)
  // and V slot (vstage, vparity): one ring position in the uniform ring, two in the split ring.
  auto consume_tile = [&](auto first, int e) {
    constexpr bool kFirst = decltype(first)::value;
    const int stage = ring.stage;
    const uint32_t parity = ring.parity;
    ring.Advance();
    const int vstage = Traits::kSplitRing ? vring.stage : stage;
    const uint32_t vparity = Traits::kSplitRing ? vring.parity : parity;
    if constexpr (Traits::kSplitRing) vring.Advance();
    st.At(kStampStart);
    MbarWait(sm.bar_full + 8 * stage, parity);
    st.At(kStampKLanded);
    int mask = 0;
    int blk = 0;
    bool work = false;
    bool masked = false;  // the tile needs ApplyMask
    auto read_meta = [&] {  // run after the GEMM issue (below)
      if constexpr (kImplicitOnly) {
        blk = e;
        work = e < work_end;
        masked = e >= mask_from;
      } else if constexpr (Traits::kFullTiles) {  // whole full blocks (Sm90FullTiles)
        blk = sm.meta[2 * stage];
        work = blk < blk_end;
      } else {
        mask = sm.meta[2 * stage + 1];
        blk = sm.meta[2 * stage];
        work = blk < blk_end && !(mask == 1 && blk > causal_last);
        masked = mask != 0 || blk >= blk_full;
      }
    };
    auto wait_v = [&] { MbarWait(bar_full_v + 8 * c.stage, c.parity); st.At(kStampVLanded); };
    if (!kVWaitInWindow && c.pending) wait_v();

    float s[kBlock / 2];
    pp.BeforeScores();
    st.At(kStampTurn);
    // S(e) is issued also for a tile without work (header: issue).
    IssueScoresAndPV<Traits>(s, descs.Q(), descs.K(stage), /*scores=*/true, acc_o, c.pa,
                             descs.V(c.stage), c.pending,
                             [&] { if (kVWaitInWindow && c.pending) wait_v(); });
    pp.AfterScores();
    st.At(kStampIssued);
    // The tile's metadata, after the issue (header: metadata).
    static_assert(kImplicitOnly || Traits::kConsumerWarpgroups <= 2,
                  "a CSR variant with three consumer warpgroups would hold the slot's values "
                  "across the GEMM issue at 160 registers: measure where it reads them first");
    read_meta();
    const int ln = Traits::kConsumerWarpgroups >= 3 ? LaneId() : lane;
    WaitScoresOf<1>(s);
    st.At(kStampScores);
    on_scores(e + 1 == count ? ln : 1);
    MbarArriveClusterLanes<kClusterM>(sm.bar_empty + 8 * stage, ln);  // K(e) read (or not needed)
    float alpha[2] = {1.f, 1.f};
    float scaled_max[2] = {0.f, 0.f};
    bool kept = false;  // warp-uniform
    if (work) {
      if (masked) {  // warpgroup-uniform: a full tile skips the mask
        if constexpr (kImplicitOnly) mask = e >= cr.first_masked ? 1 : 0;
        ApplyMask<kBlock>(s, p, mask, static_cast<int64_t>(blk) * kBlock, nk, rows.my_row0,
                          rows.delta, rows.t);
      }
      if constexpr (!kFirst) {
        kept = Traits::kFullTiles ||
               (!masked && __all_sync(0xffffffffu, softmax.row_max[0] != -INFINITY &&
                                                       softmax.row_max[1] != -INFINITY));
      } else if constexpr (FirstTileKept<Traits>()) {
        if (!masked) kept = softmax.EstimateFirstMax(s);
      }
      if (kept) {
        softmax.StepScaleKept(s, p.scale_log2);
      } else {
        softmax.StepMax(s, alpha, scaled_max, p.scale_log2);
        if constexpr (kScaleEarly) softmax.StepScale(s, scaled_max, p.scale_log2);
      }
    }
    WgmmaWait<0>();
    st.At(kStampPv);
#pragma unroll
    for (int i = 0; i < Traits::kHeadDim / 2; ++i) FenceReg(acc_o[i]);
    // V(e-1) read.
    MbarArriveClusterLanes<kClusterM>(bar_empty_v + 8 * c.stage, c.pending ? ln : kNone);
    if (kept) {
      float pr[kBlock / 2];
      float t[2];
      softmax.StepExpKept(s, pr, t);
      PackP<typename Traits::Elem, kBlock>(pr, c.pa);  // interleaved with the exponentials
      if (!softmax.KeptMaxHeld(t)) {
        softmax.KeptMaxMissed(s, pr, t, alpha, p.scale_log2);
        // Tile 0: O is still the previous item's, and this item's has nothing to rescale.
        if constexpr (!kFirst) softmax.RescaleO(acc_o, alpha);
        PackP<typename Traits::Elem, kBlock>(pr, c.pa);
      }
      softmax.row_sum[0] += t[0];
      softmax.row_sum[1] += t[1];
    } else if (work) {
      if constexpr (!kFirst && !kRescaleLast) softmax.RescaleOWhereGrown(acc_o, alpha);
      softmax.template StepExp<kScaleEarly>(s, scaled_max, p.scale_log2);
      PackP<typename Traits::Elem, kBlock>(s, c.pa);
      if constexpr (!kFirst && kRescaleLast) softmax.RescaleOWhereGrown(acc_o, alpha);
    } else {
      // Nothing reads V(e): hand it back once it landed (the producer re-arms its barrier only
      // after the release, so the release must not overtake the copy).
      MbarWait(bar_full_v + 8 * vstage, vparity);
      MbarArriveClusterLanes<kClusterM>(bar_empty_v + 8 * vstage, ln);
    }
    if constexpr (kFirst) {
      // O is the previous item's, complete now: written out and zeroed for this item (whose
      // first tile needs no rescale). After PackP, so that S is no longer live.
      finish_prev();
    }
    c.pending = work;
    c.stage = work ? vstage : c.stage;
    c.parity = work ? vparity : c.parity;
    st.EndTile(e, count);
  };
  consume_tile(std::true_type{}, 0);
  for (int e = 1; e < count; ++e) consume_tile(std::false_type{}, e);
}

// Consumer warpgroup `wg`: per item, wait for Q and the item's metadata, run its 64 rows against
// the item's tiles (the ring continues across items), release Q after the last S GEMM. The
// item's last P V GEMM and its epilogue are carried into the next item's first tile
// (ConsumerCarry); after the CTA's last item they run on their own. An item without tiles writes
// its empty output from constants and leaves the carry alone. Softmax statistics are per item
// (the carried item's go with it), O is zeroed once its item is written.
// kDynamic: the dynamic deal (ItemQueue): the Q warp ends the item sequence with a row of -1.
template <typename Traits, bool kDynamic = false>
__device__ __forceinline__ void ConsumePersistent(const FlashFwdParams& p,
                                                  const WarpSpecializedSmem& sm,
                                                  uint32_t bar_full_v, uint32_t bar_empty_v,
                                                  const int* item_meta, int num_items, int64_t nk,
                                                  int wg, int warp, int lane) {
  constexpr int kHeadDim = Traits::kHeadDim;
  const int64_t delta = p.q_pos_offset - p.k_pos_offset;
  const int64_t row_in_wg = (warp % 4) * 16 + lane / 4;  // the thread's first row in its 64
  // The wgmma descriptors of this warpgroup's Q rows and of the K/V ring, built once.
  const RingDescs<Traits> descs(sm.q + wg * 64 * 128, sm.kv);

  const PingPong<Traits::kConsumerWarpgroups> pp(wg);
  pp.Start();
  float acc_o[kHeadDim / 2];  // (64, kHeadDim) O of this warpgroup, wgmma accumulator layout
  auto zero_o = [&] {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
  };
  zero_o();
  OnlineSoftmax<Traits::kBlock, kHeadDim> softmax;
  softmax.Reset();
  ConsumerCarry<Traits> c;
  Stamps st(wg);  // per-tile clock stamps in a developer's build (flash_fwd_sm90_stamps.cuh)
  const bool vector_ok = OutputVectorOk<typename Traits::Elem>(p);
  // The carried item's output (rows past the query end are skipped inside StoreOutput).
  auto store_prev = [&] {
    const int64_t wg_row0 = static_cast<int64_t>(c.row) * Traits::kBlockM + wg * 64;
    StoreOutput<typename Traits::Elem>(p, acc_o, c.softmax, MakeOutputBase(p, c.y, c.z),
                                       wg_row0 + row_in_wg, lane % 4, vector_ok);
  };
  RingPos<Traits::kKStages> ring;   // the K slot of the CTA's next tile
  RingPos<Traits::kVStages> vring;  // and its V slot (the split ring only)
  uint32_t local = 0;  // items of this CTA so far
  for (int item = CtaItem<Traits::kClusterM>(0); kDynamic || item < num_items;
       item = CtaItem<Traits::kClusterM>(static_cast<int>(++local))) {
    // Q rows and the metadata of this item (the Q warp), in Q buffer local % kQBufs: landed /
    // released (q_full / q_empty of this warpgroup), and its metadata slot.
    const int buf = static_cast<int>(local % Traits::kQBufs);
    const uint32_t bar_q_empty = QEmptyBar<Traits>(sm, buf, wg);
    const int* const meta = item_meta + 4 * (buf * Traits::kConsumerWarpgroups + wg);
    MbarWait(QFullBar<Traits>(sm, buf, wg), (local / Traits::kQBufs) & 1u);
    const int row = meta[0];
    if (kDynamic && row < 0) break;
    const int count = meta[1];
    const int y = meta[2];
    const int z = meta[3];
    const int64_t wg_row0 = static_cast<int64_t>(row) * Traits::kBlockM + wg * 64;
    if (count == 0) {
      // No S GEMM reads this Q; the item's rows have no admissible key: O = 0 and LSE = -inf
      // (accumulate mode: untouched), written from constants, so the carry goes on past it.
      MbarArriveLane0(bar_q_empty, lane);
      float zeros[kHeadDim / 2];
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) zeros[i] = 0.f;
      OnlineSoftmax<Traits::kBlock, kHeadDim> none;
      none.Reset();
      StoreOutput<typename Traits::Elem>(p, zeros, none, MakeOutputBase(p, y, z),
                                         wg_row0 + row_in_wg, lane % 4, vector_ok);
      continue;
    }
    softmax.Reset();
    const ConsumerRow cr{
        wg_row0, wg_row0 < p.seqlen,
        Traits::kImplicitOnly ? ImplicitFirstMaskedTile<Traits::kItemRows, Traits::kTileKeys>(p, row)
                              : INT_MAX};
    const ThreadRows rows{wg_row0 + row_in_wg, delta, lane % 4};
    ConsumeItemOverlapped<Traits>(
        p, sm, bar_full_v, bar_empty_v, ring, vring, count, pp, descs.WithQBuf(buf), cr, rows, nk,
        acc_o, softmax, c, lane, st,
        [&](int arrive_lane) { MbarArriveLane0(bar_q_empty, arrive_lane); },
        [&] {
          if (c.owed) {
            st.At(kStampEpilogue);
            store_prev();
            st.At(kStampStored);
            // O's registers are zeroed only after the stores read them (not moved elsewhere
            // first, which would make ptxas wait for the GEMMs right after their issue).
#pragma unroll
            for (int i = 0; i < kHeadDim / 2; ++i) FenceReg(acc_o[i]);
            zero_o();
          }
        });
    // This item's epilogue is owed from here on (after its last P V GEMM, when one is pending).
    c.owed = true;
    c.softmax = softmax;
    c.row = row;
    c.y = y;
    c.z = z;
  }
  // The CTA's last item: its pending GEMM and its epilogue.
  if (c.pending) {
    MbarWait(bar_full_v + 8 * c.stage, c.parity);
    GemmPVDesc<Traits>(acc_o, c.pa, descs.V(c.stage));
    MbarArriveClusterLanes<Traits::kClusterM>(bar_empty_v + 8 * c.stage, lane);
  }
  if (c.owed) store_prev();
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_CONSUMER_CUH_
