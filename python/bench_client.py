#!/usr/bin/env python3
"""Times large Attend requests from Python, over gRPC chunks and over shared memory.

    python python/bench_client.py --server localhost:50051 --shape 1,262144,8,8,128 \
        --dtype bf16 --spec '{"dense": {}}' --causal --transport grpc,shm --repeat 3 --json

Per transport: a warm-up request (not timed), then --repeat timed ones. Prints end-to-end
seconds (client side: upload, compute, download, conversions), the server's receive / queue /
compute seconds, GB/s of tensor bytes moved (Q + K + V up, O down) and TFLOP/s (the server's
flops over the end-to-end time and over its compute time). --json prints one JSON object, to set
beside `attnctl run` / `attnctl bench --json` figures of the same shape. The inputs are seeded
random; a transport of 'shm' needs the server on this host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import attnserve
from attnserve import Spec


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="localhost:50051")
    p.add_argument("--shape", default="1,262144,8,8,128", help="B,N,Hq,Hkv,D")
    p.add_argument("--kv-len", type=int, default=0, help="K/V tokens (0: N)")
    p.add_argument("--dtype", default="bf16", choices=["f32", "f16", "bf16"])
    p.add_argument("--spec", default='{"dense": {}}', help="AttentionSpec as proto3 JSON")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--lse", action="store_true", help="ask for the LSE too")
    p.add_argument(
        "--transport",
        default="grpc,shm,shared",
        help="comma list of grpc, shm (arrays copied into a pooled region and O out of it), "
        "shared (Client.shared_arrays: inputs made in the region, nothing copied)",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--chunk-bytes", type=int, default=4 << 20)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p.parse_args(argv)


def make_inputs(shape, kv_len: int, dtype: str, seed: int):
    """Seeded standard-normal Q, K, V in the wire dtype (bf16 as uint16 bits), made in slabs
    so a bf16 problem never holds a float32 copy of a whole tensor."""
    b, n, hq, hkv, d = shape
    nkv = kv_len or n
    rng = np.random.default_rng(seed)
    carrier = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dtype]

    def one(tokens, heads):
        out = np.empty((b, tokens, heads, d), dtype=carrier)
        step = max(1, (64 << 20) // (heads * d * 4))
        for bi in range(b):
            for t in range(0, tokens, step):
                x = rng.standard_normal((min(step, tokens - t), heads, d), dtype=np.float32)
                if dtype == "bf16":
                    out[bi, t : t + len(x)] = attnserve.f32_to_bf16_bits(x)
                else:
                    out[bi, t : t + len(x)] = x
        return out

    return one(n, hq), one(nkv, hkv), one(nkv, hkv)


def run_transport(client, transport, q, k, v, spec, args):
    shared = None
    if transport == "shared":
        # Zero copy: the inputs live in a registered region (written there once, as a caller
        # producing them in place would), O and LSE come back in it.
        shared = client.shared_arrays(q.shape, k.shape, dtype=args.dtype)
        shared.q[...] = q
        shared.k[...] = k
        shared.v[...] = v
        q, k, v = shared.q, shared.k, shared.v
    try:
        return _time_transport(client, transport, q, k, v, spec, args)
    finally:
        if shared is not None:
            shared.close()


def _time_transport(client, transport, q, k, v, spec, args):
    kw = dict(dtype=args.dtype, return_lse=args.lse, timeout=args.timeout)
    kw["transport"] = "shm" if transport == "shared" else transport
    for _ in range(args.warmup):
        client.attend(q, k, v, spec, **kw)
    runs = []
    moved = q.nbytes + k.nbytes + v.nbytes + q.nbytes  # Q, K, V up; O down
    for _ in range(args.repeat):
        start = time.perf_counter()
        r = client.attend(q, k, v, spec, **kw)
        seconds = time.perf_counter() - start
        h = r.header
        runs.append(
            {
                "seconds": seconds,
                "receive_seconds": h.receive_seconds,
                "queue_seconds": h.queue_seconds,
                "compute_seconds": h.compute_seconds,
                "copy_seconds": h.copy_seconds,
                "kernel_seconds": h.kernel_seconds,
                "gb_per_s": moved / seconds / 1e9,
                "tflops_end_to_end": h.flops / seconds / 1e12,
                "tflops_compute": h.flops / h.compute_seconds / 1e12 if h.compute_seconds else 0,
                "backend": h.backend,
                "devices": list(h.devices),
            }
        )
        del r
    med = statistics.median(x["seconds"] for x in runs)
    return {"transport": transport, "median_seconds": med, "bytes_moved": moved, "runs": runs}


def main(argv=None) -> int:
    args = parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    if len(shape) != 5:
        raise SystemExit("--shape: expected B,N,Hq,Hkv,D")
    spec = Spec.from_json(args.spec).replace(causal=args.causal or None)
    q, k, v = make_inputs(shape, args.kv_len, args.dtype, args.seed)
    report = {
        "server": args.server,
        "shape": list(shape),
        "kv_len": args.kv_len or shape[1],
        "dtype": args.dtype,
        "spec": spec.to_json(),
        "return_lse": args.lse,
        "repeat": args.repeat,
        "connections": args.connections,
        "chunk_bytes": args.chunk_bytes,
        "results": [],
    }
    with attnserve.Client(
        args.server,
        timeout=args.timeout,
        connections=args.connections,
        chunk_bytes=args.chunk_bytes,
    ) as client:
        for transport in args.transport.split(","):
            res = run_transport(client, transport.strip(), q, k, v, spec, args)
            report["results"].append(res)
            if not args.json:
                r0 = min(res["runs"], key=lambda x: x["seconds"])
                print(
                    f"{res['transport']:>4}: median {res['median_seconds']:.3f} s end to end, "
                    f"best {r0['seconds']:.3f} s = {r0['gb_per_s']:.2f} GB/s moved, "
                    f"{r0['tflops_end_to_end']:.2f} TFLOP/s end to end "
                    f"({r0['tflops_compute']:.2f} on the server's compute of "
                    f"{r0['compute_seconds']:.3f} s; receive {r0['receive_seconds']:.3f} s) "
                    f"on {r0['backend']} {','.join(r0['devices'])}"
                )
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
