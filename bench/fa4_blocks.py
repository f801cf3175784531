"""Block layouts of attnbench_cuda (--csr_dir) as FlashAttention-4 block-sparse inputs (numpy only).

attnbench_cuda dumps each block-sparse case's layout as two .npy files: <case>_row_ptr.npy (int64,
one entry per query block plus one) and <case>_col_idx.npy (int32, the kept key blocks of each
query block, row after row). Every kept (query block, key block) pair is attended in full: the
layouts have no token rule inside a block.

FlashAttention-4 (flash-attn-4 4.0.0b36, flash_attn.cute.block_sparsity.BlockSparseTensorsTorch)
takes a layout the FlexAttention way, per (batch, head, query block): "mask" blocks (a mask_mod
decides inside them) and "full" blocks (attended in full), each as a count and a list of key
block indices, valid entries packed left. Ours are all full blocks, so the mask lists are empty.
FA4 reads only the first `count` entries of a row, so the index table may be as narrow as the
longest row (it does not need one column per key block, as FlexAttention's BlockMask does).

What FA4 4.0.0b36 requires of the block sizes on Hopper (sm90), from its interface.py
(_tile_size_fwd_sm90, _fit_sm90_fwd_tile_to_block_sparsity) and block_sparsity.py
(normalize_block_sparse_config), for head dims up to 128:
  * the kernel's key tile (tile_n) is 128, shrunk to the key block when that is smaller and a
    multiple of 16; the key block must then equal tile_n (sm90 has no key sub-tiles: a key block
    of 256 is refused, Blackwell would split it);
  * the query block must be a multiple of the query tile (tile_m: 128, or 192 at D <= 64 when the
    block is a multiple of 192), which FA4 shrinks to 64 when the block is a multiple of 64 only;
  * the number of query blocks must be ceil(N / query block), key blocks ceil(N / key block).
Our layouts use 128 x 128 blocks: tile 128 x 128 at D = 64 and D = 128, one tile per block.
"""
import math
import os

import numpy as np

FA4_BLOCK_SPARSE_VERSION = "4.0.0b36"


def load_csr(csr_dir, name):
    """(row_ptr int64, col_idx int32) of case `name` from attnbench_cuda's --csr_dir."""
    rp = os.path.join(csr_dir, name + "_row_ptr.npy")
    ci = os.path.join(csr_dir, name + "_col_idx.npy")
    if not (os.path.exists(rp) and os.path.exists(ci)):
        raise FileNotFoundError(f"no CSR dump for {name} in {csr_dir}")
    return np.load(rp), np.load(ci)


def check_csr(row_ptr, col_idx, num_kv_blocks):
    """Raises ValueError naming the field and the rule when the CSR is not a valid layout."""
    row_ptr = np.asarray(row_ptr)
    col_idx = np.asarray(col_idx)
    if row_ptr.ndim != 1 or row_ptr.size < 2:
        raise ValueError("row_ptr: must be 1-D with at least 2 entries (one query block)")
    if row_ptr[0] != 0:
        raise ValueError(f"row_ptr[0]: must be 0, got {int(row_ptr[0])}")
    if np.any(np.diff(row_ptr) < 0):
        raise ValueError("row_ptr: must be non-decreasing")
    if col_idx.ndim != 1 or int(row_ptr[-1]) != col_idx.size:
        raise ValueError(f"row_ptr[-1]: must equal len(col_idx) = {col_idx.size}, "
                         f"got {int(row_ptr[-1])}")
    if col_idx.size and (col_idx.min() < 0 or col_idx.max() >= num_kv_blocks):
        raise ValueError(f"col_idx: entries must lie in [0, {num_kv_blocks}), got "
                         f"[{int(col_idx.min())}, {int(col_idx.max())}]")
    counts = np.diff(row_ptr)
    starts = np.repeat(row_ptr[:-1], counts)
    # Within a row, strictly increasing (no duplicate pair, which would be attended twice).
    inner = np.arange(col_idx.size) > starts
    if np.any(inner & (np.diff(col_idx, prepend=-1) <= 0)):
        raise ValueError("col_idx: must be strictly increasing within each query block's row")


