#!/usr/bin/env python3
"""Decode steps side by side: attnserve's split-KV decode kernel against PyTorch SDPA (flash,
memory-efficient and cuDNN backends) and FlashAttention-4 on the same shapes, in the same run.

Shapes: Q [1, Nq, Hq, D] at the context's last positions (causal, bottom-right aligned: query i
sees keys <= N - Nq + i) against K/V [1, N, Hkv, D], bf16, GQA. Inputs are torch-seeded uniform
(K, Q in [-2, 2), V in [-1, 1)). Timing: CUDA events around each call, median of --iters after a
warmup (FA4 compiles each shape at its first call). The memory floor is measured here too:
device-to-device copies of the same K/V bytes, bandwidth counting bytes read and written.

A backend that cannot run a case (no GQA, no bottom-right mask) is retried as the nearest
equivalent and labelled: "expanded" repeats K/V over the query heads first (4x the bytes read),
"non-causal" drops the mask (Nq <= 16 of N keys: the same bytes, nearly the same work).
Outputs are checked against SDPA's math on a slice of queries (first head group).

--ours takes attnbench_decode's JSON (the same shapes) and adds our kernel's time and the ratios
  ours / best alternative  (< 1: we are faster),  ours / bandwidth time (the 1.25x bound).

  python3 bench/decode_compare.py --contexts 131072,1048576 --q-lens 1,4,16 \
      --ours decode.json --json-out compare.json --md-out compare.md
FA4 needs flash-attn-4 importable (site dir from --fa4-site, see docs/BENCHMARKS.md).
"""
import argparse
import json
import math
import site
import statistics
import sys
import traceback

import torch
import torch.nn.functional as F

DT = torch.bfloat16


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def time_ms(fn, iters):
    fn()  # warmup (and FA4's compile)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def lower_right_mask(nq, n, device):
    # Only for the reference check on a slice: [nq, n] booleans, key j admitted iff j <= n - nq + i.
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return j <= (n - nq + i)


