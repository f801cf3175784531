#!/usr/bin/env python3
"""Draws the figures of docs/BENCHMARKS.md from the result files in bench/results/.

Each chart reads the JSON its table in docs/BENCHMARKS.md cites and writes one PNG (about 100 dpi)
into --out (docs/img/ by default); its footnote names the device, the date and the source file.
A chart whose files are missing or lack a field is skipped with a message, the others still drawn.

  kernels_dense       attnserve vs PyTorch flash / cuDNN, dense TFLOP/s (one H200)
  kernels_sparse      our block-sparse kernel vs FlexAttention, time per case
  decode_compare      decode step time: attnserve vs SDPA's backends and FlashAttention-4
  ring_scaling        ring speed-up over one GPU vs number of GPUs, ours and the PyTorch ring
  datapath_split      end to end time split into wire, queue, copies, kernel, other server work
  decode_service      a decode step through the service, split the same way
  bench_concurrency   `attnctl bench` requests/s and p99 vs concurrency, per transport
  sweep_<name>        an `attnctl bench --report-json` report (found under bench/results/, or
                      given with --sweep): requests/s and p50/p99 latency per level or rate

Usage: bench/plot_results.py [--results DIR] [--out DIR] [--sweep REPORT.json ...] [--only NAMES]
Needs matplotlib and numpy (the Agg backend: no display).
"""
import argparse
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DPI = 100
COLORS = {"attnserve": "#1f77b4", "own": "#6baed6", "flash": "#ff7f0e", "cudnn": "#2ca02c",
          "efficient": "#9467bd", "fa4": "#d62728", "flex": "#8c564b", "torch": "#ff7f0e"}


class Skip(Exception):
    """A chart that cannot be drawn from the files at hand."""


def load(results, rel):
    path = os.path.join(results, rel)
    if not os.path.exists(path):
        raise Skip(f"{rel} not found")
    with open(path) as f:
        return json.load(f)


def folder_date(rel):
    m = re.search(r"(\d{4}-\d{2}-\d{2})", rel)
    return m.group(1) if m else "date unknown"


def date_of(doc, rel):
    for key in ("date",):
        if isinstance(doc.get(key), str) and doc[key]:
            return doc[key][:10]
    meta = doc.get("ours_meta") or {}
    if meta.get("date"):
        return meta["date"][:10]
    return folder_date(rel)


def footnote(fig, device, date, sources):
    text = f"{device}, {date}. Source: " + ", ".join(f"bench/results/{s}" for s in sources)
    fig.text(0.01, 0.01, text, fontsize=7, color="#444444", ha="left", va="bottom", wrap=True)


def save(fig, out, name):
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    shown = os.path.relpath(path, REPO)
    print(f"wrote {path if shown.startswith('..') else shown} ({os.path.getsize(path) // 1024} KB)")
    return path


def bar_labels(ax, bars, fmt):
    for b in bars:
        h = b.get_height()
        if h and np.isfinite(h):
            ax.annotate(fmt.format(h), (b.get_x() + b.get_width() / 2, h), ha="center",
                        va="bottom", fontsize=6.5, xytext=(0, 1), textcoords="offset points")


