#!/usr/bin/env python3
"""Reads the per-tile clock stamps of a stamped attnbench_cuda (bench/sm90_stamps.sh) and
prints where the two consumer warpgroups of the persistent kernel spend a tile.

Per tile and warpgroup (clock cycles of the SM, medians and means over the recorded tiles,
first and last tile of each item left out): the K wait, the ping-pong barrier (the wait for
this warpgroup's turn to issue), the S GEMM's issue with the V wait after it (both inside the
window), the P V GEMM's issue, the S GEMM's latency after the issue, the row-max phase up to the P V GEMM's completion, the exponentials
and packing, and the period from one tile's start to the next. Then, for every turn that waited
(the barrier took more than --wait cycles), what the other warpgroup was doing in its window:
how long its S issue and V wait and its P V issue took, and how late it reached its turn. And the period by
the tile's place in its item (first, second, inner, next to last, last): an item's first tile
also runs the previous item's epilogue, whose span (O and LSE stores issued) is given apart.

usage: sm90_stamps.py STAMPS.bin [--json OUT.json] [--wait 40]
"""
import argparse
import json
import sys

import numpy as np

POINTS = ["start", "k_landed", "turn", "v_landed", "issued", "scores", "pv", "end"]


def load(path):
    raw = open(path, "rb").read()
    head = np.frombuffer(raw, dtype=np.int32, count=5)
    if head[0] != 0x53544D50:
        sys.exit(f"{path}: not a stamps file")
    ctas, wgs, tiles, words = (int(x) for x in head[1:])
    table = np.frombuffer(raw, dtype=np.uint64, offset=20).astype(np.int64)
    return table.reshape(ctas, wgs, tiles, words)


def phases(t):
    """Per-tile phase lengths of one warpgroup's (tiles, words) table, recorded tiles only."""
    n = int(np.count_nonzero(t[:, 0]))
    t = t[:n]
    e = t[:, -1] & 0xFFFFFFFF
    count = t[:, -1] >> 32
    v = np.where(t[:, 3] != 0, t[:, 3], t[:, 2])
    out = {
        "k_wait": t[:, 1] - t[:, 0],
        "turn_wait": t[:, 2] - t[:, 1],
        "s_issue_v_wait": v - t[:, 2],
        "pv_issue": t[:, 4] - v,
        "s_latency": t[:, 5] - t[:, 4],
        "max_to_pv": t[:, 6] - t[:, 5],
        "exp_pack": t[:, 7] - t[:, 6],
        "period": np.append(t[1:, 0] - t[:-1, 0], 0),
    }
    inner = (e > 0) & (e + 1 < count)
    inner[-1] = False
    return t, inner, out


