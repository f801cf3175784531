// flash_fwd_sm90 PTX wrappers shared by the Hopper kernels: cp.async, proxy fences,
// wgmma fence/commit/wait, named barriers, mbarriers, setmaxnreg, the wgmma shared-memory
// descriptor and the 128-byte-swizzled tile addressing (layout described in
// flash_fwd_sm90_mainloop.cuh).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_UTILS_CUH_
#define ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

// Device code exists only in the sm_90a pass; other passes (sm_80) compile a trapping stub that
// the runtime dispatch never launches (it requires compute capability 9.x).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTNSERVE_FLASH_SM90_DEVICE 1
#else
#define ATTNSERVE_FLASH_SM90_DEVICE 0
#endif

namespace attnserve {
namespace flash_sm90 {

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

// Named barriers between the two consumer warpgroups (0 is __syncthreads): one side syncs, the
// other only arrives, so the syncing side waits for the arriving one and never the other way.
__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// 2^x on the SFU, flushing denormals: ex2(-inf) = +0, which the masked scores rely on.
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
__device__ __forceinline__ constexpr uint64_t MakeDesc(uint32_t smem_addr, uint32_t lbo,
                                                      uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  d |= uint64_t{1} << 62;
  return d;
}

// The descriptor of (the descriptor's address + off16 * 16 bytes): one 64-bit add, which Hopper
// issues as a single uniform instruction (UIADD3.64) and which stays inside the start-address
// field (no carry out of bits [0, 14)) while shared-memory addresses stay below 2^18. (A 32-bit
// add on the low word joined with the constant high word cost an add plus a UMOV of the high word
// per descriptor and k-step: ptxas re-sets the high word of every descriptor register pair.)
__device__ __forceinline__ uint64_t DescAdd(uint64_t d, uint32_t off16) {
  return d + off16;
}

// Byte offset of (row, 16-byte chunk) in a swizzled (kRows, kHeadDim) tile of column panels.
template <int kRows>
__device__ __forceinline__ uint32_t TileOffset(int row, int chunk) {
  const int panel = chunk >> 3;
  const int c = chunk & 7;
  return static_cast<uint32_t>(panel * kRows * 128 + row * 128 + ((c ^ (row & 7)) << 4));
}

// ---- mbarriers and register reallocation (the warp-specialized persistent kernel) ----

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Release (CTA scope) arrive: orders this thread's earlier generic-proxy accesses before it.
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile(
      "{\n.reg .b64 st;\n"
      "mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
      : "memory");
}
// A launch's z = batch * num_segs + seg split into its parts; no integer division in the common
// case of one segment per batch.
struct BatchSeg {
  int batch;
  int seg;
};
__device__ __forceinline__ BatchSeg SplitZ(int z, int num_segs) {
  return {num_segs == 1 ? z : z / num_segs, num_segs == 1 ? 0 : z % num_segs};
}

// The thread's lane (%laneid), read where it is needed: volatile, so that it is neither hoisted
// nor merged with another read (a value kept across the tile loop costs a register).
__device__ __forceinline__ int LaneId() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}
// MbarArrive by lane 0 of the warp only, predicated inside the asm (no divergent branch in the
// consumer loop for ptxas to see around the wgmma pipeline). Callers are converged.
__device__ __forceinline__ void MbarArriveLane0(uint32_t bar, int lane) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 st;\n"
      "setp.eq.s32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}
