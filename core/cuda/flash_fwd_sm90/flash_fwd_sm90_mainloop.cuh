// flash_fwd_sm90 consumer math of one key tile, shared by the Hopper kernels: the S = Q K^T
// wgmma (issue and wait kept apart, so that callers can place the ping-pong barrier between
// them), P packing to register A fragments, and O += P V.
//
// Shared-memory tiles (Q, and per stage K and V) are (rows, kHeadDim) bf16/f16 stored as
// kHeadDim / 64 column panels of (rows, 64): each row of a panel is 128 bytes, 8 rows form a
// 1024-byte atom, and 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the 128-byte swizzle
// wgmma decodes from address bits [4,7) ^ [7,10); tile bases are 1024-byte aligned).
// - Q (A of S = Q K^T) and K (B, N = keys) are K-major: descriptor SBO = 1024 (8-row groups), a
//   16-wide k-step advances the start address by 32 bytes inside the 128-byte row, and by a panel
//   (rows * 128 bytes) every 4 k-steps.
// - V (B of O = P V, N = head dim, K = keys) is the same bytes read MN-major (imm-trans-b = 1):
//   LBO = panel stride (next 64 head-dim columns), SBO = 1024 (next 8 keys); a 16-key k-step
//   advances by 16 * 128 = 2048 bytes.
// - S: (64, kBlock) f32 per warpgroup = kBlock / 2 registers per thread, wgmma m64n{kBlock}k16
//   SS. P = exp2(...) packed in registers to the m64k16 A fragments; O += P V with wgmma
//   m64n{kHeadDim}k16 RS. O: kHeadDim / 2 f32 registers per thread.
//
// Everything is forceinline and takes the accumulators by reference with compile-time sizes and
// fully unrolled loops, so S, P and O stay in registers. None of these functions branches on
// anything that is not warpgroup-uniform: ptxas serializes every wgmma of a kernel when it cannot
// prove the code around them warp-uniform (core/cuda/NOTES.md, C7515/C7518).
//
// Traits: Sm90PersistentTraits (Elem, kBF16, kBlock = key rows of a tile, kHeadDim,
// kPanelBytes, kQPanelBytes); the sm90 decode kernel passes FlashDecodeSm90Traits
// (core/cuda/flash_decode).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MAINLOOP_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MAINLOOP_CUH_

#include <cstdint>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_mask.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_softmax.cuh"
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_utils.cuh"
#include "core/cuda/flash_fwd_sm90/wgmma_ops.h"

namespace attnserve {
namespace flash_sm90 {

#if ATTNSERVE_FLASH_SM90_DEVICE

// The wgmma k-steps of S = Q K^T for the warpgroup's 64 rows: (64, kHeadDim) Q at q_wg times the
// (kBlock, kHeadDim) K tile, both K-major in smem, into s (64, kBlock); kHeadDim / 16 k-steps of
// 32 bytes inside a 128-byte panel row, the next panel every 4. Neither fenced nor committed.
// The descriptors are built once per call: their start-address field is (address >> 4) in bits
// [0, 14) and shared-memory addresses stay below 2^18, so the descriptor of (address + off) is
// the base descriptor + (off >> 4) without a carry out of the field: one add per k-step instead
// of MakeDesc's mask, shift and or (the profile of the dense kernel had ~50 uniform LOP3s per
// warp and tile, most of them descriptor arithmetic). ScoresStepsDesc takes the two descriptors
// (MakeDesc(q_wg, 16, 1024), MakeDesc(k_tile, 16, 1024)), ScoresSteps the addresses.
// Q's panels lie kQPanelBytes apart where the traits say so (Q tiles of another height than the
// K / V tiles: the persistent kernel's 192-row items, 176-key tiles), else kPanelBytes.
template <typename Traits>
constexpr uint32_t QPanelBytes() {
  if constexpr (requires { Traits::kQPanelBytes; }) {
    return Traits::kQPanelBytes;
  } else {
    return Traits::kPanelBytes;
  }
}
template <typename Traits>
__device__ __forceinline__ void ScoresStepsDesc(float (&s)[Traits::kBlock / 2], uint64_t da,
                                                uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < Traits::kHeadDim / 16; ++kk) {
    const uint32_t aoff = (kk / 4) * QPanelBytes<Traits>() + (kk % 4) * 32;
    const uint32_t boff = (kk / 4) * Traits::kPanelBytes + (kk % 4) * 32;
    Wgmma<Traits::kBlock, Traits::kBF16>::Ss(s, DescAdd(da, aoff >> 4), DescAdd(db, boff >> 4),
                                             kk > 0 ? 1 : 0);
  }
}
template <typename Traits>
__device__ __forceinline__ void ScoresSteps(float (&s)[Traits::kBlock / 2], uint32_t q_wg,
                                            uint32_t k_tile) {
  ScoresStepsDesc<Traits>(s, MakeDesc(q_wg, 16, 1024), MakeDesc(k_tile, 16, 1024));
}

// The wgmma k-steps of O (64, kHeadDim) += P (64, kBlock) V, V = the (kBlock, kHeadDim) tile read
// MN-major (LBO = panel stride: next 64 head-dim columns; SBO = 1024: next 8 keys; a 16-key k-step
// is 16 rows of 128 bytes), P from registers. Neither fenced nor committed; descriptors as in
// ScoresSteps (PvStepsDesc takes the V tile's, MakeDesc(v_tile, kPanelBytes, 1024)).
template <typename Traits>
__device__ __forceinline__ void PvStepsDesc(float (&acc_o)[Traits::kHeadDim / 2],
                                            uint32_t (&pa)[Traits::kBlock / 16][4], uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < Traits::kBlock / 16; ++kk) {
    Wgmma<Traits::kHeadDim, Traits::kBF16>::Rs(acc_o, pa[kk], DescAdd(db, (kk * 16 * 128) >> 4), 1);
  }
}

