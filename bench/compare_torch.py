#!/usr/bin/env python3
"""Side-by-side of attnserve's CUDA kernels with PyTorch on the same GPU.

Times, on the shapes of bench/cuda/cases.cc (attnbench_cuda):
  * dense:   SDPA with the flash backend and with the cuDNN backend (non-causal and causal)
  * sparse:  FlexAttention with a BlockMask built from the identical CSR that attnbench_cuda
             dumped (--csr_dir), via BlockMask.from_kv_blocks; plus create_block_mask timing for
             the 1M-token 99.9%-skipped layout, capped by a timeout (subprocess)
  * dilated: a PyTorch LongNet implementation (gather per branch and head group, SDPA flash
             returning the logsumexp, LSE merge in f32), with its peak memory
  * FlashAttention-4 (flash-attn-4, its CuTe-DSL kernels; sm90 ones on Hopper), imported from
             the site dir given with --fa4-site (else its columns say "not installed"): dense
             (D = 128 and D = 64) and block-sparse on the same CSR as FlexAttention, its blocks
             given as FA4 "full" blocks (bench/fa4_blocks.py converts the CSR and says which
             block sizes FA4 takes); a layout FA4 refuses gets its reason in fa4_error, never a
             time. Its output is checked against SDPA flash (dense) or FlexAttention (sparse) on
             the same inputs: fa4_check = max |diff| / max |O| and the non-finite count, FAIL in
             the markdown above 2e-2. FA4's first call per shape compiles (fa4_first_call_s).
Inputs are torch-seeded uniform [-1, 1) in bf16 ([B, N, H, D] like attnserve). Timing: --timing
(TIMING below), by default attnbench_cuda's own loop. Merges attnbench_cuda's JSON (--ours), writes
a JSON and a markdown table. FLOPs = 4 * B * Hq * D * admitted pairs (attnbench_cuda's formula;
admitted pairs come from its JSON where available).

attnbench_cuda writes two rows for dense/window cases: "own" (our flash_fwd kernels) and
"attnserve" (what the service's CudaDevice runs: cuDNN where it can, with `engine` saying which).
Ratio columns (None where a side is missing):
  attnserve/flash, attnserve/cuDNN  dense: attnserve TFLOP/s over SDPA flash / SDPA cuDNN TFLOP/s
  ours/flex time                    block-sparse: our ms over FlexAttention's ms (< 1: we are faster)
  ours/torch tok/s, ours/torch peak dilated: our tokens/s over PyTorch LongNet's (> 1: faster), and
                                    our peak bytes over its peak bytes (< 1: less memory)
  own/FA4, attnserve/FA4            dense: our own kernel's / the service row's TFLOP/s over FA4's
  ours/FA4 time                     block-sparse: our ms over FA4's ms (< 1: we are faster)
"""
import argparse
import json
import math
import os
import site
import subprocess
import sys
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

try:
    import triton
    import triton.testing
except Exception:  # pragma: no cover
    triton = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa4_blocks  # noqa: E402  (numpy only: the CSR -> FA4 block lists and the output check)
from cuda_events import event_times, once_ms  # noqa: E402  (the per-call event loop)

DEV = "cuda"
DT = torch.bfloat16


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --timing: "events" = attnbench_cuda's loop (3 warm-up calls, 20 calls queued back to back
# between per-call CUDA events, one synchronize; median): GPU time per call with the host's
# dispatch overlapped, as for our rows. "do_bench" = triton's (an L2 flush before each call; the
# GPU waits for the host inside its events, which charges FA4's ~0.25 ms Python dispatch to it).
TIMING = "events"
EVENT_WARMUP, EVENT_ITERS = 3, 20


def bench_ms(fn, warmup=25, rep=100):
    """Median ms, timed as TIMING says (warmup / rep: do_bench's milliseconds)."""
    if TIMING == "do_bench" and triton is not None:
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(EVENT_WARMUP):
        fn()
    torch.cuda.synchronize()
    return float(np.median(event_times(fn, EVENT_ITERS)))