def grouped_bars(ax, labels, series, fmt, log=False):
    """series: [(name, color, values)], one bar per group and series."""
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for i, (name, color, values) in enumerate(series):
        vals = [np.nan if v is None else v for v in values]
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=name,
                      color=color)
        bar_labels(ax, bars, fmt)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def chart_kernels_dense(results, out):
    rel = "h200x2-2026-11-22/single/compare.json"
    doc = load(results, rel)
    rows = [r for r in doc["results"] if r.get("group") == "dense"]
    if not rows:
        raise Skip(f"{rel} has no dense rows")
    labels = [f"N={int(r['name'].split('_n')[1].split('_')[0]):,}\n"
              f"{'causal' if r['name'].endswith('causal') else 'non-causal'}" for r in rows]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    series = [
        ("attnserve (cuDNN engine)", COLORS["attnserve"], [r["attnserve_tflops"] for r in rows]),
        ("attnserve own kernel", COLORS["own"], [r["ours_tflops"] for r in rows]),
        ("PyTorch SDPA flash", COLORS["flash"], [r["torch_flash_tflops"] for r in rows]),
        ("PyTorch SDPA cuDNN", COLORS["cudnn"], [r["torch_cudnn_tflops"] for r in rows]),
    ]
    if any(r.get("fa4_tflops") for r in rows):  # compare_torch.py --fa4-site runs
        series.append(("FlashAttention-4", COLORS["fa4"], [r.get("fa4_tflops") for r in rows]))
    grouped_bars(ax, labels, series, "{:.0f}")
    ax.set_ylabel("TFLOP/s (higher is better)")
    ax.set_title("Dense attention, bf16, D=128, Hq=Hkv=16, B x N = 16384", fontsize=10)
    ax.legend(fontsize=7, ncol=len(series), loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.subplots_adjust(bottom=0.3, top=0.92)
    footnote(fig, doc.get("device", "NVIDIA H200"), date_of(doc, rel), [rel])
    return save(fig, out, "kernels_dense")


def chart_kernels_sparse(results, out):
    rel = "h200-2026-11-22c/lease3/compare.json"
    doc = load(results, rel)
    rows = [r for r in doc["results"] if r.get("group") == "sparse" and r.get("flex_ms")]
    if not rows:
        raise Skip(f"{rel} has no block-sparse rows with FlexAttention")
    names = {"random": "random", "local_window": "local_window"}
    labels = []
    for r in rows:
        m = re.match(r"sparse_(.*)_s(\d+)", r["name"])
        labels.append(f"{names.get(m.group(1), m.group(1))}\n{100 * r['sparsity']:.1f}% skipped"
                      if m else r["name"])
    fig, ax = plt.subplots(figsize=(8, 4.2))
    series = [
        ("attnserve", COLORS["attnserve"], [r["ours_ms"] for r in rows]),
        ("FlexAttention (compiled)", COLORS["flex"], [r["flex_ms"] for r in rows]),
    ]
    if any(r.get("fa4_ms") for r in rows):  # compare_torch.py --fa4-site runs
        series.append(("FlashAttention-4 (block-sparse)", COLORS["fa4"],
                       [r.get("fa4_ms") for r in rows]))
    grouped_bars(ax, labels, series, "{:.2f}", log=True)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['ours_ms'] / r['flex_ms']:.2f}x", (i, max(r["ours_ms"], r["flex_ms"])),
                    xytext=(0, 12), textcoords="offset points", ha="center", fontsize=8,
                    weight="bold")
    ax.set_ylabel("ms (log scale, lower is better)")
    ax.set_title("Block-sparse, N=65536, 16 heads, block 128: time, ours / Flex in bold",
                 fontsize=10)
    ax.set_ylim(top=ax.get_ylim()[1] * 2)
    ax.legend(fontsize=8)
    fig.subplots_adjust(bottom=0.2, top=0.92)
    footnote(fig, doc.get("device", "NVIDIA H200"), date_of(doc, rel), [rel])
    return save(fig, out, "kernels_sparse")


def context_label(tokens):
    return f"{tokens // 1048576}M" if tokens % 1048576 == 0 else f"{tokens // 1024}K"


