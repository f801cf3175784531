// flash_fwd_sm90: block-sparse attention forward for Hopper (sm_90a) with warpgroup MMA (wgmma).
//
// Same contract and semantics as flash_fwd/flash_fwd_kernel.cuh (FlashFwdParams): one CTA = one
// query block row of the layout (kBlock = 64 or 128 query rows) for one (batch*segment, head); it
// walks the row's kept key blocks (CSR col_idx or the implicit dense row), applies each block's
// mask kind (0 full, 1 causal diagonal, 2 partial = TokenRule on global positions) and the
// ragged-end bounds, keeps an exp2 online softmax in f32, and writes O (input dtype) + LSE
// (natural log), or LSE-merges into an f32 O in accumulate mode. Rows with no admissible key:
// O = 0, LSE = -inf (accumulate: untouched).
//
// Structure (see core/cuda/NOTES.md, "Hopper path"):
// - kBlock / 64 consumer warpgroups; warpgroup w owns query rows [64w, 64w + 64) of the tile.
//   All threads are consumers and also issue the cp.async loads (no producer warpgroup).
// - Key tile = the layout's whole key block (kBlock keys), so one tile = one CSR entry and one
//   mask kind.
// - Shared memory tiles (Q, and per stage K and V) are (rows, kHeadDim) bf16/f16 stored as
//   kHeadDim / 64 column panels of (rows, 64): each row of a panel is 128 bytes, 8 rows form a
//   1024-byte atom, and 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the 128-byte swizzle
//   wgmma decodes from address bits [4,7) ^ [7,10); tile bases are 1024-byte aligned).
//   * Q (A of S = Q K^T) and K (B, N = keys) are K-major: descriptor SBO = 1024 (8-row groups),
//     a 16-wide k-step advances the start address by 32 bytes inside the 128-byte row, and by a
//     panel (rows * 128 bytes) every 4 k-steps.
//   * V (B of O = P V, N = head dim, K = keys) is the same bytes read MN-major (imm-trans-b = 1):
//     LBO = panel stride (next 64 head-dim columns), SBO = 1024 (next 8 keys); a 16-key k-step
//     advances by 16 * 128 = 2048 bytes.
// - S: (64, kBlock) f32 per warpgroup = kBlock / 2 registers per thread, wgmma m64n{kBlock}k16 SS.
//   P = exp2(...) packed in registers to the m64k16 A fragments; O += P V with wgmma
//   m64n{kHeadDim}k16 RS. O: kHeadDim / 2 f32 registers per thread.
// - K/V: kStages-deep cp.async ring (16-byte copies into the swizzled layout, zero-fill past the
//   key end), gathered by col_idx; the load of tile t + kStages - 1 is issued before tile t's
//   math, so kStages - 1 kept blocks are in flight behind the MMAs.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_KERNEL_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/flash_fwd/flash_fwd_params.h"
#include "core/cuda/flash_fwd_sm90/wgmma_ops.h"

// Device code exists only in the sm_90a pass; other passes (sm_80) compile a trapping stub that
// the runtime dispatch never launches (it requires compute capability 9.x).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTNSERVE_FLASH_SM90_DEVICE 1
#else
#define ATTNSERVE_FLASH_SM90_DEVICE 0
#endif

