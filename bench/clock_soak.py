#!/usr/bin/env python3
"""SM clock and board power while our kernel, then FlashAttention-4, run back to back for a while.

  python3 bench/clock_soak.py --bench BUNDLE/bin/attnbench_cuda --fa4-site DIR --out OUT \
      [--case dense_n16384] [--seconds 6] [--flags "--sm90_key_tile=128"]

At the H200's 700 W cap the clock a kernel settles at depends on the power it draws per cycle,
so two kernels that need the same cycles can differ in time. This runs the case on each side
for about --seconds of back-to-back calls (attnbench_cuda with enough --iters; FA4 in this
process on inputs made as compare_torch.py makes them) while nvidia-smi samples the SM clock and
power draw every 50 ms (read-only queries), and reports each side's mean over its steady part
(the first second of each side left out) with its time per call. Dense cases only.
Writes OUT/soak.json, OUT/soak.md and OUT/smi.csv (the samples).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402
from cuda_events import event_times  # noqa: E402

import torch  # noqa: E402


def shape_of(case):
    d = 64 if "_d64_" in case else 128
    return dict(batch=1, tokens=16384, q_heads=16, kv_heads=16, head_dim=d,
                causal=case.endswith("_causal"))


def samples(path, t0, t1):
    """(clock MHz, power W) samples of smi.csv taken in [t0, t1] (epoch seconds)."""
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            ts += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            if t0 <= ts <= t1:
                out.append((float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--fa4-site", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default="dense_n16384")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--flags", default="", help="more attnbench_cuda flags")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ct.load_fa4(a.fa4_site)
    if ct.FA4["func"] is None:
        sys.exit(f"clock_soak: FA4 {ct.FA4['status']}")
    s = shape_of(a.case)
    q, k, v = ct.inputs(s["batch"], s["tokens"], s["q_heads"], s["kv_heads"], s["head_dim"])
    fa4 = lambda: ct.fa4_call(q, k, v, causal=s["causal"])
    fa4()  # compiles
    torch.cuda.synchronize()
    ms_fa4 = ct.bench_ms(fa4)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    smi_path = os.path.join(a.out, "smi.csv")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50", "-i", gpu],
                           stdout=open(smi_path, "w"), stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    phases = {}
    # Ours: enough calls for the soak, from the time per call of the FA4 side (same FLOPs).
    iters = max(50, int(a.seconds * 1e3 / ms_fa4))
    t0 = time.time()
    own_json = os.path.join(a.out, "own.json")
    # Engine "own": no cuDNN run of the attnserve row inside our side's soak.
    rc = subprocess.run([a.bench, f"--cases={a.case}", "--warmup=3", f"--iters={iters}",
                         f"--json={own_json}"] + a.flags.split(), stdout=open(os.path.join(a.out, "own.log"), "w"),
                        stderr=subprocess.STDOUT, timeout=300,
                        env=dict(os.environ, ATTNSERVE_ATTENTION_ENGINE="own")).returncode
    phases["own"] = (t0, time.time())
    time.sleep(2.0)  # both sides start from a similar state
    t0 = time.time()
    n = max(50, int(a.seconds * 1e3 / ms_fa4))
    fa4_ms = event_times(fa4, n)
    phases["fa4"] = (t0, time.time())
    time.sleep(0.5)
    smi.terminate()
    smi.wait()
    own_ms = None
    if os.path.exists(own_json):
        rows = [r for r in json.load(open(own_json))["results"] if r["variant"] == "own"]
        own_ms = rows[0]["ms_median"] if rows and not rows[0].get("error") else None
    doc = {"case": a.case, "flags": a.flags, "attnbench_rc": rc, "own_iters": iters, "fa4_calls": n,
           "own_ms_median": own_ms, "fa4_ms_median": statistics.median(fa4_ms[n // 4:]),
           "fa4_version": ct.FA4["version"], "sides": {}}
    lines = [f"# {a.case}: SM clock and power, back-to-back calls (FA4 {ct.FA4['version']})", "",
             "| side | calls | ms per call (median) | SM MHz (mean, steady) | W (mean, steady) "
             "| samples |", "|---|---|---|---|---|---|"]
    for side, (t0, t1) in phases.items():
        # The steady part: from one second in (the process start and the clock's fall).
        got = samples(smi_path, t0 + 1.0, t1)
        mhz = statistics.mean(c for c, _ in got) if got else None
        watts = statistics.mean(p for _, p in got) if got else None
        ms = own_ms if side == "own" else doc["fa4_ms_median"]
        doc["sides"][side] = {"mhz": mhz, "watts": watts, "samples": len(got), "ms": ms,
                              "t0": t0, "t1": t1}
        calls = iters if side == "own" else n
        f = lambda x, p: "-" if x is None else f"{x:.{p}f}"
        lines.append(f"| {side} | {calls} | {f(ms, 3)} | {f(mhz, 0)} | {f(watts, 0)} | "
                     f"{len(got)} |")
    lines += ["", "Ours: attnbench_cuda's median over its calls; FA4: the median of its last "
              "three quarters of calls. Clock and power: nvidia-smi every 50 ms, averaged from "
              "one second after each side started to its end."]
    md = "\n".join(lines) + "\n"
    json.dump(doc, open(os.path.join(a.out, "soak.json"), "w"), indent=1)
    open(os.path.join(a.out, "soak.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