// The cluster form of MbarArriveLane0 (kClusterM CTAs load each K / V stage together, TMA
// multicast): lane r < kClusterM arrives on the barrier at this offset in CTA r of the cluster,
// so that every CTA whose producer writes into this CTA's stage learns that it was released;
// lane kNoArriveLane (or any lane >= kClusterM) arrives nowhere. kClusterM 1 is MbarArriveLane0.
// The arrive's default semantics (release, CTA scope), as CUTLASS's cluster pipelines release a
// stage: what it orders is this warp's wgmma reads of the stage, complete at the preceding
// wgmma.wait_group, before the other CTA's TMA overwrites it. Written .release.cluster, ptxas put
// MEMBAR.ALL.GPU and two error barriers before every arrive, and the dense kernel ran 13-16%
// slower than without the cluster (H200).
inline constexpr int kNoArriveLane = 32;
template <int kClusterM>
__device__ __forceinline__ void MbarArriveClusterLanes(uint32_t bar, int lane) {
  if constexpr (kClusterM == 1) {
    MbarArriveLane0(bar, lane);
  } else {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b32 ra;\n"
        "setp.lt.u32 p, %1, %2;\n"
        "mapa.shared::cluster.u32 ra, %0, %3;\n"
        "@p mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
        "r"(lane), "n"(kClusterM), "r"(lane & (kClusterM - 1))
        : "memory");
  }
}
// Every thread of the cluster's CTAs (release / acquire at cluster scope): after the barrier
// initialisation, before any CTA of the cluster signals another's barriers.
__device__ __forceinline__ void ClusterSync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}
// Acquire (CTA scope) wait for the phase with the given parity to complete. The retry loop is
// inside the asm (labels local to its braces): to the compiler the wait is one straight-line
// instruction, so no divergence is seen around the wgmma code that follows.
// try_wait carries a suspend-time hint (kMbarSuspendNs): a waiting warp sleeps until the phase
// completes (or the hint runs out) instead of re-polling. Without it the hardware's default
// limit is short and the loop spins: ncu of the dense kernel counted ~120 M executed YIELD /
// TRYWAIT / BRA instructions of the producer warps polling their empty barriers through whole
// items, issue slots taken from the consumer warps of the same schedulers
// (bench/results/h200x2-2026-11-27-kernel3/profile-vs-fa4; FA4's kernel, whose waits carry a
// hint, executes none).
inline constexpr uint32_t kMbarSuspendNs = 10000000;
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "MBAR_WAIT_RETRY:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2;\n"
      "@!p bra MBAR_WAIT_RETRY;\n}\n" ::"r"(bar),
      "r"(parity), "n"(kMbarSuspendNs)
      : "memory");
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNregInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNregDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Asks L2 to fetch `bytes` (a multiple of 16) at a 16-byte aligned global address; no data
// reaches the issuing thread and nothing waits for it.
__device__ __forceinline__ void PrefetchL2Bulk(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// ---- TMA (the persistent kernel's K/V producer) ----

// Arrives on `bar` and adds `bytes` to the transaction count its current phase waits for: the
// phase completes when every expected arrival happened and the TMA copies delivered the bytes.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 st;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
      "r"(bytes)
      : "memory");
}
// L2 eviction policies for the TMA loads' cache hint: evict_last for what many loads read again
// (K/V: every item of a head group reads its head's tiles), evict_first for what is read once
// (Q), so that the streamed bytes do not push the reused ones out of L2. The values are what
// `createpolicy.fractional.L2::evict_last.b64 p, 1.0` (evict_first) yields on sm_90, as
// constants, so that the compiler can materialize them at the load instead of keeping a
// createpolicy result live through the producer loop (the producer warps run at 32-64
// registers).
constexpr uint64_t kL2EvictFirst = 0x12F0000000000000ull;
constexpr uint64_t kL2EvictLast = 0x14F0000000000000ull;
// One box of a 5-D tensor map (coordinates innermost first) into shared memory at `dst`,
// completing its bytes on `bar`. The box lands in the map's swizzle (128 B here: the 16-byte
// chunk c of box row r at c ^ (r % 8), the layout TileOffset addresses); rows outside the tensor
// are zero-filled. Issued by one thread.
__device__ __forceinline__ void TmaLoad5d(uint32_t dst, const void* tensor_map, uint32_t bar, int c0,
                                          int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
      "l"(tensor_map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
// TmaLoad5d with an L2 cache policy (kL2EvictLast / kL2EvictFirst).
__device__ __forceinline__ void TmaLoad5d(uint32_t dst, const void* tensor_map, uint32_t bar,
                                          uint64_t policy, int c0, int c1, int c2, int c3,
                                          int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%4, %5, %6, %7, %8}], [%2], %3;\n" ::"r"(dst),
      "l"(tensor_map), "r"(bar), "l"(policy), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
// TmaLoad5d into the same shared-memory offset of every CTA of the cluster in `cta_mask`, the
// bytes completing on the barrier at `bar`'s offset in each of them.
__device__ __forceinline__ void TmaLoad5dMulticast(uint32_t dst, const void* tensor_map,
                                                   uint32_t bar, uint16_t cta_mask, int c0,
                                                   int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5, %6, %7, %8}], [%2], %3;\n" ::"r"(dst),
      "l"(tensor_map), "r"(bar), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
// Asks L2 to fetch one box of a 5-D tensor map (coordinates innermost first): nothing lands in
// shared memory and nothing waits for it. Issued by one thread.
__device__ __forceinline__ void TmaPrefetch5d(const void* tensor_map, int c0, int c1, int c2,
                                              int c3, int c4) {
  asm volatile(
      "cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];\n" ::"l"(
          tensor_map),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
// Makes mbarrier initialisations visible to the async proxy (the TMA unit completes bytes on
// them), before the CTA barrier that publishes them.
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Fetches a tensor map (a kernel parameter) into the TMA unit's descriptor cache ahead of use.
__device__ __forceinline__ void PrefetchTensorMap(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

#endif  // ATTNSERVE_FLASH_SM90_DEVICE

}  // namespace flash_sm90
}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_FWD_SM90_FLASH_FWD_SM90_UTILS_CUH_
