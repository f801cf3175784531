#!/usr/bin/env python3
"""Our kernel and FlashAttention-4 timed in alternation, rep by rep, in one run.

  python3 bench/fa4_interleaved.py --bench BUNDLE/bin/attnbench_cuda --fa4-site DIR --out OUT \
      [--reps 7] [--cases dense_n16384,...] [--flags "--sm90_key_tile=176"]

bench/kernel_compare_run.sh times our kernels first and FA4 a minute later: on an H200 at its
700 W cap the clock differs between the two phases, and a case's time moves by up to 10% between
reps of either side, so one pair of medians can be off by more than the gap being measured. Here
each rep runs attnbench_cuda on every case (a subprocess: own rows, the same warm-up and 20-call
event loop as always) and then FA4 on every case in this process (compare_torch.py's inputs,
CSR conversion and timing; FA4 compiles each shape once, at the first rep), swapping which side
goes first every rep, so both sides see the same thermal history. Reported per case: the median
over reps of each side's median, their ratio, and the per-rep ratios (whose spread says how far
the ratio can be trusted). Output checks are compare_torch.py's business (kernel_compare_run.sh);
this only times. The block-sparse cases read the CSR that the first rep's attnbench_cuda dumps
(--csr_dir), so FA4 runs the identical layout.

Writes OUT/own_<rep>.json (attnbench_cuda --json), OUT/interleaved.json and OUT/interleaved.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402  (inputs, FA4 loading, CSR conversion and timing)

import numpy as np  # noqa: E402
import torch  # noqa: E402

DEFAULT_CASES = ("dense_n16384,dense_n16384_causal,dense_d64_n16384,dense_d64_n16384_causal,"
                 "sparse_random_s90,sparse_local_window_s90,sparse_random_s99,"
                 "sparse_local_window_s99")


def run_own(a, rep, csr_dir):
    path = os.path.join(a.out, f"own_{rep}.json")
    cmd = [a.bench, f"--cases={a.cases}", "--warmup=3", "--iters=20", f"--json={path}"]
    cmd += [f"--csr_dir={csr_dir}"] if rep == 0 else []
    cmd += a.flags.split()
    # Engine "own": the attnserve rows are our kernel's again instead of a cuDNN run per case.
    env = dict(os.environ, ATTNSERVE_ATTENTION_ENGINE="own")
    with open(os.path.join(a.out, f"own_{rep}.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=300,
                            env=env).returncode
    rows = {}
    if os.path.exists(path):
        for r in json.load(open(path))["results"]:
            if r["variant"] == "own" and not r.get("error"):
                rows[r["name"]] = r
    ct.log(f"[fa4_interleaved] rep {rep}: attnbench_cuda rc={rc}, {len(rows)} own rows")
    return rows


class Fa4Case:
    """One case's FA4 call on inputs made as compare_torch.py makes them (kept across reps)."""

    def __init__(self, case, csr_dir):
        self.name = case["name"]
        self.flops = case["flops"]
        b, n, hq, hkv, d = (case[k] for k in ("batch", "tokens", "q_heads", "kv_heads",
                                               "head_dim"))
        self.q, self.k, self.v = ct.inputs(b, n, hq, hkv, d)
        self.case, self.csr = case, None
        if case["group"] == "sparse":
            rp = os.path.join(csr_dir, self.name + "_row_ptr.npy")
            ci = os.path.join(csr_dir, self.name + "_col_idx.npy")
            self.csr = (np.load(rp), np.load(ci))

    def time_ms(self):
        """FA4's median ms on this case (compare_torch's event loop), or an error string."""
        res = {}
        if self.csr is None:
            ct.run_fa4(res, lambda: ct.fa4_call(self.q, self.k, self.v,
                                                causal=self.case["causal"]),
                       self.flops, True, None)
        else:
            pairs = self.flops / (4 * self.case["batch"] * self.case["q_heads"] *
                                  self.case["head_dim"])
            ct.run_fa4_sparse(self.case, res, self.q, self.k, self.v, self.csr[0], self.csr[1],
                              pairs, None)
        return res.get("fa4_ms") or res.get("fa4_error", "no time")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="attnbench_cuda")
    ap.add_argument("--fa4-site", required=True, help="where FA4's wheels are installed")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--flags", default="", help="more attnbench_cuda flags")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    csr_dir = os.path.join(a.out, "csr")
    os.makedirs(csr_dir, exist_ok=True)
    ct.load_fa4(a.fa4_site)
    if ct.FA4["func"] is None:
        sys.exit(f"fa4_interleaved: FA4 {ct.FA4['status']}")
    t0 = time.time()
    own = {}  # case -> [ms per rep]
    fa4 = {}
    cases = {}
    fa4_cases = {}
    errors = {}
    for rep in range(a.reps):
        sides = ("own", "fa4") if rep % 2 == 0 else ("fa4", "own")
        if rep == 0:
            sides = ("own", "fa4")  # the first rep's attnbench_cuda names the cases, dumps CSRs
        for side in sides:
            if side == "own":
                rows = run_own(a, rep, csr_dir)
                for name, r in rows.items():
                    cases.setdefault(name, r)
                    own.setdefault(name, []).append(r["ms_median"])
            else:
                for name, case in cases.items():
                    if name not in fa4_cases:
                        fa4_cases[name] = Fa4Case(case, csr_dir)
                    ms = fa4_cases[name].time_ms()
                    if isinstance(ms, float):
                        fa4.setdefault(name, []).append(ms)
                    else:
                        errors[name] = ms
                torch.cuda.synchronize()
                ct.log(f"[fa4_interleaved] rep {rep}: FA4 done at {time.time() - t0:.0f} s")
    med = lambda xs: statistics.median(xs) if xs else None
    dense_rate = None
    results = []
    for name, case in cases.items():
        o, f = med(own.get(name, [])), med(fa4.get(name, []))
        pairs = list(zip(own.get(name, []), fa4.get(name, [])))
        r = {"name": name, "group": case["group"], "head_dim": case["head_dim"],
             "causal": case["causal"], "sparsity": case.get("sparsity"), "flops": case["flops"],
             "own_ms": o, "fa4_ms": f, "own_ms_reps": own.get(name, []),
             "fa4_ms_reps": fa4.get(name, []), "fa4_error": errors.get(name),
             "own_over_fa4_time": o / f if o and f else None,
             "rep_ratios": [x / y for x, y in pairs]}
        r["own_tflops"] = case["flops"] / (o * 1e-3) / 1e12 if o else None
        r["fa4_tflops"] = case["flops"] / (f * 1e-3) / 1e12 if f else None
        if name == "dense_n16384":
            dense_rate = r["own_tflops"]
        results.append(r)
    dev = json.load(open(os.path.join(a.out, "own_0.json"))).get("device", "?")
    doc = {"device": dev, "fa4_version": ct.FA4["version"], "reps": a.reps, "cases": a.cases,
           "flags": a.flags, "results": results}
    json.dump(doc, open(os.path.join(a.out, "interleaved.json"), "w"), indent=1)
    f3 = lambda x: "-" if x is None else f"{x:.3f}"
    f1 = lambda x: "-" if x is None else f"{x:.1f}"
    lines = [f"# Own kernel and FA4 {ct.FA4['version']} in alternation ({dev}, {a.reps} reps)", "",
             "| case | own ms | FA4 ms | own/FA4 time | own TFLOP/s | FA4 TFLOP/s | "
             "own/FA4 rate | per-rep own/FA4 (min-max) | effective/dense |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rr = r["rep_ratios"]
        spread = f"{min(rr):.3f}-{max(rr):.3f}" if rr else "-"
        rate = r["fa4_ms"] / r["own_ms"] if r["own_ms"] and r["fa4_ms"] else None
        eff = (r["own_tflops"] / dense_rate if r["group"] == "sparse" and dense_rate and
               r["own_tflops"] else None)
        lines.append(f"| {r['name']} | {f3(r['own_ms'])} | {f3(r['fa4_ms'])} | "
                     f"{f3(r['own_over_fa4_time'])} | {f1(r['own_tflops'])} | "
                     f"{f1(r['fa4_tflops'])} | {f3(rate)} | {spread} | {f3(eff)} |")
    lines += ["", "Medians over reps of each side's per-rep median (20 calls between CUDA events "
              "after 3 warm-up calls, both sides); own/FA4 rate = FA4 ms / own ms; "
              "effective/dense = the sparse case's own TFLOP/s (admitted block pairs) over the "
              "own dense_n16384 rate."]
    lines += [f"- {n}: FA4 {e}" for n, e in errors.items()]
    md = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "interleaved.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
