#!/usr/bin/env python3
"""PyTorch + NCCL ring attention, the reference point for attnbench_ring.

Launch: torchrun --nproc_per_node=2 bench/compare_torch_ring.py --json=OUT.json

Same shapes as attnbench_ring: bf16, B=1, Hq=Hkv=8, D=128, dense, non-causal (contiguous split)
and causal (zigzag split: 2P chunks, rank p holds chunks p and 2P-1-p). Each step runs
torch.ops.aten._scaled_dot_product_flash_attention (FlashAttention-2, returns the logsumexp) on
every (query chunk, key chunk) pair that admits anything (a key chunk before the query chunk:
full; the same chunk: causal; after: skipped) and merges into float32 O/LSE accumulators with the
LSE rule; the K/V shard for the next step travels over torch.distributed P2P (batch_isend_irecv)
while the step computes.

T1: SDPA flash on the full sequence on rank 0 (the other ranks wait). T2: the ring's wall time
(barrier, run, cuda synchronize, barrier). Median of --reps runs after --warmup. Efficiency =
T1 / (P * T2). Check: rank 0's ring rows against T1's output (max |dO| / max |O|).
NVLink multicast stays off: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are forced
before torch.distributed starts.
"""
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def flash(q, k, v, causal):
    """q/k/v [B, H, N, D] -> (O [B, H, N, D] bf16, LSE [B, H, N] f32)."""
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    return out[0], out[1]


def merge(acc_o, acc_lse, o, lse):
    """LSE-merge (o, lse) into the f32 accumulators in place. acc_lse starts at -inf."""
    new_lse = torch.logaddexp(acc_lse, lse)
    w_acc = torch.exp(acc_lse - new_lse).unsqueeze(-1)
    w_new = torch.exp(lse - new_lse).unsqueeze(-1)
    acc_o.mul_(w_acc).add_(o.float() * w_new)
    acc_lse.copy_(new_lse)


def split(n, ranks, causal, unit=128):
    """Per rank, the [begin, end) ranges it holds (as ring.h's SplitSequence)."""
    parts = 2 * ranks if causal else ranks
    units = (n + unit - 1) // unit
    bounds, pos = [], 0
    for i in range(parts):
        u = units // parts + (1 if i < units % parts else 0)
        end = min(n, pos + u * unit)
        bounds.append((pos, end))
        pos = end
    if causal:
        return [[bounds[p], bounds[2 * ranks - 1 - p]] for p in range(ranks)]
    return [[bounds[p]] for p in range(ranks)]