// A consumer warpgroup's wgmma descriptors for the persistent kernel's K/V ring: its Q rows (of
// Q buffer 0) and the tiles of K slot 0 and V slot 0; slot s's are one add away (K(s) / V(s)),
// and Q buffer b's (WithQBuf), since every tile lies below 2^18 (the start-address field takes
// offset >> 4 without a carry). Built once per warpgroup, so the per-tile path from the
// ping-pong barrier to the GEMM issue holds no descriptor arithmetic (the profile of the dense
// kernel had ~12 uniform instructions of it there per tile).
template <typename Traits>
struct RingDescs {
  // Whole 64-bit descriptors (the high words, SBO 1024 and the 128-byte swizzle, are constants),
  // so that a slot's or k-step's descriptor is one 64-bit add (UIADD3.64) of them. They are
  // pinned in registers (an empty asm that "changes" them) in every variant: otherwise the
  // compiler rebuilds them from the shared-memory base at every use, right after the ping-pong
  // barrier. (Measured on an H200, bench/results/h200x2-2026-11-28-kernel5/ab-ctl.log: pinned for
  // three consumer warpgroups as well, D = 64 is 3% faster than with them pinned for two only;
  // with the former 32-bit low words, pinning at three warpgroups had cost 2.5%,
  // h200x2-2026-11-27-kernel3/ab-slim.)
  uint64_t q, k0, v0;
  __device__ __forceinline__ RingDescs(uint32_t q_wg, uint32_t kv)
      : q(MakeDesc(q_wg, 16, 1024)),
        k0(MakeDesc(kv, 16, 1024)),
        v0(MakeDesc(kv + Traits::kVOffset, Traits::kPanelBytes, 1024)) {
    asm volatile("" : "+l"(q), "+l"(k0), "+l"(v0));
  }
  // The same descriptors with Q in buffer b.
  __device__ __forceinline__ RingDescs WithQBuf(int b) const {
    RingDescs d = *this;
    if constexpr (Traits::kQBufs > 1) {
      d.q = DescAdd(q, static_cast<uint32_t>(b) * (Traits::kQTileBytes >> 4));
    }
    return d;
  }
  __device__ __forceinline__ uint64_t Q() const { return q; }
  __device__ __forceinline__ uint64_t K(int slot) const {
    return DescAdd(k0, static_cast<uint32_t>(slot) * (Traits::kKStride >> 4));
  }
  __device__ __forceinline__ uint64_t V(int slot) const {
    return DescAdd(v0, static_cast<uint32_t>(slot) * (Traits::kVStride >> 4));
  }
};

// Issues S = Q K^T (ScoresSteps) as one commit group. Not waited for: WaitScores. s is not
// zeroed: the first k-step runs with scale-d 0, which ignores the accumulator's old value.
template <typename Traits>
__device__ __forceinline__ void IssueScores(float (&s)[Traits::kBlock / 2], uint32_t q_wg,
                                            uint32_t k_tile) {
#pragma unroll
  for (int i = 0; i < Traits::kBlock / 2; ++i) FenceReg(s[i]);
  WgmmaFence();
  ScoresSteps<Traits>(s, q_wg, k_tile);
  WgmmaCommit();
}

