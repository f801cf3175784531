// The CUDA backend's choices, as one typed value: which attention engine runs dense/window work,
// which flash kernel runs the rest, and how the Hopper kernel schedules its tiles. The server
// parses them once from its flags (server/main.cc) and hands them to MakeCudaDevices; benches and
// tests build them the same way. Environment variables may still override them for A/B runs:
// CudaOptionsFromEnv reads them once, at start-up, never per launch.
#ifndef ATTNSERVE_CORE_CUDA_CUDA_OPTIONS_H_
#define ATTNSERVE_CORE_CUDA_CUDA_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/cuda/engine_table.h"

namespace attnserve {

// Which attention engine a CUDA device runs dense/window specs on.
//   kAuto:  cuDNN where it can run the case and our kernels could too, unless the engine table
//           (CudaOptions::engine_table) measured our kernels faster on that GPU and case; our
//           kernels otherwise.
//   kOwn:   our flash_fwd kernels only (cuDNN is never loaded).
//   kCudnn: cuDNN for every dense/window case it is meant for; no fallback.
// block_sparse and dilated specs always run on our kernels.
enum class AttentionEngine { kAuto, kOwn, kCudnn };

// Which of our flash forward kernels runs.
//   kAuto: the Hopper (sm_90a, wgmma) kernel where the build has it and the device is 9.x,
//          else the sm_80 (mma.sync) kernel.
//   kSm80: always the sm_80 kernel.   kSm90: the Hopper kernel, UNIMPLEMENTED where it cannot run.
enum class FlashKernelArch { kAuto, kSm80, kSm90 };

// How the Hopper kernel walks its work. One schedule remains:
//   kPersistent:  warp-specialized (a producer warpgroup feeds consumer warpgroups through a ring
//                 of shared-memory stages: mbarriers, setmaxnreg) on a persistent grid that walks
//                 the work items, at layout blocks 64 and 128.
// The option, its flags and ATTNSERVE_SM90_VARIANT stay so that command lines naming the schedule
// keep working; the removed schedules' names are refused (ParseSm90Schedule): a one-CTA-per-tile
// warp-specialized one ("v2", equal dense and slower sparse: bench/results/h200-2026-11-22c), and
// the one-CTA-per-tile kernel every thread loaded for ("single_tile", "v1"; 18-22% slower at
// block 64: bench/results/h200x2-2026-11-27-kernel4/ab-b64). RunInfo::kernel and the bench
// results name the kernel "sm90v3" (FlashKernelName, core/cuda/flash_fwd_sm90/flash_fwd_sm90.h;
// older results also have "sm90" and "sm90v2", the removed ones).
enum class Sm90Schedule { kPersistent };

// Order of the persistent schedule's work items: (head, batch, segment) pairs in groups, a
// group's items position-major (heavy rows first where the layout says which).
//   kAuto:     groups as large as keep their K/V in half of L2 (Sm90HeadGroup in
//              flash_fwd_sm90.h), which makes long sequences head-major;
//   kPosition: one group (position-major over every head);  kHead: one pair per group.
enum class Sm90ItemOrder { kAuto, kPosition, kHead };

// Query rows of the persistent schedule's work items at D = 64 on the implicit dense and causal
// layouts (every other case has items of one layout block, 128 rows):
//   k128: two consumer warpgroups of 64 rows;
//   k192: three (512 threads; 32 producer / 160 consumer registers), so that one warpgroup's
//         softmax has two others' GEMMs to hide under, not one; needs TMA loads, else k128 runs.
//   kAuto: k192 (the tile FlashAttention-3 and -4 take at D = 64; measured in core/cuda/NOTES.md).
enum class Sm90QueryTile { kAuto, k128, k192 };

// Key rows of the persistent schedule's K/V tiles at D = 128 on the implicit dense and causal
// layouts (every CSR layout has tiles of one layout block, 128 keys):
//   k128: the layout block (three K/V stages);
//   k176: 176 keys (two stages; producer 40 / consumers 232 registers), the tile
//         FlashAttention-3 takes for dense D = 128: the per-tile work around the GEMMs is spread
//         over 1.375x the GEMM time; needs TMA loads, else k128 runs.
//   kAuto: k176 from 16384 keys on (measured on an H200: 4-6% faster at 65536, 2-6% at 16384,
//          slower at 4096; flash_fwd_sm90.cc: Sm90WideKeyTiles).
enum class Sm90KeyTile { kAuto, k128, k176 };

// CTAs per cluster of the persistent schedule on the implicit dense and causal layouts with
// 176-key tiles, D = 128 (elsewhere it runs one):
//   k1: every CTA loads its own K/V tiles;
//   k2: the two CTAs of a cluster run adjacent query rows of one head and load each K/V tile once
//       for both (TMA multicast: 41% fewer L2 bytes); needs TMA loads, else k1 runs.
//   kAuto: k2. Measured on an H200 (bench/results/h200x2-2026-11-28-kernel9): 1% more cycles
//          (the two CTAs wait for each other's stage releases), but at the 700 W cap the clock
//          settles higher (1684 against 1615 MHz under sustained dense load): dense 2.8% faster
//          at N = 65536, 0-4% at 16384; causal 2% at both. (At D = 64, 192-row items, it was
//          1.8% slower: not used there.)
enum class Sm90Cluster { kAuto, k1, k2 };

// How the persistent schedule hands its work items to the CTAs on the CSR layouts (the implicit
// dense and causal ones, whose items are alike, always deal them statically):
//   kStatic:  CTA b runs one item of every round of grid-size items, dealt back and forth
//             (CtaItem in flash_fwd_sm90_tile_scheduler.cuh), fixed before the launch;
//   kDynamic: the first two rounds so, then each CTA draws its next item from a counter in
//             device memory as it goes (one per stream: flash_fwd_sm90.cc), so a CTA that ran
//             slower items takes fewer; needs TMA loads, else kStatic runs.
//   kAuto:    kDynamic.
enum class Sm90ItemDeal { kAuto, kStatic, kDynamic };

// Requests with a few query rows per KV head against many keys (decode steps: Nq * Hq / Hkv <= 64,
// dense or window specs, not square):
//   kSplitKv:  the flash_decode kernels (split over the keys, query heads of a KV head packed);
//   kFlashFwd: the prefill kernels, one CTA per 64/128 query rows (for comparison).
enum class DecodeKernel { kSplitKv, kFlashFwd };

struct FlashKernelOptions {
  FlashKernelArch arch = FlashKernelArch::kAuto;
  DecodeKernel decode = DecodeKernel::kSplitKv;
  // > 0: the split-KV decode uses this many key splits (tests); 0: enough to fill the GPU.
  int decode_splits = 0;
  Sm90Schedule sm90_schedule = Sm90Schedule::kPersistent;
  // > 0 caps the persistent grid (tests: many work items per CTA); 0: no cap.
  int persistent_max_ctas = 0;
  Sm90ItemOrder item_order = Sm90ItemOrder::kAuto;
  // > 0: (head, batch, segment) pairs per work-item group, overriding item_order (tests: groups
  // of uneven size); 0: from item_order.
  int persistent_head_group = 0;
  // The persistent schedule's work-item height at D = 64 (Sm90QueryTile above).
  Sm90QueryTile sm90_query_tile = Sm90QueryTile::kAuto;
  // The persistent schedule's K/V tile at D = 128 (Sm90KeyTile above).
  Sm90KeyTile sm90_key_tile = Sm90KeyTile::kAuto;
  // The persistent schedule's cluster size on the dense layout (Sm90Cluster above).
  Sm90Cluster sm90_cluster = Sm90Cluster::kAuto;
  // How the persistent schedule deals CSR work items to its CTAs (Sm90ItemDeal above).
  Sm90ItemDeal sm90_item_deal = Sm90ItemDeal::kAuto;
  // The persistent schedule loads K and V by TMA (one thread issues a tile's boxes; the copies
  // complete on the stage barrier) where the tensors allow it (16-byte aligned pointers and
  // strides), else by cp.async from two producer warps; false: always cp.async.
  bool sm90_tma = true;
};

struct CudaOptions {
  AttentionEngine engine = AttentionEngine::kAuto;
  // What kAuto consults before it sends a dense/window case to cuDNN (core/cuda/engine_table.h;
  // the server's --engine-table). Null: the built-in table (BuiltinEngineTable).
  std::shared_ptr<const EngineTable> engine_table;
  FlashKernelOptions flash;
  // Page-locked host memory the process may hold for request buffers and staging
  // (core/cuda/pinned_host_pool.h); <= 0: half of the host's physical memory.
  int64_t pinned_host_cap_bytes = 0;
  // Runs one GPU holds at once (Device::lanes, >= 1): each lane has its own non-blocking stream,
  // timing events and cuDNN handle, so one request's host copies overlap another's kernels (H2D
  // and D2H run on separate copy engines). 1: one request at a time. Multi-GPU runs over NCCL
  // (rings, data parallel) take every lane of their GPUs; a context-parallel attend one of each.
  int lanes = 2;
};

// Names as the flags and environment variables spell them.
std::string_view AttentionEngineName(AttentionEngine engine);  // "auto", "own", "cudnn"
std::string_view FlashKernelArchName(FlashKernelArch arch);    // "auto", "sm80", "sm90"
std::string_view Sm90ScheduleName(Sm90Schedule schedule);      // "persistent"
std::string_view Sm90ItemOrderName(Sm90ItemOrder order);       // "auto", "position", "head"
std::string_view Sm90QueryTileName(Sm90QueryTile tile);        // "auto", "128", "192"
std::string_view Sm90KeyTileName(Sm90KeyTile tile);            // "auto", "128", "176"
std::string_view Sm90ClusterName(Sm90Cluster cluster);         // "auto", "1", "2"
std::string_view Sm90ItemDealName(Sm90ItemDeal deal);  // "auto", "static", "dynamic"

// Parsers; INVALID_ARGUMENT naming `what` (the flag or variable) and the accepted values.
absl::StatusOr<AttentionEngine> ParseAttentionEngine(std::string_view name,
                                                     std::string_view what = "engine");
absl::StatusOr<FlashKernelArch> ParseFlashKernelArch(std::string_view name,
                                                     std::string_view what = "flash kernel");
// Also takes the older name v3 for kPersistent; the removed schedules' names ("single_tile",
// "v1", "warp_specialized", "v2") are INVALID_ARGUMENT like any unknown name.
absl::StatusOr<Sm90Schedule> ParseSm90Schedule(std::string_view name,
                                               std::string_view what = "sm90 schedule");
absl::StatusOr<Sm90ItemOrder> ParseSm90ItemOrder(std::string_view name,
                                                 std::string_view what = "sm90 item order");
absl::StatusOr<Sm90QueryTile> ParseSm90QueryTile(std::string_view name,
                                                 std::string_view what = "sm90 query tile");
absl::StatusOr<Sm90KeyTile> ParseSm90KeyTile(std::string_view name,
                                             std::string_view what = "sm90 key tile");
absl::StatusOr<Sm90Cluster> ParseSm90Cluster(std::string_view name,
                                             std::string_view what = "sm90 cluster");
absl::StatusOr<Sm90ItemDeal> ParseSm90ItemDeal(std::string_view name,
                                               std::string_view what = "sm90 item deal");

// `base` with the environment's overrides applied, each read once here (unset or empty: keep):
// ATTNSERVE_ATTENTION_ENGINE, ATTNSERVE_FLASH_KERNEL, ATTNSERVE_SM90_VARIANT (v1|v3 or a
// schedule name), ATTNSERVE_SM90_V3_MAX_CTAS (an integer >= 0), ATTNSERVE_SM90_V3_ORDER,
// ATTNSERVE_SM90_V3_ITEM_DEAL. INVALID_ARGUMENT, naming the variable, for a value none of the parsers accepts.
absl::StatusOr<CudaOptions> CudaOptionsFromEnv(CudaOptions base = {});

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_CUDA_OPTIONS_H_