namespace attnserve {
namespace flash_sm90 {

template <int kHeadDim_, int kBlock_, typename Elem_>
struct Sm90Traits {
  using Elem = Elem_;
  static constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlock = kBlock_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlock == 64 || kBlock == 128, "layout block 64 or 128");
  static constexpr int kWarpgroups = kBlock / 64;
  static constexpr int kNThreads = kWarpgroups * 128;
  static constexpr int kPanels = kHeadDim / 64;      // 128-byte column panels per tile row
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per tile row
  static constexpr int kTileBytes = kBlock * kHeadDim * 2;  // Q, K or V tile
  static constexpr int kPanelBytes = kBlock * 128;
  // Three stages: 2 kept blocks in flight behind the math (a CSR gather has no locality to hide
  // latency otherwise). D=128, block 128: Q 32 KB + 3 x (K + V) 64 KB = 224 KB (+1 KB alignment)
  // of the 227 KB a CTA may have; smaller tiles fit two CTAs per SM.
  static constexpr int kStages = 3;
  static constexpr int kSmemBytes = kTileBytes * (1 + 2 * kStages) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
};

#if ATTNSERVE_FLASH_SM90_DEVICE

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async
// proxy: this fence (after the data landed, before the barrier) makes the writes visible to it.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins a register value at this point of the program (no code): keeps the compiler from moving
// accumulator / fragment reads and writes across the wgmma fence / wait.
__device__ __forceinline__ void FenceReg(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void FenceReg(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

// Named barrier 1 between the two consumer warpgroups (0 is __syncthreads): warpgroup 1 syncs,
// warpgroup 0 only arrives, so warpgroup 1 waits for warpgroup 0 and never the other way round.
__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename Elem>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (all >> 4), layout type 1 (SWIZZLE_128B) in bits [62, 64). Base offset 0: every
// tile starts 1024-byte aligned.
__device__ __forceinline__ uint64_t MakeDesc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  d |= uint64_t{1} << 62;
  return d;
}

// Byte offset of (row, 16-byte chunk) in a swizzled (kRows, kHeadDim) tile of column panels.
template <int kRows>
__device__ __forceinline__ uint32_t TileOffset(int row, int chunk) {
  const int panel = chunk >> 3;
  const int c = chunk & 7;
  return static_cast<uint32_t>(panel * kRows * 128 + row * 128 + ((c ^ (row & 7)) << 4));
}

// Loads rows [row0, row0 + kRows) of a (., kHeadDim) matrix with element row stride `stride`
// into a swizzled tile; rows at or past `limit` are zero-filled (never read from global).
template <typename Traits>
__device__ __forceinline__ void LoadTile(uint32_t smem, const typename Traits::Elem* gbase,
                                         int64_t stride, int64_t row0, int64_t limit) {
  constexpr int kRows = Traits::kBlock;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % Traits::kNThreads == 0, "tile chunks divide the CTA");
#pragma unroll
  for (int i = 0; i < kTotal / Traits::kNThreads; ++i) {
    const int idx = i * Traits::kNThreads + static_cast<int>(threadIdx.x);
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int64_t token = row0 + r;
    const bool in = token < limit;
    const typename Traits::Elem* src = gbase + (in ? token : 0) * stride + c * 8;
    CpAsync16(smem + TileOffset<kRows>(r, c), src, in ? 16 : 0);
  }
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) FlashFwdSm90Kernel(const FlashFwdParams p) {
#if ATTNSERVE_FLASH_SM90_DEVICE
  using Elem = typename Traits::Elem;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlock = Traits::kBlock;
  constexpr int kStages = Traits::kStages;
  constexpr int kTileBytes = Traits::kTileBytes;
  constexpr int kPanelBytes = Traits::kPanelBytes;
  constexpr int kSRegs = kBlock / 2;     // S accumulator registers per thread (64 x kBlock / 128)
  constexpr int kORegs = kHeadDim / 2;   // O accumulator registers per thread
  constexpr int kNTilesS = kBlock / 8;   // 8-key column groups of S
  constexpr int kNTilesO = kHeadDim / 8;

  extern __shared__ unsigned char smem_raw[];
  // 1024-byte alignment of every tile (the 128-byte swizzle atom); kSmemBytes reserves the slack.
  const uint32_t smem_base = (SmemAddr(smem_raw) + 1023u) & ~1023u;
  const uint32_t smem_q = smem_base;
  const uint32_t smem_kv = smem_base + kTileBytes;  // stage s: K at 2s tiles, V at 2s + 1
  constexpr uint32_t kStageBytes = 2u * kTileBytes;

  const int tid = static_cast<int>(threadIdx.x);
  // Warp-uniform by construction (a shuffle from lane 0): with a plain tid / 128 ptxas cannot prove
  // the ping-pong branch below warp-uniform and serializes every wgmma (warning C7518).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // consumer warpgroup: rows [64 wg, +64)
  const int warp_in_wg = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const int64_t row =
      p.row_order != nullptr ? static_cast<int64_t>(p.row_order[blockIdx.x]) : blockIdx.x;
  const int head = p.head_start + static_cast<int>(blockIdx.y) * p.head_step;
  const int kv_head = head / p.kv_group;
  const int batch = static_cast<int>(blockIdx.z) / p.num_segs;
  const int seg = static_cast<int>(blockIdx.z) % p.num_segs;

  const Elem* q_base = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride +
                       seg * p.q_seg_stride + head * p.q_head_stride;
  const Elem* k_base = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride +
                       seg * p.k_seg_stride + kv_head * p.k_head_stride;
  const Elem* v_base = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride +
                       seg * p.v_seg_stride + kv_head * p.v_head_stride;
  const int64_t o_offset =
      batch * p.o_batch_stride + seg * p.o_seg_stride + head * p.o_head_stride;
  float* lse_base =
      p.lse + batch * p.lse_batch_stride + seg * p.lse_seg_stride + head * p.lse_head_stride;

  const int64_t q0 = row * kBlock;
  const int64_t n = p.seqlen;
  const int64_t nk = p.seqlen_k >= 0 ? p.seqlen_k : p.seqlen;
  const int64_t delta = p.q_pos_offset - p.k_pos_offset;

  int64_t begin = 0, count = 0;
  if (p.col_idx != nullptr) {
    begin = p.row_ptr[row];
    count = p.row_ptr[row + 1] - begin;
  } else {
    count = p.dense_causal ? min(row + 1, p.num_k_blocks) : p.num_k_blocks;
  }
  auto block_of = [&](int64_t e, int& mask) -> int64_t {
    if (p.col_idx != nullptr) {
      mask = p.block_mask[begin + e];
      return p.col_idx[begin + e];
    }
    mask = (p.dense_causal && e == row) ? 1 : 0;
    return e;
  };
  auto load_kv = [&](int64_t e, int stage) {
    int mask;
    const int64_t k0 = block_of(e, mask) * kBlock;
    const uint32_t base = smem_kv + stage * kStageBytes;
    LoadTile<Traits>(base, k_base, p.k_row_stride, k0, nk);
    LoadTile<Traits>(base + kTileBytes, v_base, p.v_row_stride, k0, nk);
  };

  // Prologue: Q rides with the first K/V group.
  LoadTile<Traits>(smem_q, q_base, p.q_row_stride, q0, n);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) load_kv(s, s);
    CpAsyncCommit();
  }

  float acc_o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw-score running max of rows g and g + 8
  float row_sum[2] = {0.f, 0.f};

  const int64_t wg_row0 = q0 + wg * 64;
  const int64_t my_row0 = wg_row0 + warp_in_wg * 16 + g;  // + 8 h
  const bool wg_active = wg_row0 < n;  // warpgroup-uniform: all its rows past the end -> idle

  // Q descriptors of this warpgroup's 64 rows (fixed for the whole loop).
  const uint32_t q_wg = smem_q + wg * 64 * 128;

  for (int64_t e = 0; e < count; ++e) {
    CpAsyncWait<kStages - 2>();
    FenceProxyAsyncShared();
    __syncthreads();  // tile e visible to every warpgroup; all done with tile e - 1's stage
    {
      const int64_t next = e + kStages - 1;
      if (next < count) load_kv(next, static_cast<int>(next % kStages));
      CpAsyncCommit();
    }

    int mask;
    const int64_t k0 = block_of(e, mask) * kBlock;
    // Warpgroup-uniform: rows past the end, or a causal diagonal whose keys all follow this
    // warpgroup's last row (nothing admissible) -> no math for this tile.
    const bool work = wg_active && k0 < nk && !(mask == 1 && k0 > wg_row0 + 63 + delta);

    const int stage = static_cast<int>(e % kStages);
    const uint32_t k_tile = smem_kv + stage * kStageBytes;
    const uint32_t v_tile = k_tile + kTileBytes;

    // Ping-pong (two warpgroups): warpgroup 1 issues its S GEMM only after warpgroup 0 issued
    // its own, so the tensor cores run S0, S1, then P0 V, P1 V while the other warpgroup does its
    // softmax, instead of both GEMMs together and then both softmaxes with the tensor cores idle.
    // Executed every tile by both warpgroups (also when `work` is false): one arrive per sync.
    if constexpr (Traits::kWarpgroups == 2) {
      if (wg == 1) NamedBarSync(1, 256);
    }
    // ---- S = Q K^T (64 x kBlock per warpgroup) ----
    float s[kSRegs];
    if (work) {
#pragma unroll
      for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
#pragma unroll
      for (int i = 0; i < kSRegs; ++i) FenceReg(s[i]);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t koff = (kk / 4) * kPanelBytes + (kk % 4) * 32;
        const uint64_t da = MakeDesc(q_wg + koff, 16, 1024);
        const uint64_t db = MakeDesc(k_tile + koff, 16, 1024);
        Wgmma<kBlock, Traits::kBF16>::Ss(s, da, db, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
    }
    if constexpr (Traits::kWarpgroups == 2) {
      if (wg == 0) NamedBarArrive(1, 256);
    }
    if (!work) continue;
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) FenceReg(s[i]);

    // ---- masks: block kind (CTA-uniform) and the ragged key end ----
    const bool ragged = k0 + kBlock > nk;
    if (mask != 0 || ragged) {
#pragma unroll
      for (int i = 0; i < kNTilesS; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t key = k0 + i * 8 + 2 * t + (j & 1);
          const int64_t qr = my_row0 + 8 * (j >> 1) + delta;  // key-row coordinates
          bool ok = key < nk;
          if (mask == 1) {
            ok = ok && key <= qr;
          } else if (mask == 2) {
            if (p.rule_causal) ok = ok && key <= qr;
            if (p.rule_window >= 0) {
              const int64_t d = qr - key;
              ok = ok && d <= p.rule_window && -d <= p.rule_window;
            }
          }
          if (!ok) s[4 * i + j] = -INFINITY;
        }
      }
    }

    // ---- online softmax (exp2 domain) ----
    float scaled_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