def stats(x):
    if len(x) == 0:
        return {"n": 0}
    return {"n": int(len(x)), "median": float(np.median(x)), "mean": float(np.mean(x)),
            "p10": float(np.percentile(x, 10)), "p90": float(np.percentile(x, 90))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stamps")
    ap.add_argument("--json")
    ap.add_argument("--wait", type=int, default=40)
    a = ap.parse_args()
    table = load(a.stamps)
    summary = {"phases": {}, "waited_turns": {}}
    per = {k: [] for k in ["k_wait", "turn_wait", "s_issue_v_wait", "pv_issue", "s_latency",
                           "max_to_pv",
                           "exp_pack", "period"]}
    other_v, other_issue, other_late, waited, turns = [], [], [], 0, 0
    for c in range(table.shape[0]):
        recs = [phases(table[c, w]) for w in range(table.shape[1])]
        if any(len(r[0]) < 4 for r in recs):
            continue
        for t, inner, ph in recs:
            for k in per:
                per[k].append(ph[k][inner])
        # Each turn against the other warpgroup's last window issued before it.
        for w in range(2):
            t, inner, ph = recs[w]
            o, _, oph = recs[1 - w]
            o_issued = o[:, 4]
            for i in np.nonzero(inner)[0]:
                turns += 1
                if ph["turn_wait"][i] <= a.wait:
                    continue
                j = np.searchsorted(o_issued, t[i, 2]) - 1
                if j < 0:
                    continue
                waited += 1
                other_v.append(oph["s_issue_v_wait"][j])
                other_issue.append(oph["pv_issue"][j])
                # How late the other warpgroup was ready: its turn's barrier released it when it
                # got there (k_landed) or later; ready after this warpgroup was = late.
                other_late.append(o[j, 1] - t[i, 1])
    for k, v in per.items():
        summary["phases"][k] = stats(np.concatenate(v) if v else np.array([]))
    # By the tile's place in its item: the period (start to next start) of an item's first tile
    # holds the previous item's epilogue; tile 0's epilogue split into its stores and the rest.
    places = {"first": [], "second": [], "inner": [], "next_to_last": [], "last": []}
    epi_stores, epi_rest, epi_exp = [], [], []
    for c in range(table.shape[0]):
        for w in range(table.shape[1]):
            t, _, ph = phases(table[c, w])
            if len(t) < 3:
                continue
            e = (t[:-1, -1] & 0xFFFFFFFF)
            cnt = (t[:-1, -1] >> 32)
            p = ph["period"][:-1]
            for name, m in (("first", e == 0), ("second", e == 1),
                            ("inner", (e > 1) & (e + 2 < cnt)), ("next_to_last", e + 2 == cnt),
                            ("last", e + 1 == cnt)):
                places[name].append(p[m])
            if t.shape[1] > 10:
                m = (t[:, -1] & 0xFFFFFFFF) == 0
                m &= (t[:, 8] != 0) & (t[:, 9] != 0)
                epi_exp.append(t[m, 8] - t[m, 6])
                epi_stores.append(t[m, 9] - t[m, 8])
                epi_rest.append(t[m, 7] - t[m, 9])
    summary["period_by_place"] = {k: stats(np.concatenate(v)) for k, v in places.items() if v}
    if epi_stores:
        summary["first_tile_epilogue"] = {
            "exp_pack": stats(np.concatenate(epi_exp)),
            "o_lse_stores": stats(np.concatenate(epi_stores)),
            "after_stores": stats(np.concatenate(epi_rest))}
    summary["waited_turns"] = {
        "turns": turns, "waited": waited, "wait_threshold": a.wait,
        "other_s_issue_v_wait": stats(np.array(other_v)),
        "other_pv_issue": stats(np.array(other_issue)),
        "other_ready_after_this": stats(np.array(other_late)),
    }
    print(f"{a.stamps}: clock cycles per tile and warpgroup (inner tiles of items)")
    print("| phase | median | mean | p10 | p90 |")
    print("|---|---|---|---|---|")
    for k, s in summary["phases"].items():
        if s["n"]:
            print(f"| {k} | {s['median']:.0f} | {s['mean']:.0f} | {s['p10']:.0f} | {s['p90']:.0f} |")
    print("\nperiod by the tile's place in its item")
    for k, st in summary["period_by_place"].items():
        if st["n"]:
            print(f"  {k}: median {st['median']:.0f}, mean {st['mean']:.0f} ({st['n']} tiles)")
    for k, st in summary.get("first_tile_epilogue", {}).items():
        if st["n"]:
            print(f"  first tile, {k}: median {st['median']:.0f}, mean {st['mean']:.0f}")
    wt = summary["waited_turns"]
    print(f"\nturns that waited > {a.wait} cycles: {wt['waited']} of {wt['turns']}")
    for k in ["other_s_issue_v_wait", "other_pv_issue", "other_ready_after_this"]:
        s = wt[k]
        if s["n"]:
            print(f"  {k}: median {s['median']:.0f}, mean {s['mean']:.0f}, p10 {s['p10']:.0f}, "
                  f"p90 {s['p90']:.0f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