def chart_decode_compare(results, out):
    rel = "h200-2026-11-25-decode/run4-wgmma/decode_compare.json"
    doc = load(results, rel)
    cases = doc["cases"]
    labels = [f"context {context_label(c['context_tokens'])}\nNq={c['q_len']}" for c in cases]

    def alt(name):
        return [c["alternatives"].get(name, {}).get("ms") for c in cases]

    fig, ax = plt.subplots(figsize=(9, 4.4))
    grouped_bars(ax, labels, [
        ("attnserve", COLORS["attnserve"], [c["attnserve_ms"] for c in cases]),
        ("SDPA flash", COLORS["flash"], alt("sdpa_flash")),
        ("SDPA cuDNN", COLORS["cudnn"], alt("sdpa_cudnn")),
        ("SDPA efficient (K/V expanded)", COLORS["efficient"], alt("sdpa_efficient")),
        ("FlashAttention-4", COLORS["fa4"], alt("fa4")),
    ], "{:.2g}", log=True)
    x = np.arange(len(cases))
    ax.hlines([c["bandwidth_time_ms"] for c in cases], x - 0.45, x + 0.45, colors="k",
              linestyles=":", label="bandwidth time (K+V bytes / copy rate)", zorder=3)
    ax.set_ylabel("ms per step (log scale, lower is better)")
    ax.set_title(f"Decode, GQA {doc.get('q_heads', 32)}/{doc.get('kv_heads', 8)}, "
                 f"D={doc.get('head_dim', 128)}, {doc.get('dtype', 'bf16')}, causal bottom-right",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.subplots_adjust(bottom=0.32, top=0.92)
    footnote(fig, doc.get("device", "NVIDIA H200"), date_of(doc, rel), [rel])
    return save(fig, out, "decode_compare")


def chart_ring_scaling(results, out):
    runs = [(2, "h200x2-2026-11-22b/lease2/ring_bench.json",
             "h200x2-2026-11-22b/lease2/torch_ring.json"),
            (4, "h200x4-2026-11-22/ring_bench.json", "h200x4-2026-11-22/torch_ring.json")]
    n = 262144
    # (causal) -> {P: speed-up}; one GPU is 1 by definition.
    ours = {False: {1: 1.0}, True: {1: 1.0}}
    torch = {False: {1: 1.0}, True: {1: 1.0}}
    sources, dates = [], []
    for p, ring_rel, torch_rel in runs:
        try:
            ring = load(results, ring_rel)
        except Skip as e:
            print(f"ring_scaling: {e}; left out")
            continue
        sources.append(ring_rel)
        dates.append(date_of(ring, ring_rel))
        for c in ring["cases"]:
            if c["n"] == n and c.get("engine") == "cudnn" and not c.get("error"):
                ours[c["causal"]][p] = c["t1_s"] / c["t2_s"]
        try:
            tr = load(results, torch_rel)
            sources.append(torch_rel)
            for c in tr["cases"]:
                if c["n"] == n:
                    torch[c["causal"]][p] = c["t1_s"] / c["t2_s"]
        except Skip as e:
            print(f"ring_scaling: {e}; left out")
    if len(ours[False]) < 2 and len(ours[True]) < 2:
        raise Skip("no ring result")
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 4), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        ps = [1, 2, 4]
        ax.plot(ps, ps, "k--", lw=1, label="ideal (P x)")
        for label, data, color, marker in (("attnserve ring (cuDNN pieces)", ours, COLORS["attnserve"], "o"),
                                           ("PyTorch ring (SDPA flash + NCCL)", torch, COLORS["torch"], "s")):
            pts = sorted(data[causal].items())
            ax.plot([p for p, _ in pts], [s for _, s in pts], marker=marker, color=color,
                    label=label)
            below = color == COLORS["torch"]
            for p, s in pts[1:]:
                ax.annotate(f"{s:.2f}x (eff. {s / p:.2f})", (p, s), fontsize=7, ha="left",
                            xytext=(10, -11 if below else 4), textcoords="offset points",
                            color=color)
        ax.set_xticks(ps)
        ax.set_xlim(0.8, 5.9)
        ax.set_ylim(0.8, 4.6)
        ax.set_xlabel("GPUs (P)")
        ax.set_title(f"N={n:,}, {'causal (zigzag)' if causal else 'non-causal'}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speed-up over one GPU (T1 / TP)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Ring attention scaling, dense bf16, Hq=Hkv=8, D=128", fontsize=10)
    fig.subplots_adjust(bottom=0.24, top=0.86, wspace=0.08)
    footnote(fig, "NVIDIA H200 (2 and 4 GPUs, NVLink)", ", ".join(sorted(set(dates))), sources)
    return save(fig, out, "ring_scaling")