#pragma unroll
      for (int i = 0; i < kNTilesS; ++i) {
        mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // All keys masked so far: offset 0 so that exp2(-inf) = 0 rather than NaN.
      scaled_max[h] = mx == -INFINITY ? 0.f : mx * p.scale_log2;
      const float alpha = Exp2(row_max[h] * p.scale_log2 - scaled_max[h]);
      row_max[h] = mx;
      row_sum[h] *= alpha;
#pragma unroll
      for (int i = 0; i < kNTilesO; ++i) {
        acc_o[4 * i + 2 * h] *= alpha;
        acc_o[4 * i + 2 * h + 1] *= alpha;
      }
    }
#pragma unroll
    for (int i = 0; i < kNTilesS; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[4 * i + j] = Exp2(fmaf(s[4 * i + j], p.scale_log2, -scaled_max[j >> 1]));
        row_sum[j >> 1] += s[4 * i + j];
      }
    }

    // ---- O += P V: P as register A fragments (m64k16: two 8-key column groups each) ----
    uint32_t pa[kBlock / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      pa[kk][0] = Pack<Elem>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = Pack<Elem>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = Pack<Elem>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = Pack<Elem>(s[8 * kk + 6], s[8 * kk + 7]);
    }
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) FenceReg(pa[kk][j]);
    }
