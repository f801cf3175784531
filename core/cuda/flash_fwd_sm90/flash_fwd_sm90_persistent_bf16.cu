// Instantiations of the sm90 persistent (warp-specialized) kernel: bf16, head dims 64/128,
// blocks 128 and 64;
// 192-row items at D = 64, 176-key tiles at D = 128 (also in clusters of two CTAs), layouts of
// whole full blocks.
#include "core/cuda/flash_fwd_sm90/flash_fwd_sm90_launch.cuh"

namespace attnserve {
template cudaError_t RunFlashFwdSm90PersistentImpl<64, __nv_bfloat16>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
template cudaError_t RunFlashFwdSm90PersistentImpl<128, __nv_bfloat16>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
// D = 64 items of 192 query rows (three consumer warpgroups).
template cudaError_t RunFlashFwdSm90PersistentImpl<64, __nv_bfloat16, 3>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
// D = 128 K/V tiles of 176 keys.
template cudaError_t RunFlashFwdSm90PersistentImpl<128, __nv_bfloat16, 2, 176>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
// The same in clusters of two CTAs sharing K/V loads (dense layout).
template cudaError_t RunFlashFwdSm90PersistentImpl<128, __nv_bfloat16, 2, 176, 2>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
// Layouts of whole full blocks (a CSR of kFull entries, dense non-causal): no mask path.
template cudaError_t RunFlashFwdSm90PersistentImpl<64, __nv_bfloat16, 2, 128, 1, true>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
template cudaError_t RunFlashFwdSm90PersistentImpl<128, __nv_bfloat16, 2, 128, 1, true>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
// Layout block 64 (one consumer warpgroup, two CTAs per SM).
template cudaError_t RunFlashFwdSm90PersistentImpl<64, __nv_bfloat16, 1, 64>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
template cudaError_t RunFlashFwdSm90PersistentImpl<128, __nv_bfloat16, 1, 64>(
    const FlashFwdParams&, int, int, bool, cudaStream_t, int*);
}  // namespace attnserve