// Waits until at most kInFlight wgmma groups are pending, the S GEMM's among those done (the
// overlapped consumer: its P V group stays in flight), and pins s after the wait.
template <int kInFlight, int kSRegs>
__device__ __forceinline__ void WaitScoresOf(float (&s)[kSRegs]) {
  WgmmaWait<kInFlight>();
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) FenceReg(s[i]);
}
// Waits for the S GEMM issued by IssueScores (the only wgmma group in flight).
template <int kSRegs>
__device__ __forceinline__ void WaitScores(float (&s)[kSRegs]) {
  WaitScoresOf<0>(s);
}

// P (64, kBlock) from the S accumulator layout to wgmma A fragments (m64k16: 16 keys = two
// 8-key column groups per k-step): the accumulator of keys [16 kk, 16 kk + 16) of a thread's two
// rows is exactly the A fragment of k-step kk (the m16n8k16 register layout), so packing is
// in-register conversion, no shuffle.
template <typename Elem, int kBlock>
__device__ __forceinline__ void PackP(const float (&s)[kBlock / 2],
                                      uint32_t (&pa)[kBlock / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlock / 16; ++kk) {
    pa[kk][0] = Pack<Elem>(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = Pack<Elem>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = Pack<Elem>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = Pack<Elem>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O += P V (PvStepsDesc), waited for before returning: the caller releases the stage next.
// GemmPVDesc takes V's descriptor (RingDescs), GemmPV the tile's address.
template <typename Traits>
__device__ __forceinline__ void GemmPVDesc(float (&acc_o)[Traits::kHeadDim / 2],
                                           uint32_t (&pa)[Traits::kBlock / 16][4], uint64_t dv) {
#pragma unroll
  for (int kk = 0; kk < Traits::kBlock / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) FenceReg(pa[kk][j]);
  }
#pragma unroll
  for (int i = 0; i < Traits::kHeadDim / 2; ++i) FenceReg(acc_o[i]);
  WgmmaFence();
  PvStepsDesc<Traits>(acc_o, pa, dv);
  WgmmaCommit();
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < Traits::kHeadDim / 2; ++i) FenceReg(acc_o[i]);
}
template <typename Traits>
__device__ __forceinline__ void GemmPV(float (&acc_o)[Traits::kHeadDim / 2],
                                       uint32_t (&pa)[Traits::kBlock / 16][4], uint32_t v_tile) {
  GemmPVDesc<Traits>(acc_o, pa, MakeDesc(v_tile, Traits::kPanelBytes, 1024));
}

// The overlapped consumer's GEMM issue for tile e: S(e) = Q K(e)^T (when `scores`) as one commit
// group, then O += P(e-1) V(e-1) (when `pv`) as the next; neither is waited for. WgmmaWait<1>
// completes S (the older group), WgmmaWait<0> both. A skipped GEMM still commits its (empty)
// group, so the waits count the same groups on every path and no issued wgmma reaches the loop's
// back edge unwaited (ptxas serializes the kernel's wgmma otherwise, C7517). dq, dk, dv: the
// descriptors of Q, K(e) and V(e-1) (RingDescs). before_pv() runs between the two issues (the
// consumer's wait for V(e-1), where it waits there).
template <typename Traits, typename BeforePv>
__device__ __forceinline__ void IssueScoresAndPV(float (&s)[Traits::kBlock / 2], uint64_t dq,
                                                 uint64_t dk, bool scores,
                                                 float (&acc_o)[Traits::kHeadDim / 2],
                                                 uint32_t (&pa)[Traits::kBlock / 16][4],
                                                 uint64_t dv, bool pv, BeforePv before_pv) {
  constexpr int kPvSteps = Traits::kBlock / 16;
#pragma unroll
  for (int i = 0; i < Traits::kBlock / 2; ++i) FenceReg(s[i]);
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) FenceReg(pa[kk][j]);
  }
#pragma unroll
  for (int i = 0; i < Traits::kHeadDim / 2; ++i) FenceReg(acc_o[i]);
  WgmmaFence();
  // Each branch commits its own group: a commit after the branch closes on a dummy wgmma that
  // runs on every call (the profile showed warps stalling on it); inside the branch it closes on
  // the group's last wgmma, and only the skipped case pays for the empty group.
  if (scores) {
    ScoresStepsDesc<Traits>(s, dq, dk);
    WgmmaCommit();
  } else {
    WgmmaCommit();
  }
  before_pv();
  if (pv) {
    PvStepsDesc<Traits>(acc_o, pa, dv);
    WgmmaCommit();
  } else {
    WgmmaCommit();
  }
}

// Where a thread's scores sit: its first row (local query row of accumulator row g; the second
// is + 8) and its column pair t, plus the global position offset of queries vs keys.
struct ThreadRows {
  int64_t my_row0;
  int64_t delta;  // q_pos_offset - k_pos_offset
  int t;
};

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_MAINLOOP_CUH_