SPLIT = [("wire + client", "#bdbdbd"), ("queue", "#fdd0a2"), ("copies", "#fd8d3c"),
         ("other server work", "#9ecae1"), ("kernel", "#08519c")]


def split_bars(ax, labels, parts, unit_scale, share=False, unit="ms"):
    """parts: one dict per bar, keyed by SPLIT names, in seconds. share: each bar as % of its
    total, the total written on top."""
    x = np.arange(len(labels))
    totals = np.array([sum(max(0.0, v) for v in p.values()) * unit_scale for p in parts])
    bottom = np.zeros(len(labels))
    for name, color in SPLIT:
        vals = np.array([max(0.0, p.get(name, 0.0)) * unit_scale for p in parts])
        if not vals.any():
            continue
        if share:
            vals = 100 * vals / np.where(totals > 0, totals, 1)
        ax.bar(x, vals, 0.6, bottom=bottom, color=color, label=name)
        bottom += vals
    for i, total in enumerate(totals):
        text = f"{total:,.0f}" if total >= 100 else f"{total:.3g}"
        ax.annotate(f"{text} {unit}" if share else text, (i, bottom[i]),
                    ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                    textcoords="offset points")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(top=bottom.max() * 1.12 if bottom.max() > 0 else 1)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def stage_split(total, queue, compute, copy, kernel):
    """The server's stage figures as bar parts: the wire part is what the server did not spend
    queueing or computing (its receive of the upload included), the rest splits compute."""
    return {"wire + client": total - compute - queue, "queue": queue, "copies": copy,
            "other server work": compute - copy - kernel, "kernel": kernel}


def chart_datapath_split(results, out):
    grpc_rel = "h200-2026-11-23-datapath/run2/data_path.json"
    local_rel = "h200-2026-11-23-datapath/run5/data_path.json"
    requests = [("dilated_1m", "dilated 4 branches\n1,048,576 x 8 x 128"),
                ("sparse_random1_64k", "block-sparse random 1%\n65,536 x 16 x 128"),
                ("gqa_causal_4k", "dense causal GQA 32/8\n4,096 x 128")]
    columns = []  # (label, doc median table, transport key, source)
    sources = []
    for rel, transports in ((grpc_rel, [("gRPC", "grpc")]),
                            (local_rel, [("shm", "shm"), ("CUDA IPC", "ipc")])):
        try:
            doc = load(results, rel)
        except Skip as e:
            print(f"datapath_split: {e}; left out")
            continue
        sources.append(rel)
        for label, key in transports:
            columns.append((label, doc["requests_median_after_first"], key))
    if not columns:
        raise Skip("no data-path result")
    fig, axes = plt.subplots(1, len(requests), figsize=(10, 4.2), sharey=True)
    for ax, (req, title) in zip(axes, requests):
        labels, parts = [], []
        for label, table, key in columns:
            r = table.get(f"new/{key}/{req}")
            if r is None:
                continue
            labels.append(label)
            parts.append(stage_split(r["total"], r["queue"], r["compute"], r["copy"],
                                     r["kernel"]))
        split_bars(ax, labels, parts, 1e3, share=True)
        ax.set_title(title, fontsize=8.5)
    axes[0].set_ylabel("% of the end-to-end time (median)")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("End to end through the service: where the time goes (total on top; gRPC run 2, "
                 "shm and CUDA IPC run 5)", fontsize=10)
    fig.subplots_adjust(bottom=0.2, top=0.85, left=0.07, right=0.84, wspace=0.3)
    footnote(fig, "NVIDIA H200, client and server on one host", folder_date(local_rel), sources)
    return save(fig, out, "datapath_split")


