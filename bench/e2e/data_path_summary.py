#!/usr/bin/env python3
"""Summary of bench/e2e/data_path_run.sh: tables (markdown on stdout) and data_path.json.

Reads OUT_DIR/{echo,copy}.json, run_<side>_<transport>_<request>_<rep>.log (attnctl run) and
bench_<side>_<transport>_c<C>.json (attnctl bench --json); computes the ratios the data-path
acceptance list asks for, against the ceilings measured in the same run.
"""
import glob
import json
import os
import re
import statistics
import sys

MIB = 1 << 20
out = sys.argv[1]
res = {"ceilings": {}, "requests": {}, "bench": {}, "acceptance": {}}


def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None


echo = load(f"{out}/echo.json")
if echo:
    for c in echo.get("configs", []):
        if not c.get("error"):
            res["ceilings"][f"echo_pairs{c['pairs']}_gbps_each_way"] = c["gb_per_s_each_way"]
copy = load(f"{out}/copy.json")
if copy:
    for r in copy.get("rows", []):
        if r.get("bytes") == 1 << 30 or r.get("host_memory", "").startswith("chunked"):
            res["ceilings"][f"copy_{r['host_memory']}_{r['direction']}_gbps"] = r["best_gb_per_s"]

RUN = re.compile(r"total ([0-9.]+) s \(upload ([0-9.]+) s\); server: receive ([0-9.]+) s, "
                 r"queue ([0-9.]+) s, compute ([0-9.]+) s")
SPLIT = re.compile(r"copies ([0-9.]+) s \(([0-9.]+) GB\), kernel ([0-9.]+) s")
REQ_BYTES = {  # bf16 inputs and outputs (O and LSE)
    "dilated_1m": (3 * 1048576 * 8 * 128 * 2, 1048576 * 8 * 128 * 2 + 8 * 1048576 * 4),
    "sparse_random1_64k": (3 * 65536 * 16 * 128 * 2, 65536 * 16 * 128 * 2 + 16 * 65536 * 4),
    "gqa_causal_4k": (4096 * (32 + 16) * 128 * 2, 4096 * 32 * 128 * 2 + 32 * 4096 * 4),
}
for f in sorted(glob.glob(f"{out}/run_*.log")):
    side, tr, rest = os.path.basename(f)[4:-4].split("_", 2)
    name, rep = rest.rsplit("_", 1)
    text = open(f).read()
    m = RUN.search(text)
    if not m:
        continue
    row = dict(zip(("total", "upload", "receive", "queue", "compute"), map(float, m.groups())))
    s = SPLIT.search(text)
    if s:
        row.update(copy=float(s.group(1)), copy_gb=float(s.group(2)), kernel=float(s.group(3)))
    res["requests"].setdefault(f"{side}/{tr}/{name}", []).append(row)

print("\n| request | side | transport | total s | upload s | compute s | copies s | kernel s |"
      " kernel share |")
print("|---|---|---|---|---|---|---|---|---|")
best = {}
for key, rows in sorted(res["requests"].items()):
    side, tr, name = key.split("/")
    # The first request of a server pays its one-time set-up (page-locking the pool): report the
    # median of the later ones when there are any.
    later = rows[1:] if len(rows) > 1 else rows
    med = {k: statistics.median(r[k] for r in later) for k in later[0]}
    best[key] = med
    share = med.get("kernel", 0) / med["total"] if med["total"] > 0 else 0
    print(f"| {name} | {side} | {tr} | {med['total']:.4f} | {med['upload']:.4f} | "
          f"{med['compute']:.4f} | {med.get('copy', float('nan')):.4f} | "
          f"{med.get('kernel', float('nan')):.5f} | {100 * share:.1f}% |")
res["requests_median_after_first"] = best

print("\n| bench (GQA causal 4096, 48 MiB in, 32 MiB out) | side | transport | concurrency |"
      " req/s | p50 s |")
print("|---|---|---|---|---|---|")
for f in sorted(glob.glob(f"{out}/bench_*_c*.json")):
    side, tr, c = os.path.basename(f)[6:-5].split("_")
    d = load(f)
    if not d:
        continue
    res["bench"][f"{side}/{tr}/{c}"] = d
    print(f"| | {side} | {tr} | {c[1:]} | {d.get('requests_per_s', 0):.1f} | "
          f"{d.get('latency_s', {}).get('p50', 0):.4f} |")

# Acceptance ratios (against the same run's ceilings).
acc = res["acceptance"]
ceil = res["ceilings"]
for name, (bin_, bout) in REQ_BYTES.items():
    r = best.get(f"new/grpc/{name}")
    if r and "kernel" in r:
        bound = (bin_ + bout) / 40e9 + 1e-3
        acc[f"{name}_compute_minus_kernel_s"] = r["compute"] - r["kernel"]
        acc[f"{name}_copy_bound_s"] = bound
        acc[f"{name}_copy_within_bound"] = r["compute"] - r["kernel"] <= bound
    if r and r["upload"] > 0:
        acc[f"{name}_upload_gbps"] = bin_ / r["upload"] / 1e9
        if ceil.get("echo_pairs1_gbps_each_way"):
            acc[f"{name}_upload_over_echo1"] = acc[f"{name}_upload_gbps"] / ceil[
                "echo_pairs1_gbps_each_way"]
gqa_in, gqa_out = REQ_BYTES["gqa_causal_4k"]
if ceil.get("echo_pairs8_gbps_each_way"):
    wire_bound = ceil["echo_pairs8_gbps_each_way"] * 1e9 / gqa_in
    acc["gqa_wire_bound_rps"] = wire_bound
    b = res["bench"].get("new/grpc/c16")
    if b:
        acc["gqa_grpc_c16_over_wire_bound"] = b.get("requests_per_s", 0) / wire_bound
if ceil.get("copy_pinned_h2d_gbps"):
    copy_bound = ceil["copy_pinned_h2d_gbps"] * 1e9 / gqa_in
    acc["gqa_copy_bound_rps"] = copy_bound
    b = res["bench"].get("new/shm/c16")
    if b:
        acc["gqa_shm_c16_over_copy_bound"] = b.get("requests_per_s", 0) / copy_bound
r = best.get("new/shm/dilated_1m")
if r:
    acc["dilated_1m_shm_total_s"] = r["total"]
    acc["dilated_1m_shm_within_0.5s"] = r["total"] <= 0.5
r = best.get("new/ipc/sparse_random1_64k")
if r and "kernel" in r:
    acc["sparse_ipc_total_minus_kernel_s"] = r["total"] - r["kernel"]
    acc["sparse_ipc_within_kernel_plus_5ms"] = r["total"] - r["kernel"] <= 5e-3
b = res["bench"].get("new/ipc/c16")
if b:
    acc["gqa_ipc_c16_rps"] = b.get("requests_per_s", 0)
print("\nacceptance figures:")
for k, v in acc.items():
    print(f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}")
json.dump(res, open(f"{out}/data_path.json", "w"), indent=1)
