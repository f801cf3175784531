#!/usr/bin/env python3
"""Checks bench/engine_table.py without a GPU: the built-in table of core/cuda/engine_table.cc is
what it prints for the committed H200 results, and on a made-up attnbench_cuda JSON it pairs the
own and cuDNN rows, leaves out (and says why) the cases it cannot pair, and refuses a case given
twice. Standard library only.
"""
import contextlib
import io
import json
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import engine_table  # noqa: E402

H200_RUN = "bench/results/h200-2026-11-29-kernel19/d-engine-table"
H200_FILES = ("bench_1.json", "bench_2.json", "bench_3.json")  # the built-in rows: their means
FAILURES = []


def expect(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def builtin_lines():
    """The CSV lines of kBuiltinCsv in core/cuda/engine_table.cc (adjacent string literals)."""
    with open(os.path.join(ROOT, "core/cuda/engine_table.cc")) as f:
        src = f.read()
    m = re.search(r"kBuiltinCsv\[\]\s*=(.*?);", src, re.S)
    text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))).replace("\\n", "\n")
    return [line for line in text.split("\n") if line]


def row(name, variant, engine, ms, spec="dense", dtype="bf16", d=128, n=4096, causal=False,
        error="", ok=True, note=""):
    return {"name": name, "variant": variant, "engine": engine, "spec": spec, "dtype": dtype,
            "head_dim": d, "tokens": n, "causal": causal, "ms_median": ms, "error": error,
            "note": note, "check": {"ok": ok, "error": ""}}


def made_up_report():
    return {"device": "NVIDIA H100 80GB HBM3", "results": [
        row("a", "own", "flash_fwd", 1.0), row("a", "attnserve", "cudnn", 2.0),
        row("b", "own", "flash_fwd", 3.0, spec="window/causal", causal=True, n=65536, d=64),
        row("b", "attnserve", "cudnn", 2.5, spec="window/causal", causal=True, n=65536, d=64),
        row("c", "own", "flash_fwd", 1.0), row("c", "attnserve", "flash_fwd", 1.0,
                                               note="cuDNN has no engine"),
        row("d", "own", "flash_fwd", 1.0, error="out of memory"),
        row("d", "attnserve", "cudnn", 2.0),
        row("e", "own", "flash_fwd", 1.0, dtype="f32"), row("e", "attnserve", "cudnn", 2.0,
                                                            dtype="f32"),
        row("f", "own", "flash_fwd", 1.0, spec="block_sparse/random/b128/keep=0.1"),
        row("g", "attnserve", "cudnn", 2.0, dtype="f16"),
        row("h", "own", "flash_fwd", 1.0, dtype="f16"),
        row("h", "attnserve", "cudnn", 2.0, dtype="f16", ok=False),
    ]}


def main():
    # The built-in table's rows of the H200 run are exactly what the converter prints for it.
    lines = engine_table.table_lines([os.path.join(ROOT, H200_RUN, f) for f in H200_FILES],
                                     source=H200_RUN, header=False, log=io.StringIO(), mean=True)
    builtin = builtin_lines()
    expect(builtin[0] == engine_table.HEADER, f"built-in header: {builtin[0]!r}")
    expect(sorted(line for line in builtin[1:] if line.endswith(H200_RUN)) == sorted(lines),
           f"built-in H200 rows {builtin[1:]} != converter {lines}")
    expect(len(lines) == 8, f"8 H200 rows, got {lines}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        with open(path, "w") as f:
            json.dump(made_up_report(), f)
        log = io.StringIO()
        lines = engine_table.table_lines([path], log=log)
        expect(lines == [
            engine_table.HEADER,
            f"NVIDIA H100 80GB HBM3,bf16,64,true,window,65536,3,2.5,{tmp}",
            f"NVIDIA H100 80GB HBM3,bf16,128,false,dense,4096,1,2,{tmp}",
        ], f"made-up rows: {lines}")
        skipped = log.getvalue()
        for case, why in (("c", "the attnserve row ran flash_fwd (cuDNN has no engine)"),
                          ("d", "error: out of memory"), ("e", "dtype f32"),
                          ("g", "no own row"), ("h", "check failed")):
            expect(f"skipped {case}: {why}" in skipped, f"{case} skipped ({why}): {skipped}")
        expect("skipped f" not in skipped, f"block-sparse cases are skipped silently: {skipped}")

        lines = engine_table.table_lines([path], gpu="X", source="runs/1", header=False,
                                         log=io.StringIO())
        expect(lines[0] == "X,bf16,64,true,window,65536,3,2.5,runs/1", f"--gpu/--source: {lines}")

        # The same case twice (two files of one GPU): an error naming both files.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = engine_table.main([path, path])
        expect(rc == 1 and "is also in" in err.getvalue(), f"duplicate: rc {rc}, {err.getvalue()}")
        # Repeated runs with --mean: one row per case, the mean of the times.
        doc = made_up_report()
        for r in doc["results"]:
            r["ms_median"] = r["ms_median"] * 3
        path2 = os.path.join(tmp, "bench_2.json")
        with open(path2, "w") as f:
            json.dump(doc, f)
        lines = engine_table.table_lines([path, path2], source="runs", header=False,
                                         log=io.StringIO(), mean=True)
        expect(lines == ["NVIDIA H100 80GB HBM3,bf16,64,true,window,65536,6,5,runs",
                         "NVIDIA H100 80GB HBM3,bf16,128,false,dense,4096,2,4,runs"],
               f"--mean rows: {lines}")
        # No GPU name anywhere.
        with open(path, "w") as f:
            json.dump({"results": []}, f)
        with contextlib.redirect_stderr(err):
            rc = engine_table.main([path])
        expect(rc == 1 and "--gpu" in err.getvalue(), f"no device: rc {rc}")

    if FAILURES:
        print(f"engine_table_test: {len(FAILURES)} failure(s)")
        return 1
    print("engine_table_test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
