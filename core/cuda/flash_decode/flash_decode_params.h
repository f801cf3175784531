// FlashDecodeParams: the whole host -> kernel contract of the flash_decode family (split-KV
// attention for a few query rows against many keys). Plain data, no ownership: every pointer is
// device memory owned by the caller and must outlive the launch.
//
// The family packs the query rows that share a KV head (GQA: kv_group query heads x q_len tokens,
// "rows" below) into one MMA tile, so each K/V byte is read once per KV head, and cuts the admitted
// key range into num_splits contiguous pieces, one CTA per (split, KV head, batch): a handful of
// query rows still fills every SM. Each CTA writes its piece's normalised O and LSE (f32) to the
// partial buffers; the combine kernel merges the pieces by LSE into O and LSE. With one split the
// CTA writes O and LSE itself.
#ifndef ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_PARAMS_H_
#define ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_PARAMS_H_

#include <cstdint>

#include "core/tensor/dtype.h"

namespace attnserve {

struct FlashDecodeParams {
  // q [batch, q_len, Hq, D], k/v [batch, kv_len, Hkv, D] (strides below), o like q in `dtype`
  // (float32 when o_f32), lse [batch, Hq, q_len] float32 natural log.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  bool o_f32 = false;  // O is written as float32 (an f32 accumulator the caller converts)

  // Partial results of the splits (num_splits > 1 only; FlashDecodeWorkspaceBytes):
  // o_partial [num_splits, batch, kv_heads, rows, head_dim], lse_partial [num_splits, batch,
  // kv_heads, rows]; row r of a KV head is query token r / kv_group, query head
  // kv_head * kv_group + r % kv_group.
  float* o_partial = nullptr;
  float* lse_partial = nullptr;

  // Element strides: batch, token row, head.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 1;

  int32_t batch = 1;
  int32_t kv_heads = 0;
  int32_t kv_group = 1;  // Hq / Hkv
  int32_t head_dim = 0;  // 64 or 128
  int32_t q_len = 0;     // query tokens; rows = q_len * kv_group <= kFlashDecodeMaxRows
  int64_t kv_len = 0;    // key rows

  // Global positions of query row 0 and key row 0; the rules compare positions.
  int64_t q_pos_offset = 0;
  int64_t k_pos_offset = 0;
  bool causal = false;  // key position <= query position
  int64_t window = -1;  // |query position - key position| <= window; -1: no window

  // Key rows, from the rules (FillFlashDecodeRanges): [key_begin, key_end) holds every key some
  // query admits; [full_begin, full_end) the keys every query admits (tiles inside need no mask).
  int64_t key_begin = 0, key_end = 0;
  int64_t full_begin = 0, full_end = 0;

  // Split s covers key rows [key_begin + s * split_keys, min(+ split_keys, key_end));
  // split_keys is a multiple of the 64-key tile; every split holds at least one key.
  int32_t num_splits = 1;
  int64_t split_keys = 0;

  // Which split kernel runs (PlanFlashDecodeSplits): false the mma.sync kernel (any sm_80+),
  // true the wgmma one (sm_90a build on a 9.x device).
  bool wgmma = false;

  DType dtype = DType::kBF16;  // of q, k, v (bf16 or f16) and of o unless o_f32
  float scale = 0.f;           // softmax scale applied to q.k
  float scale_log2 = 0.f;      // scale * log2(e): the kernel works in exp2
};

// Rows of one KV head a CTA packs: four MMA row tiles of 16 (kv_group * q_len <= 64).
inline constexpr int kFlashDecodeMaxRows = 64;

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_CUDA_FLASH_DECODE_FLASH_DECODE_PARAMS_H_