def chart_decode_service(results, out):
    rels = ["h200-2026-11-25-decode/run3/decode_service_131072.json",
            "h200-2026-11-25-decode/run3/decode_service_1048576.json"]
    labels, parts, sources = [], [], []
    for rel in rels:
        try:
            doc = load(results, rel)
        except Skip as e:
            print(f"decode_service: {e}; left out")
            continue
        sources.append(rel)
        for step in doc["decode"]:
            labels.append(f"context {context_label(doc['context_tokens'])}\nNq={step['q_len']}")
            parts.append(stage_split(step["end_to_end_s"], step["queue_s"], step["compute_s"],
                                     0.0, step["kernel_s"]))
    if not parts:
        raise Skip("no decode service result")
    fig, ax = plt.subplots(figsize=(8, 4.2))
    split_bars(ax, labels, parts, 1e3)
    ax.set_ylabel("ms per decode step (median of 30)")
    ax.set_title("Decode step through the service (gRPC over loopback, context on the GPU)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.subplots_adjust(bottom=0.2, top=0.9)
    footnote(fig, "NVIDIA H200", folder_date(rels[0]), sources)
    return save(fig, out, "decode_service")


def sweep_axes(title_left, title_right):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    a1.set_title(title_left, fontsize=9.5)
    a2.set_title(title_right, fontsize=9.5)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    return fig, a1, a2


def chart_bench_concurrency(results, out):
    folders = [("gRPC (run 2)", "h200-2026-11-23-datapath/run2", "grpc"),
               ("shm (run 5)", "h200-2026-11-23-datapath/run5", "shm"),
               ("CUDA IPC in place (run 5)", "h200-2026-11-23-datapath/run5", "ipc")]
    lines, sources = [], []
    for label, folder, key in folders:
        pts = []
        for path in glob.glob(os.path.join(results, folder, f"bench_new_{key}_c*.json")):
            with open(path) as f:
                d = json.load(f)
            pts.append((d["concurrency"], d["requests_per_s"], d["latency_s"]["p99"]))
        if len(pts) >= 2:
            lines.append((label, sorted(pts)))
            sources.append(f"{folder}/bench_new_{key}_c*.json")
    if not lines:
        raise Skip("no attnctl bench results in the data-path folders")
    fig, a1, a2 = sweep_axes("requests/s", "p99 latency (ms)")
    for (label, pts), color in zip(lines, ("#7f7f7f", "#fd8d3c", "#08519c")):
        c = [p[0] for p in pts]
        a1.plot(c, [p[1] for p in pts], marker="o", color=color, label=label)
        a2.plot(c, [1e3 * p[2] for p in pts], marker="o", color=color, label=label)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks([1, 2, 4, 8, 16])
        a.set_xticklabels(["1", "2", "4", "8", "16"])
        a.set_xlabel("concurrency")
        a.set_yscale("log")
    a1.legend(fontsize=7, loc="center right")
    fig.suptitle("attnctl bench, dense causal GQA 32/8, 4,096 x 128 bf16 (48 MiB in, 32 MiB out)",
                 fontsize=10)
    fig.subplots_adjust(bottom=0.24, top=0.85, wspace=0.25)
    footnote(fig, "NVIDIA H200, client and server on one host", "2026-11-23", sources)
    return save(fig, out, "bench_concurrency")


def chart_sweep(path, out, results):
    with open(path) as f:
        doc = json.load(f)
    rows = doc.get("rows")
    if doc.get("bench") != "attnctl bench" or not rows:
        raise Skip(f"{path} is no attnctl bench report")
    rate = doc.get("mode") == "rate"
    x = [r["target_rate"] if rate else r["concurrency"] for r in rows]
    fig, a1, a2 = sweep_axes("achieved requests/s" if rate else "requests/s",
                             "latency (ms" + (", from the scheduled start)" if rate else ")"))
    a1.plot(x, [r["requests_per_s"] for r in rows], marker="o", color=COLORS["attnserve"],
            label="achieved" if rate else "requests/s")
    if rate:
        a1.plot(x, x, "k--", lw=1, label="offered")
        a1.legend(fontsize=7)
    for key, style, color in (("p50", "-", COLORS["attnserve"]), ("p90", ":", COLORS["flash"]),
                              ("p99", "--", COLORS["fa4"])):
        a2.plot(x, [1e3 * r["latency_s"][key] for r in rows], style, marker="o", label=key,
                color=color)
    a2.legend(fontsize=7)
    for i, r in enumerate(rows):
        bad = [f"{r[k]} {k}" for k in ("failed", "dropped") if r.get(k)]
        if bad:
            a1.annotate(", ".join(bad), (x[i], r["requests_per_s"]), fontsize=7, color="red",
                        ha="right", xytext=(-4, 6), textcoords="offset points")
    a1.set_ylim(bottom=0)
    a2.set_ylim(bottom=0)
    for a in (a1, a2):
        a.set_xlabel("offered rate (requests/s)" if rate else "concurrency")
        if not rate and len(x) > 1 and min(x) > 0:
            a.set_xscale("log", base=2)
            a.set_xticks(x)
            a.set_xticklabels([str(v) for v in x])
    shape = "x".join(str(v) for v in doc.get("shape", []))
    fig.suptitle(f"attnctl bench {'open loop' if rate else 'closed loop'}: [{shape}] "
                 f"{doc.get('dtype', '')}, spec {json.dumps(doc.get('spec', {}))}, "
                 f"{doc.get('transport', 'grpc')}, backend {doc.get('backend', '?')}",
                 fontsize=9.5)
    fig.subplots_adjust(bottom=0.24, top=0.85, wspace=0.25)
    source = os.path.relpath(os.path.abspath(path), os.path.abspath(results))
    if source.startswith(".."):
        source = path
    footnote(fig, doc.get("device", "device unknown"), doc.get("date", "")[:10] or "date unknown",
             [source])
    stem = os.path.splitext(os.path.basename(path))[0]
    if not source.startswith(("/", "..")) and os.path.dirname(source):
        stem = f"{os.path.basename(os.path.dirname(source))}_{stem}"  # a results folder's report
    name = re.sub(r"[^A-Za-z0-9_]+", "_", stem)
    return save(fig, out, f"sweep_{name}")


CHARTS = {
    "kernels_dense": chart_kernels_dense,
    "kernels_sparse": chart_kernels_sparse,
    "decode_compare": chart_decode_compare,
    "ring_scaling": chart_ring_scaling,
    "datapath_split": chart_datapath_split,
    "decode_service": chart_decode_service,
    "bench_concurrency": chart_bench_concurrency,
}


def find_sweeps(results):
    """attnctl bench reports under `results` (JSON objects with bench == "attnctl bench")."""
    found = []
    for path in sorted(glob.glob(os.path.join(results, "**", "*.json"), recursive=True)):
        try:
            with open(path) as f:
                head = f.read(4096)
        except OSError:
            continue
        if '"bench": "attnctl bench"' in head or '"bench":"attnctl bench"' in head:
            found.append(path)
    return found


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=os.path.join(REPO, "bench", "results"))
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "img"))
    parser.add_argument("--sweep", action="append", default=[],
                        help="an attnctl bench --report-json file (repeatable)")
    parser.add_argument("--only", default="",
                        help="comma-separated chart names (see the list above; 'sweep' for the "
                             "reports)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    written, skipped = [], 0
    for name, chart in CHARTS.items():
        if only and name not in only:
            continue
        try:
            written.append(chart(args.results, args.out))
        except (Skip, KeyError, ValueError, TypeError) as e:
            skipped += 1
            print(f"skip {name}: {e.__class__.__name__ if not isinstance(e, Skip) else ''}"
                  f"{' ' if not isinstance(e, Skip) else ''}{e}")
    if not only or "sweep" in only:
        for path in args.sweep + [p for p in find_sweeps(args.results) if p not in args.sweep]:
            try:
                written.append(chart_sweep(path, args.out, args.results))
            except (Skip, OSError, KeyError, ValueError, TypeError) as e:
                skipped += 1
                print(f"skip sweep {path}: {e}")
    print(f"{len(written)} charts written, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
