// The split-KV decode path (the flash_decode kernels): a few query rows against a long key range,
// for dense and window rules (causal or not) on global positions. The host side: which problems
// it takes, the one place its params are filled, how many splits a launch uses, the workspace it
// needs, and the one runtime -> template dispatch (RunFlashDecode).
#ifndef ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_H_
#define ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/cuda/cuda_options.h"
#include "core/cuda/flash_decode/flash_decode_params.h"
#include "core/cuda/flash_fwd/flash_fwd_params_builder.h"
#include "core/tensor/dtype.h"

namespace attnserve {

// Whether the kernels implement this problem: bf16/f16, head dim 64 or 128, and the query rows
// of one KV head (q_len * kv_group) at most kFlashDecodeMaxRows.
bool FlashDecodeSupports(int64_t head_dim, DType dtype, int64_t q_len, int64_t kv_group);

// One decode problem: query rows [0, q_len) of `tensors` (pointers already at the first row) at
// positions q_pos.., against key rows [0, kv_len) at positions k_pos..; causal and window
// (-1: none) as in docs/DESIGN.md "The math". o_f32: O is written as float32.
struct FlashDecodeProblem {
  FlashFwdTensors tensors;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t q_pos = 0;
  int64_t k_pos = 0;
  bool causal = false;
  int64_t window = -1;
  float scale = 0.f;
  bool o_f32 = false;
};

// Strides, key ranges (FlashDecodeParams::key_begin.. full_end) and one split. No device call.
FlashDecodeParams BuildFlashDecodeParams(const FlashDecodeProblem& problem);

// Admitted (query, key) pairs of one (batch, query head): sum over the query rows.
int64_t FlashDecodeAdmittedPairs(const FlashDecodeParams& params);

// True when no query row admits any key (nothing to launch: O = 0, LSE = -inf).
inline bool FlashDecodeEmpty(const FlashDecodeParams& p) { return p.key_end <= p.key_begin; }

// Packed rows per KV head above which kAuto picks the wgmma kernel on Hopper: with 64 rows the
// mma.sync kernel's four warps are issue-bound (1.28x the bandwidth time at 128K keys on an H200,
// bench/results/h200-2026-11-25-decode/tuning.md); with up to 32 it streams at the bandwidth.
inline constexpr int64_t kFlashDecodeWgmmaMinRows = 32;

// Sets params->wgmma, the split kernel for the current device:
//   kAuto: the wgmma kernel for more than kFlashDecodeWgmmaMinRows packed rows where the build has
//          sm_90a and the device is 9.x, else the mma.sync kernel;
//   kSm80: the mma.sync kernel;  kSm90: the wgmma kernel, UNIMPLEMENTED where it cannot run.
absl::Status ChooseFlashDecodeKernel(FlashDecodeParams* params, FlashKernelArch arch);

// Chooses the split kernel (ChooseFlashDecodeKernel) and num_splits and split_keys for the
// current device: enough CTAs to fill every SM once (the occupancy of that kernel), every split at
// least kMinSplitTiles key tiles. `forced_splits` > 0 asks for that many (tests; capped by the key
// tiles).
absl::Status PlanFlashDecodeSplits(FlashDecodeParams* params, int forced_splits = 0,
                                   FlashKernelArch arch = FlashKernelArch::kAuto);

// Bytes of o_partial plus lse_partial for params' splits (0 with one split).
int64_t FlashDecodeWorkspaceBytes(const FlashDecodeParams& params);
// Points o_partial and lse_partial into `workspace` (device memory of FlashDecodeWorkspaceBytes
// bytes, 4-byte aligned).
void SetFlashDecodeWorkspace(FlashDecodeParams* params, void* workspace);
// An upper bound of FlashDecodeWorkspaceBytes for any device (admission estimates).
int64_t FlashDecodeWorkspaceBound(int64_t head_dim);

// Checks params (head dim, dtype, rows, grid, workspace present when split) and launches the
// split kernel and the combine. INVALID_ARGUMENT / UNIMPLEMENTED for what the kernels do not take,
// the CUDA error (with file:line) for a failed launch.
absl::Status RunFlashDecode(const FlashDecodeParams& params, cudaStream_t stream);

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_H_
