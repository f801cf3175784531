#!/usr/bin/env python3
"""The kernel comparison's summary: our kernels against FlashAttention-4 (compare_torch.py's JSON).

  bench/kernel_compare_summary.py COMPARE_JSON [--md OUT.md]

Three tables (markdown, to stdout and --md):
  dense   per case (D, causal): own kernel TFLOP/s, FA4 TFLOP/s, own/FA4 (> 1: we are faster), the
          service row (attnserve: cuDNN where it can) and attnserve/FA4, FA4's output check
  sparse  per block-sparse case: own ms, FA4 ms, own/FA4 time (< 1: we are faster), FlexAttention
          ms and own/Flex, our effective TFLOP/s (admitted pairs only) over our own dense rate at
          the same head dim (dense non-causal, N = 16384: how much of the dense rate survives the
          skipping), FA4's output check
  checks  every FA4 output check above 2e-2 or with non-finite values (FAIL), every own check
          that failed, every FA4 error (a layout FA4 cannot take, with its reason)
Standard library only (json), so it runs where compare_torch.py ran or anywhere else.
"""
import argparse
import json
import sys

DENSE_GROUPS = ("dense", "dense_d64")
SPARSE_GROUPS = ("sparse",)


def ratio(a, b):
    return a / b if a is not None and b else None


def cell(x, nd=1, suffix=""):
    if x is None:
        return "-"
    return f"{x:.{nd}f}{suffix}"


def check_cell(r):
    chk = r.get("fa4_check")
    if chk is not None:
        return (f"{'PASS' if chk['ok'] else 'FAIL'} {chk['rel']:.1e}"
                + (f", {chk['nonfinite']} non-finite" if chk["nonfinite"] else ""))
    if (r.get("fa4_error") or "").startswith("not installed"):
        return "not installed"
    if r.get("fa4_error"):
        return "n/a (see Checks)"
    return "-"


def head_dim_of(r):
    if r.get("head_dim"):
        return r["head_dim"]
    return 64 if "_d64" in r["name"] else 128  # rows written before compare.json had head_dim


def causal_of(r):
    if r.get("causal") is not None:
        return bool(r["causal"])
    return r["name"].endswith("_causal")


def dense_rate(rows, head_dim):
    """(own TFLOP/s, case name) of the non-causal dense case at this head dim: N = 16384 when
    there, else the largest N."""
    cands = [r for r in rows if r.get("group") in DENSE_GROUPS and head_dim_of(r) == head_dim
             and not causal_of(r) and r.get("ours_tflops")]
    if not cands:
        return None, None
    best = max(cands, key=lambda r: (tokens_of(r) == 16384, tokens_of(r)))
    return best["ours_tflops"], best["name"]


def tokens_of(r):
    if r.get("tokens"):
        return r["tokens"]
    name = r["name"]
    return int(name.split("_n")[1].split("_")[0]) if "_n" in name else 0


def summarize(doc):
    rows = doc.get("results", [])
    fa4 = doc.get("fa4", {})
    fa4_label = (f"FlashAttention-4 {fa4.get('version')}" if fa4.get("status") == "ok"
                 else f"FlashAttention-4 {fa4.get('status', 'not recorded')}")
    timing = doc.get("timing", "do_bench")  # compare.json files before --timing: do_bench
    out = [f"device: {doc.get('device')}, torch {doc.get('torch')}, {fa4_label}, "
           f"torch-side timing {timing}", ""]

    dense = [r for r in rows if r.get("group") in DENSE_GROUPS]
    out += ["### Dense (bf16, Hq = Hkv = 16): own kernel vs FlashAttention-4", "",
            "| case | D | causal | own TFLOP/s | FA4 TFLOP/s | own/FA4 | attnserve engine | "
            "attnserve TFLOP/s | attnserve/FA4 | FA4 check |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in dense:
        out.append(
            f"| {r['name']} | {head_dim_of(r)} | {'yes' if causal_of(r) else 'no'} | "
            f"{cell(r.get('ours_tflops'))} | {cell(r.get('fa4_tflops'))} | "
            f"{cell(ratio(r.get('ours_tflops'), r.get('fa4_tflops')), 2, 'x')} | "
            f"{r.get('attnserve_engine') or '-'} | {cell(r.get('attnserve_tflops'))} | "
            f"{cell(ratio(r.get('attnserve_tflops'), r.get('fa4_tflops')), 2, 'x')} | "
            f"{check_cell(r)} |")
    if not dense:
        out.append("| (no dense rows) | | | | | | | | | |")

    sparse = [r for r in rows if r.get("group") in SPARSE_GROUPS]
    out += ["", "### Block-sparse (same CSR for all): own ms vs FlashAttention-4 ms "
            "(own/FA4 < 1: we are faster)", "",
            "| case | skipped | own ms | FA4 ms | own/FA4 time | Flex ms | own/Flex time | "
            "own effective TFLOP/s | own dense TFLOP/s (same D) | effective/dense | FA4 check |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sparse:
        rate, _ = dense_rate(rows, head_dim_of(r))
        skipped = r.get("sparsity")
        out.append(
            f"| {r['name']} | {cell(None if skipped is None else 100 * skipped, 2, '%')} | "
            f"{cell(r.get('ours_ms'), 3)} | {cell(r.get('fa4_ms'), 3)} | "
            f"{cell(ratio(r.get('ours_ms'), r.get('fa4_ms')), 2, 'x')} | "
            f"{cell(r.get('flex_ms'), 3)} | "
            f"{cell(ratio(r.get('ours_ms'), r.get('flex_ms')), 2, 'x')} | "
            f"{cell(r.get('ours_tflops'))} | {cell(rate)} | "
            f"{cell(ratio(r.get('ours_tflops'), rate), 2)} | {check_cell(r)} |")
    if not sparse:
        out.append("| (no block-sparse rows) | | | | | | | | | | |")
    refs = sorted({dense_rate(rows, head_dim_of(r))[1] or "none" for r in sparse})
    if sparse:
        out += ["", f"effective TFLOP/s count admitted block pairs only; the dense rate is the own "
                f"kernel's on {', '.join(refs)} (non-causal)."]

    problems = []
    if fa4.get("status") != "ok":
        problems.append(f"- FlashAttention-4 {fa4.get('status', 'not recorded')}: no FA4 figures")
    for r in dense + sparse:
        chk = r.get("fa4_check")
        if chk is not None and not chk["ok"]:
            problems.append(f"- FAIL: FA4 output on {r['name']} vs {r.get('fa4_check_ref')}: "
                            f"max |diff| / max |O| = {chk['rel']:.2e} (limit "
                            f"{chk.get('tolerance', 2e-2):g}), {chk['nonfinite']} non-finite")
        if r.get("fa4_error") and not r["fa4_error"].startswith("not installed"):
            problems.append(f"- FA4 not timed on {r['name']}: {r['fa4_error']}")
        if r.get("ours_ok") is False or r.get("ours_error"):
            problems.append(f"- own kernel on {r['name']}: check ok = {r.get('ours_ok')}"
                            + (f", error {r['ours_error']}" if r.get("ours_error") else ""))
    out += ["", "### Checks", ""] + (problems or ["- every FA4 output check passed (<= 2e-2), "
                                                  "every own check passed"])
    return "\n".join(out) + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("compare_json", help="compare_torch.py --json output")
    ap.add_argument("--md", default="", help="also write the tables here")
    a = ap.parse_args(argv)
    with open(a.compare_json) as f:
        md = summarize(json.load(f))
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
