#!/usr/bin/env python3
"""Checks the GPU-free parts of the FlashAttention-4 kernel comparison, without torch or a GPU:

  bench/fa4_blocks.py             the CSR -> FA4 block lists conversion (against a dense block
                                  table built independently), the CSR validation, the sm90 tile
                                  and block-size rules, the output check's verdicts
  bench/kernel_compare_summary.py the summary tables and the FAIL / error lines, on a made-up
                                  compare_torch.py JSON

Run by python3 without numpy, it re-runs itself with the repository's .venv/bin/python when there
is one; exits 77 (ctest's SKIP_RETURN_CODE) when numpy cannot be imported.
"""
import os
import sys

try:
    import numpy as np
except ImportError as e:
    venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv",
                        "bin", "python")
    if os.path.exists(venv) and os.path.realpath(sys.prefix) != os.path.realpath(
            os.path.dirname(os.path.dirname(venv))):
        os.execv(venv, [venv] + sys.argv)
    print(f"SKIP: {e} (pip install numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa4_blocks  # noqa: E402
import kernel_compare_summary  # noqa: E402

FAILURES = []


def expect(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def expect_raises(fn, field, what):
    try:
        fn()
    except ValueError as e:
        expect(field in str(e), f"{what}: error names {field!r} (got {e})")
        return
    expect(False, f"{what}: no ValueError")


def csr_of(table):
    """CSR (row_ptr int64, col_idx int32) of a boolean [nb, nb] block table."""
    rows, cols = np.nonzero(table)
    row_ptr = np.zeros(table.shape[0] + 1, dtype=np.int64)
    np.add.at(row_ptr, rows + 1, 1)
    return np.cumsum(row_ptr), cols.astype(np.int32)


def table_of(counts, idx, nb):
    """The block table the FA4 lists describe: entries past a row's count are ignored."""
    t = np.zeros((len(counts), nb), dtype=bool)
    for i, c in enumerate(counts):
        t[i, idx[i, :c]] = True
    return t


def test_conversion():
    rng = np.random.default_rng(7)
    nb = 512  # N = 65536 at block 128, as the sparse cases
    # Random (diagonal kept, ~10% of the rest) and a local window of width 2, as cases.cc builds.
    random_t = rng.random((nb, nb)) < 0.1
    np.fill_diagonal(random_t, True)
    i = np.arange(nb)
    window_t = np.abs(i[:, None] - i[None, :]) <= 2
    for name, t in (("random", random_t), ("local_window", window_t)):
        row_ptr, col_idx = csr_of(t)
        counts, idx = fa4_blocks.csr_to_kv_block_lists(row_ptr, col_idx, nb)
        expect(counts.dtype == np.int32 and idx.dtype == np.int32, f"{name}: int32 lists")
        expect(idx.shape == (nb, int(t.sum(1).max())), f"{name}: width = longest row "
               f"({idx.shape} vs {t.sum(1).max()})")
        expect(np.array_equal(counts, t.sum(1)), f"{name}: counts = kept blocks per row")
        expect(np.array_equal(table_of(counts, idx, nb), t), f"{name}: lists = the table")
        expect(int(counts.sum()) == len(col_idx), f"{name}: every pair once")
        # Left-packed, ascending within a row (the order of the CSR).
        for r in (0, nb // 2, nb - 1):
            row = idx[r, :counts[r]]
            expect(np.all(np.diff(row) > 0), f"{name}: row {r} ascending")
    # An empty row: count 0, still a valid table.
    t = np.eye(4, dtype=bool)
    t[2, 2] = False
    counts, idx = fa4_blocks.csr_to_kv_block_lists(*csr_of(t), 4)
    expect(list(counts) == [1, 1, 0, 1] and idx.shape == (4, 1), "empty row: count 0")


def test_csr_validation():
    ok_rp, ok_ci = np.array([0, 2, 3]), np.array([0, 1, 1], dtype=np.int32)
    fa4_blocks.check_csr(ok_rp, ok_ci, 2)  # must not raise
    expect_raises(lambda: fa4_blocks.check_csr(np.array([1, 2, 3]), ok_ci, 2), "row_ptr[0]",
                  "row_ptr[0] != 0")
    expect_raises(lambda: fa4_blocks.check_csr(np.array([0, 3, 2]), ok_ci[:2], 2), "row_ptr",
                  "decreasing row_ptr")
    expect_raises(lambda: fa4_blocks.check_csr(np.array([0, 2, 4]), ok_ci, 2), "row_ptr[-1]",
                  "row_ptr[-1] != len(col_idx)")
    expect_raises(lambda: fa4_blocks.check_csr(ok_rp, np.array([0, 2, 1]), 2), "col_idx",
                  "column out of range")
    expect_raises(lambda: fa4_blocks.check_csr(ok_rp, np.array([1, 1, 1]), 2), "col_idx",
                  "duplicate pair in a row")
    expect_raises(lambda: fa4_blocks.check_csr(ok_rp, np.array([1, 0, 1]), 2), "col_idx",
                  "descending row")
    expect(fa4_blocks.layout_block_size(65536, np.zeros(513)) == 128, "block = N / rows")
    expect_raises(lambda: fa4_blocks.layout_block_size(1000, np.zeros(8)), "row_ptr",
                  "rows not dividing N")


def test_sm90_rules():
    tiles = fa4_blocks.fa4_sm90_tiles
    expect(tiles(128, 128, 128) == (128, 128), "D=128, block 128: tile 128x128")
    expect(tiles(64, 128, 128) == (128, 128), "D=64, block 128: tile 128x128 (128 % 192 != 0)")
    expect(tiles(64, 192, 128) == (192, 128), "D=64, query block 192: tile_m 192")
    expect(tiles(128, 64, 64) == (64, 64), "D=128, block 64: tile 64x64")
    refuse = fa4_blocks.fa4_block_sparse_refusal
    expect(refuse(9, 128, 65536, 128, 128, 512, 512) is None, "sm90 takes 128 x 128 at D=128")
    expect(refuse(9, 64, 65536, 128, 128, 512, 512) is None, "sm90 takes 128 x 128 at D=64")
    why = refuse(9, 128, 65536, 256, 256, 256, 256)
    expect(why is not None and "key block 256" in why, f"sm90 refuses key block 256 ({why})")
    why = refuse(9, 128, 65536, 128, 100, 512, 656)
    expect(why is not None and "key block 100" in why, f"sm90 refuses key block 100 ({why})")
    why = refuse(9, 128, 65536, 96, 128, 683, 512)
    expect(why is not None and "query block 96" in why, f"sm90 refuses query block 96 ({why})")
    expect(refuse(10, 128, 65536, 256, 256, 256, 256) is None, "not sm90: FA4 decides")
    why = refuse(9, 128, 65536, 128, 128, 500, 512)
    expect(why is not None and "500 query blocks" in why, f"row count must match N ({why})")


def test_output_check():
    chk = fa4_blocks.output_check
    expect(chk(0.01, 1.0, 0)["ok"], "1e-2 passes")
    expect(chk(0.02, 1.0, 0)["ok"], "2e-2 passes (the limit)")
    expect(not chk(0.03, 1.0, 0)["ok"], "3e-2 fails")
    expect(not chk(0.0, 1.0, 5)["ok"], "non-finite values fail")
    expect(not chk(float("nan"), 1.0, 0)["ok"], "a NaN difference fails")
    expect(abs(chk(0.5, 4.0, 0)["rel"] - 0.125) < 1e-12, "rel = max diff / max ref")


def test_summary():
    ok = fa4_blocks.output_check(1e-3, 1.0, 0)
    bad = fa4_blocks.output_check(5e-2, 1.0, 0)
    doc = {"device": "Test GPU", "torch": "x", "fa4": {"status": "ok", "version": "4.0.0b36"},
           "results": [
               {"name": "dense_n16384", "group": "dense", "head_dim": 128, "causal": False,
                "tokens": 16384, "ours_tflops": 500.0, "fa4_tflops": 625.0,
                "attnserve_engine": "cudnn", "attnserve_tflops": 600.0, "fa4_check": ok,
                "ours_ok": True},
               {"name": "dense_d64_n16384_causal", "group": "dense_d64", "head_dim": 64,
                "causal": True, "tokens": 16384, "ours_tflops": 300.0, "fa4_tflops": 400.0,
                "fa4_check": bad, "fa4_check_ref": "SDPA flash", "ours_ok": True},
               {"name": "sparse_random_s90", "group": "sparse", "head_dim": 128,
                "sparsity": 0.9, "ours_ms": 2.0, "fa4_ms": 4.0, "flex_ms": 8.0,
                "ours_tflops": 250.0, "fa4_check": ok, "ours_ok": True},
               {"name": "sparse_local_window_s99", "group": "sparse", "head_dim": 128,
                "sparsity": 0.99, "ours_ms": 0.5, "fa4_error": "FA4 cannot take this layout",
                "ours_ok": False},
               {"name": "dilated_n65536", "group": "dilated"},
           ]}
    md = kernel_compare_summary.summarize(doc)
    lines = md.splitlines()
    row = next(l for l in lines if l.startswith("| dense_n16384 |"))
    expect("| 0.80x |" in row and "| 0.96x |" in row, f"dense own/FA4 and attnserve/FA4: {row}")
    expect("PASS 1.0e-03" in row, f"dense check PASS: {row}")
    row = next(l for l in lines if l.startswith("| dense_d64_n16384_causal |"))
    expect("| 64 | yes |" in row and "FAIL 5.0e-02" in row, f"D=64 causal, FAIL: {row}")
    row = next(l for l in lines if l.startswith("| sparse_random_s90 |"))
    expect("| 0.50x |" in row and "| 0.25x |" in row, f"own/FA4 and own/Flex time: {row}")
    expect("| 250.0 | 500.0 | 0.50 |" in row, f"effective over the D=128 dense rate: {row}")
    row = next(l for l in lines if l.startswith("| sparse_local_window_s99 |"))
    expect("| 0.500 | - | - |" in row and "| n/a (see Checks) |" in row,
           f"refused layout: no time: {row}")
    expect(not any(l.startswith("| dilated") for l in lines), "dilated rows left out")
    expect(any(l.startswith("- FAIL: FA4 output on dense_d64_n16384_causal") for l in lines),
           "FAIL line for the check above 2e-2")
    expect(any("FA4 not timed on sparse_local_window_s99: FA4 cannot take" in l for l in lines),
           "the refusal's reason listed")
    expect(any("own kernel on sparse_local_window_s99" in l for l in lines), "own check failure")
    expect("FlashAttention-4 4.0.0b36" in lines[0], "FA4 version in the header")
    # Without FA4: its status instead of a version, and no FAIL.
    doc["fa4"] = {"status": "not installed (no --fa4-site)"}
    for r in doc["results"]:
        for k in ("fa4_tflops", "fa4_ms", "fa4_check"):
            r.pop(k, None)
        r["fa4_error"] = doc["fa4"]["status"]
    md = kernel_compare_summary.summarize(doc)
    expect("FlashAttention-4 not installed" in md.splitlines()[0], "not installed in the header")
    expect("- FAIL" not in md, "no FAIL without FA4")
    expect("| not installed |" in md and "- FlashAttention-4 not installed" in md,
           "not installed in the check cells and the checks")
    expect("FA4 not timed" not in md, "one not-installed line, not one per case")


def main():
    for t in (test_conversion, test_csr_validation, test_sm90_rules, test_output_check,
              test_summary):
        t()
    print(f"{'FAILED' if FAILURES else 'PASSED'}: {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