def ring_attention(q_local, kv_local, ranges, causal, rank, world):
    """q_local [B, H, nl, D] (ranges concatenated), kv_local [2, B, H, nl, D]."""
    nl = q_local.shape[2]
    acc_o = torch.zeros(q_local.shape, dtype=torch.float32, device=q_local.device)
    acc_lse = torch.full(q_local.shape[:3], float("-inf"), dtype=torch.float32,
                         device=q_local.device)
    cur = kv_local
    for t in range(world):
        src = (rank - t) % world
        reqs = None
        if t + 1 < world:
            nxt_src = (src - 1) % world
            n_next = sum(e - b for b, e in ranges[nxt_src])
            recv = torch.empty((2,) + tuple(kv_local.shape[1:3]) + (n_next, kv_local.shape[4]),
                               dtype=kv_local.dtype, device=kv_local.device)
            ops = [dist.P2POp(dist.isend, cur.contiguous(), (rank + 1) % world),
                   dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
            reqs = dist.batch_isend_irecv(ops)
        q_off = 0
        for (qb, qe) in ranges[rank]:
            k_off = 0
            for (kb, ke) in ranges[src]:
                if qe > qb and ke > kb:
                    if not causal or ke <= qb:
                        kind = False  # full
                    elif kb == qb and ke == qe:
                        kind = True   # diagonal: causal on equal chunks
                    else:
                        kind = None   # after the query chunk: nothing admitted
                    if kind is not None:
                        o, lse = flash(q_local[:, :, q_off:q_off + qe - qb],
                                       cur[0][:, :, k_off:k_off + ke - kb],
                                       cur[1][:, :, k_off:k_off + ke - kb], kind)
                        merge(acc_o[:, :, q_off:q_off + qe - qb],
                              acc_lse[:, :, q_off:q_off + qe - qb], o, lse)
                k_off += ke - kb
            q_off += qe - qb
        if reqs is not None:
            for r in reqs:
                r.wait()
            cur = recv
    assert q_off == nl
    return acc_o.to(q_local.dtype), acc_lse


def write_json(path, cases, world, h, d, reps, start, dev):
    """Rewritten after every case, so a run cut short by a timeout keeps its results."""
    out = {"bench": "compare_torch_ring", "device": torch.cuda.get_device_name(dev),
           "gpus": world, "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "dtype": "bf16", "heads": h, "head_dim": d, "reps": reps,
           "sdpa": "aten._scaled_dot_product_flash_attention", "cases": cases,
           "wall_s": time.perf_counter() - start}
    text = json.dumps(out, indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return text


def timed(fn, warmup, reps, barrier=True):
    times = []
    for it in range(warmup + reps):
        if barrier:
            dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if barrier:
            dist.barrier()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="262144,524288")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--budget_s", type=float, default=120.0,
                    help="skip cases that would start after this many seconds")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    start = time.perf_counter()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    try:
        dist.init_process_group("nccl", device_id=dev)
    except TypeError:  # torch < 2.3 has no device_id
        dist.init_process_group("nccl")
    h, d = args.heads, args.dim
    cases = []
    for n in [int(x) for x in args.ns.split(",") if x]:
        for causal in (False, True):
            skip = torch.tensor([1 if time.perf_counter() - start > args.budget_s else 0],
                                device=dev)
            dist.broadcast(skip, 0)  # every rank takes the same decision
            if skip.item():
                cases.append({"n": n, "causal": causal, "skipped": "budget"})
                continue
            g = torch.Generator(device=dev).manual_seed(1234)
            # Full tensors are generated identically on every rank (same seed); each keeps its
            # shard. [B, H, N, D] is SDPA's layout.
            q = torch.rand((1, h, n, d), generator=g, device=dev, dtype=torch.float32)
            q = (q * 2 - 1).to(torch.bfloat16)
            k = ((torch.rand((1, h, n, d), generator=g, device=dev) * 2 - 1)).to(torch.bfloat16)
            v = ((torch.rand((1, h, n, d), generator=g, device=dev) * 2 - 1)).to(torch.bfloat16)
            ranges = split(n, world, causal)
            idx = torch.cat([torch.arange(b, e, device=dev) for b, e in ranges[rank]])
            q_local = q.index_select(2, idx).contiguous()
            kv_local = torch.stack([k.index_select(2, idx), v.index_select(2, idx)]).contiguous()

            t1 = []
            o_full = None
            if rank == 0:
                t1 = timed(lambda: flash(q, k, v, causal), args.warmup, args.reps, barrier=False)
                o_full = flash(q, k, v, causal)[0]
            dist.barrier()
            if rank != 0:
                del q, k, v
            result = {}

            def run():
                result["o"], result["lse"] = ring_attention(q_local, kv_local, ranges, causal,
                                                            rank, world)

            t2 = timed(run, args.warmup, args.reps)
            check = None
            if rank == 0:
                ref = o_full.index_select(2, idx).float()
                check = float((result["o"].float() - ref).abs().max() / ref.abs().max())
            peak = torch.cuda.max_memory_allocated(dev)
            peaks = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
            dist.all_gather(peaks, torch.tensor([peak], dtype=torch.int64, device=dev))
            torch.cuda.reset_peak_memory_stats(dev)
            if rank == 0:
                flops = 4.0 * h * d * (n * (n + 1) / 2 if causal else n * n)
                T1, T2 = statistics.median(t1), statistics.median(t2)
                c = {"n": n, "causal": causal, "t1_s": T1, "t2_s": T2,
                     "efficiency": T1 / (world * T2), "t1_tflops": flops / T1 / 1e12,
                     "t2_tflops": flops / T2 / 1e12, "t1_runs_s": t1, "t2_runs_s": t2,
                     "check_o_rel_rank0": check,
                     "peak_bytes_per_gpu": [int(p.item()) for p in peaks]}
                cases.append(c)
                print(json.dumps(c), flush=True)
                write_json(args.json, cases, world, h, d, args.reps, start, dev)
            del q_local, kv_local, result, o_full
            torch.cuda.empty_cache()
    if rank == 0:
        print(write_json(args.json, cases, world, h, d, args.reps, start, dev))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