def inputs(b, n, hq, hkv, d, seed=0):
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    q = torch.rand((b, n, hq, d), device=DEV, dtype=DT, generator=g) * 2 - 1
    k = torch.rand((b, n, hkv, d), device=DEV, dtype=DT, generator=g) * 2 - 1
    v = torch.rand((b, n, hkv, d), device=DEV, dtype=DT, generator=g) * 2 - 1
    return q, k, v


def dense_pairs(n, causal):
    return n * (n + 1) // 2 if causal else n * n


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else None


# ---------------------------------------------------------------- dense: SDPA flash / cuDNN
def run_dense(case, res):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, n, hq, hkv, d, causal = (case[k] for k in ("batch", "tokens", "q_heads", "kv_heads",
                                                    "head_dim", "causal"))
    q, k, v = inputs(b, n, hq, hkv, d)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, N, D] views of [B, N, H, D]
    flops = 4 * b * hq * d * dense_pairs(n, causal)
    ref = None
    for name, backend in (("torch_flash", SDPBackend.FLASH_ATTENTION),
                          ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            def fn():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            ms = bench_ms(fn) if n <= 65536 else once_ms(fn)
            res[name + "_ms"] = ms
            res[name + "_tflops"] = tflops(flops, ms)
            if FA4["func"] is not None and ref is None:
                ref = fn().transpose(1, 2)  # [B, N, H, D], FA4's layout: its check's reference
                res["fa4_check_ref"] = "SDPA " + name[len("torch_"):]
        except Exception as e:  # backend refused the shape, OOM, ...
            res[name + "_error"] = repr(e)[:300]
    run_fa4(res, lambda: fa4_call(q, k, v, causal=causal), flops, n <= 65536, ref)
    del q, k, v, ref


# ---------------------------------------------------------------- sparse: FlexAttention
_flex_compiled = None


def flex():
    global _flex_compiled
    if _flex_compiled is None:
        from torch.nn.attention.flex_attention import flex_attention
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    return _flex_compiled


def block_mask_from_csr(row_ptr, col_idx, n, bs):
    from torch.nn.attention.flex_attention import BlockMask
    nb = len(row_ptr) - 1
    counts = np.diff(row_ptr).astype(np.int32)
    # FlexAttention's BlockMask wants kv_indices of width = number of KV blocks (its transpose
    # scatters into a [rows, width + 1] table indexed by column), so pad every row to nb.
    width = nb
    idx = np.zeros((nb, width), dtype=np.int32)
    rows = np.repeat(np.arange(nb), counts)
    pos = np.arange(len(col_idx)) - np.repeat(row_ptr[:-1], counts)
    idx[rows, pos] = col_idx
    full_num = torch.from_numpy(counts).to(DEV).view(1, 1, nb)
    full_idx = torch.from_numpy(idx).to(DEV).view(1, 1, nb, width)
    zero_num = torch.zeros_like(full_num)
    zero_idx = torch.zeros_like(full_idx)
    # Every kept block is a full block (non-causal layouts): no mask_mod work inside blocks.
    return BlockMask.from_kv_blocks(zero_num, zero_idx, full_num, full_idx, BLOCK_SIZE=bs,
                                    seq_lengths=(n, n))


def run_sparse(case, res, csr_dir):
    name = case["name"]
    b, n, hq, hkv, d = (case[k] for k in ("batch", "tokens", "q_heads", "kv_heads", "head_dim"))
    rp = os.path.join(csr_dir, name + "_row_ptr.npy")
    ci = os.path.join(csr_dir, name + "_col_idx.npy")
    if not (os.path.exists(rp) and os.path.exists(ci)):
        res["flex_error"] = "no CSR dump for this case"
        res["fa4_error"] = "no CSR dump for this case"
        return
    row_ptr, col_idx = np.load(rp), np.load(ci)
    bs = 128
    t0 = time.perf_counter()
    bm = block_mask_from_csr(row_ptr, col_idx, n, bs)
    torch.cuda.synchronize()
    res["flex_blockmask_from_csr_ms"] = (time.perf_counter() - t0) * 1e3
    q, k, v = inputs(b, n, hq, hkv, d)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    pairs = case.get("flops", 0) / (4 * b * hq * d) if case.get("flops") else None
    ref = None
    try:
        f = flex()
        fn = lambda: f(qt, kt, vt, block_mask=bm)
        out = fn()  # compile
        torch.cuda.synchronize()
        ms = bench_ms(fn) if n <= 1048576 else once_ms(fn)
        res["flex_ms"] = ms
        if pairs:
            res["flex_tflops"] = tflops(4 * b * hq * d * pairs, ms)
        if FA4["func"] is not None:
            ref = out.transpose(1, 2)  # [B, N, H, D]: FA4's check against the same mask
            res["fa4_check_ref"] = "FlexAttention"
    except Exception as e:
        res["flex_error"] = repr(e)[:300]
    del bm
    run_fa4_sparse(case, res, q, k, v, row_ptr, col_idx, pairs, ref)
    del q, k, v, ref


def create_block_mask_child(csr_dir, name, n):
    """Runs in a subprocess: create_block_mask(_compile=True) with a mask_mod over the CSR."""
    from torch.nn.attention.flex_attention import create_block_mask
    row_ptr = np.load(os.path.join(csr_dir, name + "_row_ptr.npy"))
    col_idx = np.load(os.path.join(csr_dir, name + "_col_idx.npy"))
    bs = 128
    nb = len(row_ptr) - 1
    # A dense [nb, nb] block table (nb = 8192 at 1M tokens: 64 MiB of bools); the mask_mod looks
    # the (query block, key block) pair up, so create_block_mask evaluates the identical layout.
    counts = np.diff(row_ptr)
    rows = np.repeat(np.arange(nb), counts)
    table = torch.zeros((nb, nb), dtype=torch.bool, device=DEV)
    table[torch.from_numpy(rows).to(DEV), torch.from_numpy(col_idx.astype(np.int64)).to(DEV)] = True

    def mask_mod(b, h, q_idx, kv_idx):
        return table[q_idx // bs, kv_idx // bs]

    t0 = time.perf_counter()
    create_block_mask(mask_mod, 1, 1, n, n, device=DEV, BLOCK_SIZE=bs, _compile=True)
    torch.cuda.synchronize()
    print(json.dumps({"create_block_mask_ms": (time.perf_counter() - t0) * 1e3}))


def run_create_block_mask(case, res, csr_dir, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--child-create-block-mask", case["name"],
           "--csr_dir", csr_dir, "--n", str(case["tokens"])]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                res.update(json.loads(line))
        if "create_block_mask_ms" not in res:
            res["create_block_mask_error"] = (p.stderr or "")[-300:]
    except subprocess.TimeoutExpired:
        res["create_block_mask_error"] = f"timeout after {timeout} s"


# ---------------------------------------------------------------- FlashAttention-4
# FA4["func"]: flash_attn.cute.interface.flash_attn_func when importable (load_fa4), else None and
# FA4["status"] says why ("not installed ..."): every FA4 column then shows that.
FA4 = {"status": "not installed", "func": None, "block_sparse_tensors": None, "version": None,
       "site": None}


def load_fa4(site_dir):
    """Imports FA4 from site_dir; none given: FA4 stays off (the runs without it time exactly
    what they timed before FA4 was added)."""
    if not site_dir:
        FA4["status"] = "not installed (no --fa4-site)"
        return
    site.addsitedir(site_dir)  # like bench/decode_compare.py: FA4's wheels live off sys.path
    FA4["site"] = site_dir
    try:
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
        from flash_attn.cute.interface import flash_attn_func
    except Exception as e:  # noqa: BLE001  (absent, or its CuTe-DSL runtime missing)
        FA4["status"] = f"not installed ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
        log(f"compare_torch: FlashAttention-4 {FA4['status']}")
        return
    FA4.update(func=flash_attn_func, block_sparse_tensors=BlockSparseTensorsTorch, status="ok")
    try:
        from importlib.metadata import version
        FA4["version"] = version("flash-attn-4")
    except Exception:  # noqa: BLE001  (no dist-info beside the package: its own attribute)
        import flash_attn
        FA4["version"] = getattr(flash_attn, "__version__", "(version unknown)")
    log(f"compare_torch: FlashAttention-4 {FA4['version']} from {site_dir}")


def fa4_call(q, k, v, **kw):
    out = FA4["func"](q, k, v, **kw)
    return out[0] if isinstance(out, tuple) else out  # (out, lse)


def check_output(out, ref, chunk=65536):
    """fa4_blocks.output_check of out against ref ([B, N, H, D] both), in f32, N in chunks."""
    diffs, tops = [], []
    bad = 0
    for s in range(0, out.shape[1], chunk):
        o, r = out[:, s:s + chunk].float(), ref[:, s:s + chunk].float()
        diffs.append((o - r).abs().max())
        tops.append(r.abs().max())
        bad += int((~torch.isfinite(o)).sum())
    # torch's max keeps a NaN (Python's max would drop it): a NaN anywhere fails the check.
    return fa4_blocks.output_check(float(torch.stack(diffs).max()),
                                   float(torch.stack(tops).max()), bad)


def run_fa4(res, fn, flops, repeat, ref):
    """Times fn (an FA4 call) into fa4_*: the median of many runs when `repeat`, else one run
    (as the other columns of the case). Its first call (FA4 compiles per shape) is timed apart.
    Checks its output against ref when there is one."""
    if FA4["func"] is None:
        res["fa4_error"] = FA4["status"]
        return
    try:
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        res["fa4_first_call_s"] = time.perf_counter() - t0
        if ref is not None:
            res["fa4_check"] = check_output(out, ref)
        del out
        ms = bench_ms(fn) if repeat else once_ms(fn)
        res["fa4_ms"] = ms
        res["fa4_tflops"] = tflops(flops, ms) if flops else None
    except Exception as e:  # noqa: BLE001  (FA4 refused the shape, OOM, ...)
        res["fa4_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        traceback.print_exc()


def run_fa4_sparse(case, res, q, k, v, row_ptr, col_idx, pairs, ref):
    """FA4 with the CSR's kept block pairs as full blocks (no mask blocks), block size = the
    layout's, when FA4 takes it on this GPU (fa4_blocks.fa4_block_sparse_refusal)."""
    if FA4["func"] is None:
        res["fa4_error"] = FA4["status"]
        return
    b, n, hq, d = (case[k] for k in ("batch", "tokens", "q_heads", "head_dim"))
    try:
        bs = fa4_blocks.layout_block_size(n, row_ptr)
        nb = len(row_ptr) - 1
        counts, idx = fa4_blocks.csr_to_kv_block_lists(row_ptr, col_idx, nb)
    except ValueError as e:
        res["fa4_error"] = f"layout not converted: {e}"
        return
    res["fa4_block_size"] = [bs, bs]
    major, minor = torch.cuda.get_device_capability()
    why = fa4_blocks.fa4_block_sparse_refusal(major, d, n, bs, bs, nb, nb)
    if why is not None:
        res["fa4_error"] = (f"FA4 {FA4['version']} cannot take this layout on "
                            f"sm{major}{minor}: {why}")
        return
    full_cnt = torch.from_numpy(counts).to(DEV).view(1, 1, nb)
    full_idx = torch.from_numpy(idx).to(DEV).view(1, 1, nb, idx.shape[1])
    # No mask blocks: empty lists (FA4 wants the mask tensors even then).
    mask_cnt = torch.zeros_like(full_cnt)
    mask_idx = torch.zeros((1, 1, nb, 1), dtype=torch.int32, device=DEV)

    def tensors(shape):
        t = [x.expand(*shape, *x.shape[2:]).contiguous() for x in
             (mask_cnt, mask_idx, full_cnt, full_idx)]
        return FA4["block_sparse_tensors"](mask_block_cnt=t[0], mask_block_idx=t[1],
                                           full_block_cnt=t[2], full_block_idx=t[3],
                                           block_size=(bs, bs))
    flops = 4 * b * hq * d * pairs if pairs else None
    # One layout for every batch and head (FA4 broadcasts dims of size 1); should this FA4 build
    # refuse the broadcast, the same lists copied per (batch, head) as its own
    # compute_block_sparsity makes them. fa4_block_sparse_form says which one ran.
    errors = []
    for form, shape in (("broadcast [1, 1, M, W]", (1, 1)), (f"per head [{b}, {hq}, M, W]",
                                                             (b, hq))):
        bst = tensors(shape)
        res.pop("fa4_error", None)
        run_fa4(res, lambda: fa4_call(q, k, v, block_sparse_tensors=bst), flops, n <= 1048576,
                ref)
        if "fa4_error" not in res:
            res["fa4_block_sparse_form"] = form
            break
        errors.append(f"{form}: {res['fa4_error']}")
    if errors:
        res["fa4_block_sparse_errors"] = errors


# ---------------------------------------------------------------- dilated: PyTorch LongNet
def dilated_torch(q, k, v, segs, rates, scale):
    """LongNet dilated attention: per branch and head group, gather, SDPA (flash) with LSE,
    scatter + LSE-merge into f32 accumulators. Assumes N divisible by every segment length."""
    b, n, hq, d = q.shape
    hkv = k.shape[2]
    grp = hq // hkv
    o_acc = torch.zeros((b, n, hq, d), device=q.device, dtype=torch.float32)
    l_acc = torch.full((b, hq, n), float("-inf"), device=q.device, dtype=torch.float32)
    for w, r in zip(segs, rates):
        for o in range(min(r, hq)):
            heads = torch.arange(o, hq, r, device=q.device)
            kv_heads = heads // grp
            pos = torch.arange(o, n, r, device=q.device)
            pos = pos[(pos % w) >= o]  # t*w + o + m*r inside each segment
            nseg = n // w
            L = pos.numel() // nseg
            qg = q[:, pos][:, :, heads].reshape(b * nseg, L, len(heads), d).transpose(1, 2)
            kg = k[:, pos][:, :, kv_heads].reshape(b * nseg, L, len(heads), d).transpose(1, 2)
            vg = v[:, pos][:, :, kv_heads].reshape(b * nseg, L, len(heads), d).transpose(1, 2)
            out = torch.ops.aten._scaled_dot_product_flash_attention(qg, kg, vg, 0.0, False,
                                                                     False, scale=scale)
            og, lse = out[0], out[1]  # [b*nseg, Hg, L, D], [b*nseg, Hg, L] (natural log)
            og = og.transpose(1, 2).reshape(b, nseg * L, len(heads), d).float()
            lse = lse.reshape(b, nseg, len(heads), L).permute(0, 2, 1, 3).reshape(b, len(heads),
                                                                                  nseg * L)
            la = l_acc[:, heads][:, :, pos]
            lnew = torch.logaddexp(la, lse)
            wa = torch.exp(la - lnew).nan_to_num(0.0)
            wi = torch.exp(lse - lnew)
            cur = o_acc[:, pos][:, :, heads]
            merged = cur * wa.permute(0, 2, 1)[..., None] + og * wi.permute(0, 2, 1)[..., None]
            o_acc[:, pos[:, None], heads[None, :]] = merged
            l_acc[:, heads[:, None], pos[None, :]] = lnew
    return o_acc.to(q.dtype), l_acc


def run_dilated(case, res, segs=(2048, 4096, 8192, 16384), rates=(1, 2, 4, 8)):
    b, n, hq, hkv, d = (case[k] for k in ("batch", "tokens", "q_heads", "kv_heads", "head_dim"))
    q, k, v = inputs(b, n, hq, hkv, d)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    scale = 1.0 / math.sqrt(d)
    try:
        fn = lambda: dilated_torch(q, k, v, segs, rates, scale)
        ms = bench_ms(fn, warmup=5, rep=50) if n <= 65536 else once_ms(fn)
        res["torch_dilated_ms"] = ms
        res["torch_dilated_tokens_per_s"] = b * n / (ms * 1e-3)
        res["torch_dilated_peak_bytes"] = torch.cuda.max_memory_allocated()
        res["torch_dilated_peak_bytes_above_inputs"] = torch.cuda.max_memory_allocated() - base
    except Exception as e:
        res["torch_dilated_error"] = repr(e)[:300]
    del q, k, v


# ---------------------------------------------------------------- main
def ratio(a, b):
    return a / b if a is not None and b else None


def add_ratios(res):
    res["attnserve_over_flash"] = ratio(res.get("attnserve_tflops"), res.get("torch_flash_tflops"))
    res["attnserve_over_cudnn"] = ratio(res.get("attnserve_tflops"), res.get("torch_cudnn_tflops"))
    res["ours_over_flex_time"] = ratio(res.get("ours_ms"), res.get("flex_ms"))
    res["ours_over_torch_dilated_throughput"] = ratio(res.get("ours_tokens_per_s"),
                                                      res.get("torch_dilated_tokens_per_s"))
    res["ours_over_torch_dilated_peak"] = ratio(res.get("ours_peak_bytes"),
                                                res.get("torch_dilated_peak_bytes"))
    res["own_over_fa4"] = ratio(res.get("ours_tflops"), res.get("fa4_tflops"))
    res["attnserve_over_fa4"] = ratio(res.get("attnserve_tflops"), res.get("fa4_tflops"))
    res["ours_over_fa4_time"] = ratio(res.get("ours_ms"), res.get("fa4_ms"))


def fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def fa4_cells(r):
    """FA4 ms, FA4 TFLOP/s, own/FA4, attnserve/FA4, ours/FA4 time, FA4 check."""
    chk = r.get("fa4_check")
    if (r.get("fa4_error") or "").startswith("not installed"):
        return ["not installed"] * 6
    if chk is not None:
        verdict = f"{'PASS' if chk['ok'] else 'FAIL'} {chk['rel']:.1e}" + (
            f" ({chk['nonfinite']} non-finite)" if chk["nonfinite"] else "")
    elif r.get("fa4_error"):
        verdict = r["fa4_error"][:60]
    else:
        verdict = "-"
    ms = fmt(r.get("fa4_ms")) if "fa4_ms" in r else ("-" if "fa4_error" not in r else "n/a")
    return [ms, fmt(r.get("fa4_tflops"), 1), fmt(r.get("own_over_fa4"), 2),
            fmt(r.get("attnserve_over_fa4"), 2), fmt(r.get("ours_over_fa4_time"), 2), verdict]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="attnbench_cuda JSON")
    ap.add_argument("--csr_dir", default="/tmp/attn_csr")
    ap.add_argument("--json", default="compare.json")
    ap.add_argument("--md", default="compare.md")
    ap.add_argument("--cases", default="all", help="comma list of case names or groups")
    ap.add_argument("--cbm_timeout", type=int, default=60)
    ap.add_argument("--fa4-site", dest="fa4_site", default="",
                    help="site dir holding flash-attn-4 (added with site.addsitedir); without it, "
                         "or when flash_attn.cute does not import from it, the FA4 columns say "
                         "'not installed'")
    ap.add_argument("--timing", choices=("events", "do_bench"), default="events",
                    help="how the torch-side engines are timed (see TIMING)")
    ap.add_argument("--child-create-block-mask", dest="child", default=None)
    ap.add_argument("--n", type=int, default=0)
    a = ap.parse_args()
    if a.child:
        create_block_mask_child(a.csr_dir, a.child, a.n)
        return
    global TIMING
    TIMING = a.timing
    load_fa4(a.fa4_site)

    ours = {}
    served = {}
    meta = {}
    if a.ours and os.path.exists(a.ours):
        with open(a.ours) as f:
            data = json.load(f)
        meta = {k: v for k, v in data.items() if k != "results"}
        # Rows without "variant" (older JSONs) are our kernels.
        ours = {r["name"]: r for r in data["results"] if r.get("variant", "own") != "attnserve"}
        served = {r["name"]: r for r in data["results"] if r.get("variant") == "attnserve"}
    cases = list(ours.values())
    if not cases:
        log("compare_torch: no attnbench_cuda results; nothing to compare")
    sel = set(a.cases.split(","))
    results = []

    def flush():
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": getattr(triton, "__version__", None), "timing": TIMING,
                       "ours_meta": meta,
                       "fa4": {k: FA4[k] for k in ("status", "version", "site")},
                       "results": results}, f, indent=1)

    for case in cases:
        if a.cases != "all" and case["name"] not in sel and case["group"] not in sel:
            continue
        res = {"name": case["name"], "group": case["group"], "ours_ms": case.get("ms_median"),
               "ours_tflops": case.get("tflops"), "ours_tokens_per_s": case.get("tokens_per_s"),
               "ours_peak_bytes": case.get("peak_bytes"), "ours_ok": case.get("check", {}).get("ok"),
               "ours_error": case.get("error"), "sparsity": case.get("sparsity"),
               "compile_ms": case.get("compile_ms"), "head_dim": case.get("head_dim"),
               "causal": case.get("causal"), "tokens": case.get("tokens")}
        srv = served.get(case["name"])
        if srv is not None:
            res.update({"attnserve_engine": srv.get("engine"), "attnserve_ms": srv.get("ms_median"),
                        "attnserve_tflops": srv.get("tflops"),
                        "attnserve_ok": srv.get("check", {}).get("ok"),
                        "attnserve_error": srv.get("error"), "attnserve_note": srv.get("note")})
        log(f"[compare_torch] {case['name']} ...")
        t0 = time.time()
        try:
            g = case["group"]
            if g in ("dense", "dense_d64") or case["name"] == "huge_dense_causal_n1048576":
                run_dense(case, res)
            elif g in ("sparse", "compile") or case["name"].startswith("huge_sparse"):
                if case["name"].startswith("huge_sparse"):
                    res["flex_error"] = "not run (8M tokens: see notes)"
                else:
                    run_sparse(case, res, a.csr_dir)
                if g == "compile":
                    run_create_block_mask(case, res, a.csr_dir, a.cbm_timeout)
            elif g == "dilated":
                run_dilated(case, res)
        except Exception as e:
            res["error"] = repr(e)[:300]
            traceback.print_exc()
        add_ratios(res)
        res["wall_s"] = time.time() - t0
        torch.cuda.empty_cache()
        results.append(res)
        flush()
        log(json.dumps(res))

    # Markdown table.
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"triton {getattr(triton, '__version__', None)}, FlashAttention-4 "
             f"{FA4['version'] if FA4['func'] is not None else FA4['status']}, timing {TIMING}",
             "",
             "| case | sparsity | ours ms | ours TFLOP/s | attnserve engine | attnserve ms | "
             "attnserve TFLOP/s | flash ms | flash TFLOP/s | cuDNN ms | cuDNN TFLOP/s | "
             "attnserve/flash | attnserve/cuDNN | flex ms | flex TFLOP/s | ours/flex time | "
             "torch dilated ms | ours/torch tok/s | ours peak GiB | torch dilated peak GiB | "
             "ours/torch peak | create_block_mask ms | ours ok | attnserve ok | FA4 ms | "
             "FA4 TFLOP/s | own/FA4 | attnserve/FA4 | ours/FA4 time | FA4 check |",
             "|" + "---|" * 30]
    gib = lambda x: x / 2**30 if x else None
    for r in results:
        lines.append("| " + " | ".join([
            r["name"], fmt(r.get("sparsity"), 4), fmt(r.get("ours_ms")), fmt(r.get("ours_tflops"), 1),
            fmt(r.get("attnserve_engine")), fmt(r.get("attnserve_ms")),
            fmt(r.get("attnserve_tflops"), 1),
            fmt(r.get("torch_flash_ms")), fmt(r.get("torch_flash_tflops"), 1),
            fmt(r.get("torch_cudnn_ms")), fmt(r.get("torch_cudnn_tflops"), 1),
            fmt(r.get("attnserve_over_flash"), 2), fmt(r.get("attnserve_over_cudnn"), 2),
            fmt(r.get("flex_ms")), fmt(r.get("flex_tflops"), 1), fmt(r.get("ours_over_flex_time"), 2),
            fmt(r.get("torch_dilated_ms")), fmt(r.get("ours_over_torch_dilated_throughput"), 2),
            fmt(gib(r.get("ours_peak_bytes")), 2), fmt(gib(r.get("torch_dilated_peak_bytes")), 2),
            fmt(r.get("ours_over_torch_dilated_peak"), 2),
            fmt(r.get("create_block_mask_ms"), 1) if "create_block_mask_ms" in r
            else (r.get("create_block_mask_error", "-")[:40] if r["group"] == "compile" else "-"),
            fmt(r.get("ours_ok")), fmt(r.get("attnserve_ok"))] + fa4_cells(r)) + " |")
    md = "\n".join(lines) + "\n"
    with open(a.md, "w") as f:
        f.write(md)
    flush()
    print(md)


if __name__ == "__main__":
    main()
