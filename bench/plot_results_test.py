#!/usr/bin/env python3
"""Runs bench/plot_results.py headless on the repository's results and checks its PNGs.

Run by python3 without matplotlib, it re-runs itself with the repository's .venv/bin/python when
there is one. Every chart of the committed results must be written (non-empty, under 200 KB), a sweep report
given with --sweep drawn, and a results folder without the files skipped with a message instead
of failing. Exits 77 (ctest's SKIP_RETURN_CODE) when matplotlib or numpy cannot be imported.
"""
import contextlib
import io
import json
import os
import sys
import tempfile

try:
    import matplotlib  # noqa: F401
    import numpy  # noqa: F401
except ImportError as e:
    venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv",
                        "bin", "python")
    if os.path.exists(venv) and os.path.realpath(sys.prefix) != os.path.realpath(
            os.path.dirname(os.path.dirname(venv))):
        os.execv(venv, [venv] + sys.argv)
    print(f"SKIP: {e} (pip install matplotlib numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_results  # noqa: E402

EXPECTED = ["kernels_dense", "kernels_sparse", "decode_compare", "ring_scaling",
            "datapath_split", "decode_service", "bench_concurrency"]
MAX_BYTES = 200 * 1024


def sweep_report(path, mode):
    rows = []
    for i, level in enumerate([1, 2, 4]):
        row = {"requests": 10, "ok": 10, "failed": 0, "dropped": 0, "errors": {},
               "elapsed_s": 1.0, "requests_per_s": 10.0 * level, "bytes_per_s": 1e6 * level,
               "latency_s": {"p50": 0.001 * level, "p90": 0.002 * level, "p99": 0.003 * level,
                             "max": 0.004 * level, "mean": 0.0015 * level, "min": 0.0005}}
        row.update({"target_rate": 10.0 * level, "max_inflight": 8} if mode == "rate"
                   else {"concurrency": level})
        rows.append(row)
    rows[-1]["dropped"] = 2
    doc = {"device": "cpu: test", "date": "2026-11-25T00:00:00Z", "commit": "abc",
           "command": "attnctl bench", "bench": "attnctl bench", "mode": mode,
           "shape": [1, 64, 2, 16], "dtype": "f32", "spec": {"dense": {}}, "backend": "cpu",
           "transport": "grpc", "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f)


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "img")
        sweeps = []
        for mode in ("concurrency", "rate"):
            sweeps.append(os.path.join(tmp, f"report_{mode}.json"))
            sweep_report(sweeps[-1], mode)
        args = ["--out", out]
        for s in sweeps:
            args += ["--sweep", s]
        if plot_results.main(args) != 0:
            failures.append("plot_results.main returned non-zero")
        for name in EXPECTED + ["sweep_report_concurrency", "sweep_report_rate"]:
            path = os.path.join(out, f"{name}.png")
            if not os.path.exists(path):
                failures.append(f"{name}.png not written")
            elif not 0 < os.path.getsize(path) <= MAX_BYTES:
                failures.append(f"{name}.png is {os.path.getsize(path)} bytes")
            else:
                with open(path, "rb") as f:
                    if f.read(8) != b"\x89PNG\r\n\x1a\n":
                        failures.append(f"{name}.png is no PNG")
        # No results at all: every chart skipped with a message, nothing raised.
        empty = os.path.join(tmp, "no_results")
        os.makedirs(empty)
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            code = plot_results.main(["--results", empty, "--out", os.path.join(tmp, "img2")])
        if code != 0 or f"0 charts written, {len(EXPECTED)} skipped" not in text.getvalue():
            failures.append(f"missing results: exit {code}, output {text.getvalue()!r}")
    for f in failures:
        print(f"FAIL: {f}")
    print(f"{1 if not failures else 0} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