def sdpa_case(backend, q, k, v, causal_lr):
    """Returns (fn, label). q [1, Hq, Nq, D], k/v [1, Hkv, N, D] (views)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
          "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    nq, n = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    attempts = []
    mask = causal_lower_right(nq, n) if causal_lr else None
    attempts.append(("", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                 enable_gqa=True)))
    if causal_lr:
        attempts.append(("non-causal", lambda: F.scaled_dot_product_attention(
            q, k, v, enable_gqa=True)))
    ke = k.repeat_interleave(g, dim=1) if g > 1 else k
    ve = v.repeat_interleave(g, dim=1) if g > 1 else v
    attempts.append(("expanded" + (" non-causal" if causal_lr else ""),
                     lambda: F.scaled_dot_product_attention(q, ke, ve)))
    errors = []
    for label, fn in attempts:
        try:
            with sdpa_kernel([be]):
                out = fn()
            torch.cuda.synchronize()

            def run(fn=fn):
                with sdpa_kernel([be]):
                    return fn()
            return run, label, out, errors
        except Exception as e:  # noqa: BLE001
            errors.append(f"{label or 'plain'}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return None, None, None, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="131072,1048576")
    ap.add_argument("--q-lens", default="1,4,16")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--fa4-site", default="", help="site dir holding flash-attn-4 (site.addsitedir)")
    ap.add_argument("--ours", default="", help="attnbench_decode JSON of the same shapes")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--md-out", default="")
    a = ap.parse_args()
    torch.manual_seed(0)
    fa4 = None
    if a.fa4_site:
        site.addsitedir(a.fa4_site)
    try:
        from flash_attn.cute.interface import flash_attn_func as fa4  # noqa: F811
    except Exception as e:  # noqa: BLE001
        log(f"FlashAttention-4 not importable: {type(e).__name__}: {e}")
    ours = {}
    if a.ours:
        with open(a.ours) as f:
            for c in json.load(f)["cases"]:
                ours[(c["context_tokens"], c["q_len"])] = c
    hq, hkv, d = a.q_heads, a.kv_heads, a.head_dim
    results = []
    dev = torch.cuda.get_device_name()
    for n in [int(x) for x in a.contexts.split(",")]:
        k = (torch.rand(1, n, hkv, d, device="cuda", dtype=DT) * 4 - 2)
        v = (torch.rand(1, n, hkv, d, device="cuda", dtype=DT) * 2 - 1)
        scratch = torch.empty_like(k)
        copy = time_ms(lambda: (scratch.copy_(k), scratch.copy_(v)), a.iters)
        ctx_bytes = 2 * k.numel() * 2
        bw = 2 * ctx_bytes / (copy / 1e3)
        bw_ms = ctx_bytes / bw * 1e3
        log(f"context {n}: {ctx_bytes / 1e9:.3f} GB, copy bandwidth {bw / 1e9:.0f} GB/s, "
            f"bandwidth time {bw_ms:.3f} ms")
        del scratch
        for nq in [int(x) for x in a.q_lens.split(",")]:
            q = (torch.rand(1, nq, hq, d, device="cuda", dtype=DT) * 4 - 2)
            causal_lr = nq > 1  # one query row at the end sees every key
            row = {"context_tokens": n, "q_len": nq, "bandwidth_time_ms": bw_ms,
                   "copy_bandwidth_gbps": bw / 1e9, "alternatives": {}}
            # Reference on the first KV head's query heads: SDPA math in f32.
            g = hq // hkv
            qs = q[:, :, :g].transpose(1, 2).float()
            ks = k[:, :, :1].transpose(1, 2).float()
            vs = v[:, :, :1].transpose(1, 2).float()
            m = lower_right_mask(nq, n, "cuda")
            ref = F.scaled_dot_product_attention(qs, ks.expand(-1, g, -1, -1),
                                                 vs.expand(-1, g, -1, -1), attn_mask=m)
            ref = ref.transpose(1, 2)  # [1, nq, g, d]
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            for backend in ("flash", "efficient", "cudnn"):
                fn, label, out, errors = sdpa_case(backend, qt, kt, vt, causal_lr)
                entry = {"errors": errors}
                if fn is not None:
                    entry["ms"] = time_ms(fn, a.iters)
                    entry["label"] = label
                    o = out.transpose(1, 2)[:, :, :g].float()
                    entry["max_abs_err_vs_math"] = float((o - ref).abs().max())
                row["alternatives"][f"sdpa_{backend}"] = entry
                log(f"  N {n} Nq {nq} sdpa_{backend}: {entry.get('ms')} ms {label or ''} "
                    f"{'; '.join(errors)}")
                torch.cuda.empty_cache()
            if fa4 is not None:
                entry = {}
                try:
                    run = lambda: fa4(q, k, v, causal=causal_lr)  # noqa: E731
                    out = run()
                    out = out[0] if isinstance(out, tuple) else out
                    entry["ms"] = time_ms(run, a.iters)
                    entry["max_abs_err_vs_math"] = float((out[:, :, :g].float() - ref).abs().max())
                except Exception as e:  # noqa: BLE001
                    entry["errors"] = [f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"]
                    traceback.print_exc()
                row["alternatives"]["fa4"] = entry
                log(f"  N {n} Nq {nq} fa4: {entry.get('ms')} ms {entry.get('errors', '')}")
            timed = {name: e["ms"] for name, e in row["alternatives"].items() if "ms" in e}
            if timed:
                best = min(timed, key=timed.get)
                row["best_alternative"] = best
                row["best_alternative_ms"] = timed[best]
            o = ours.get((n, nq))
            if o is not None:
                row["attnserve_ms"] = o["kernel_ms"]
                row["attnserve_kernel"] = o["kernel"]
                row["attnserve_bandwidth_time_ms"] = o["bandwidth_time_ms"]
                row["attnserve_over_its_bandwidth_time"] = o["kernel_over_bandwidth"]
                if timed:
                    row["attnserve_over_best"] = o["kernel_ms"] / timed[best]
            results.append(row)
            del q
        del k, v
        torch.cuda.empty_cache()
    out = {"device": dev, "torch": torch.__version__, "q_heads": hq, "kv_heads": hkv,
           "head_dim": d, "dtype": "bf16", "command": " ".join(sys.argv), "cases": results}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    lines = ["| context | Nq | attnserve ms | x bandwidth time | SDPA flash | SDPA efficient | "
             "SDPA cuDNN | FA4 | ours / best |", "|---|---|---|---|---|---|---|---|---|"]

    def cell(e):
        if e is None or "ms" not in e:
            return "n/a"
        return f"{e['ms']:.3f}" + (f" ({e['label']})" if e.get("label") else "")
    for r in results:
        alt = r["alternatives"]
        ours_ms = r.get("attnserve_ms")
        lines.append(
            f"| {r['context_tokens']} | {r['q_len']} | "
            f"{'n/a' if ours_ms is None else f'{ours_ms:.3f}'} | "
            f"{r.get('attnserve_over_its_bandwidth_time', float('nan')):.2f} | "
            f"{cell(alt.get('sdpa_flash'))} | {cell(alt.get('sdpa_efficient'))} | "
            f"{cell(alt.get('sdpa_cudnn'))} | {cell(alt.get('fa4'))} | "
            f"{r.get('attnserve_over_best', float('nan')):.2f} |")
    md = "\n".join(lines)
    print(md)
    if a.md_out:
        with open(a.md_out, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