#pragma unroll
    for (int i = 0; i < kORegs; ++i) FenceReg(acc_o[i]);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      const uint64_t db = MakeDesc(v_tile + kk * 16 * 128, kPanelBytes, 1024);
      Wgmma<kHeadDim, Traits::kBF16>::Rs(acc_o, pa[kk], db, 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < kORegs; ++i) FenceReg(acc_o[i]);
  }
  CpAsyncWait<0>();

  if (!wg_active) return;  // no barrier below

  // ---- epilogue: as flash_fwd_kernel.cuh (quad-reduced denominators, O and natural-log LSE) --
  float row_l[2];
  float lse_prev[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    row_l[h] = l;
    const int64_t r = my_row0 + 8 * h;
    lse_prev[h] = (p.accumulate && r < n) ? lse_base[r * p.lse_row_stride] : -INFINITY;
  }
  __syncwarp();  // the quad's t == 0 lane rewrites the LSE the other three lanes just read
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = row_l[h];
    const bool empty = !(l > 0.f);
    const float inv = empty ? 0.f : 1.f / l;
    const int64_t r = my_row0 + 8 * h;
    if (r >= n) continue;
    const float lse_new = empty ? -INFINITY : row_max[h] * p.scale + logf(l);
    if (!p.accumulate) {
      Elem* orow = static_cast<Elem*>(p.o) + o_offset + r * p.o_row_stride;
#pragma unroll
      for (int i = 0; i < kNTilesO; ++i) {
        *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) =
            Pack<Elem>(acc_o[4 * i + 2 * h] * inv, acc_o[4 * i + 2 * h + 1] * inv);
      }
      if (t == 0) lse_base[r * p.lse_row_stride] = lse_new;
    } else if (!empty) {
      const float l_acc = lse_prev[h];
      const float l_max = fmaxf(l_acc, lse_new);
      const float l_out = l_max + log1pf(__expf(fminf(l_acc, lse_new) - l_max));
      const float w_acc = l_acc == -INFINITY ? 0.f : __expf(l_acc - l_out);
      const float w_new = __expf(lse_new - l_out) * inv;
      float* orow = static_cast<float*>(p.o) + o_offset + r * p.o_row_stride;
#pragma unroll
      for (int i = 0; i < kNTilesO; ++i) {
        float2* dst = reinterpret_cast<float2*>(orow + i * 8 + 2 * t);
        float2 cur = w_acc == 0.f ? make_float2(0.f, 0.f) : *dst;
        cur.x = fmaf(w_acc, cur.x, w_new * acc_o[4 * i + 2 * h]);
        cur.y = fmaf(w_acc, cur.y, w_new * acc_o[4 * i + 2 * h + 1]);
        *dst = cur;
      }
      if (t == 0) lse_base[r * p.lse_row_stride] = l_out;
    }
  }
#else
  // Built for an architecture without wgmma: never launched (the dispatch checks the device).
  __trap();
#endif  // ATTNSERVE_FLASH_SM90_DEVICE
}

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_KERNEL_CUH_