def layout_block_size(tokens, row_ptr):
    """The layout's block size: tokens / query blocks, which must be exact (our layouts are
    square blocks over N = a multiple of the block)."""
    nb = len(row_ptr) - 1
    if nb <= 0 or tokens % nb != 0:
        raise ValueError(f"row_ptr: {nb} query blocks do not divide N = {tokens}")
    return tokens // nb


def csr_to_kv_block_lists(row_ptr, col_idx, num_kv_blocks):
    """Per query block, the count and the (left-packed) key block indices.

    Returns (counts int32 [nb], indices int32 [nb, width]), width = the longest row (at least 1),
    padding 0 after each row's count. FA4's full_block_cnt / full_block_idx (and FlexAttention's
    full_kv_num_blocks / full_kv_indices, which pad to the number of key blocks) in that order.
    """
    row_ptr = np.asarray(row_ptr, dtype=np.int64)
    col_idx = np.asarray(col_idx, dtype=np.int32)
    check_csr(row_ptr, col_idx, num_kv_blocks)
    nb = len(row_ptr) - 1
    counts = np.diff(row_ptr).astype(np.int32)
    width = max(1, int(counts.max()))
    idx = np.zeros((nb, width), dtype=np.int32)
    rows = np.repeat(np.arange(nb), counts)
    pos = np.arange(col_idx.size) - np.repeat(row_ptr[:-1], counts)
    idx[rows, pos] = col_idx
    return counts, idx


def fa4_sm90_tiles(head_dim, block_q, block_kv):
    """(tile_m, tile_n) FA4 4.0.0b36 picks on sm90 for a block-sparse forward (see module doc)."""
    if head_dim <= 64:
        tile_m = 192 if block_q % 192 == 0 else 128
    elif head_dim <= 128:
        tile_m = 128
    else:
        raise ValueError(f"head_dim: this check covers head dims up to 128, got {head_dim}")
    tile_n = 128
    if block_q % tile_m != 0 and block_q % 64 == 0:
        tile_m = 64
    if block_kv < tile_n and block_kv % 16 == 0:
        tile_n = block_kv
    return tile_m, tile_n


def fa4_block_sparse_refusal(arch_major, head_dim, tokens, block_q, block_kv, q_blocks, kv_blocks):
    """Why FA4 4.0.0b36 cannot take this layout, or None where it can (or where this check does
    not know the architecture: FA4 itself then decides, and its error is recorded)."""
    if q_blocks != math.ceil(tokens / block_q):
        return (f"{q_blocks} query blocks != ceil(N / block) = {math.ceil(tokens / block_q)} "
                f"(N = {tokens}, block {block_q})")
    if kv_blocks != math.ceil(tokens / block_kv):
        return f"{kv_blocks} key blocks != ceil(N / block) = {math.ceil(tokens / block_kv)}"
    if arch_major != 9:
        return None
    if head_dim > 128:
        return None
    tile_m, tile_n = fa4_sm90_tiles(head_dim, block_q, block_kv)
    if block_kv != tile_n:
        return (f"key block {block_kv} != FA4's sm90 key tile {tile_n} (sm90 takes exactly one "
                f"key tile per block: a block of 16..128, a multiple of 16)")
    if block_q % tile_m != 0:
        return f"query block {block_q} is not a multiple of FA4's sm90 query tile {tile_m}"
    return None


def output_check(max_abs_diff, max_abs_ref, nonfinite, tolerance=2e-2):
    """{"rel", "max_abs_diff", "max_abs_ref", "nonfinite", "ok"}: rel = max |diff| / max |ref|;
    ok when rel <= tolerance and no element of the output is non-finite."""
    rel = max_abs_diff / max_abs_ref if max_abs_ref > 0 else (0.0 if max_abs_diff == 0 else
                                                               float("inf"))
    ok = bool(nonfinite == 0 and math.isfinite(rel) and rel <= tolerance)
    return {"rel": float(rel), "max_abs_diff": float(max_abs_diff),
            "max_abs_ref": float(max_abs_ref), "nonfinite": int(nonfinite), "ok": ok,
            "tolerance": tolerance}
