#!/usr/bin/env python3
"""Engine table rows (core/cuda/engine_table.h) from attnbench_cuda results.

  bench/engine_table.py [--gpu NAME] [--source DIR] [--no-header] [--mean] BENCH.json [...]

For each dense or window case of the files, pairs the "own" row (our kernel) with the "attnserve"
row that ran cuDNN (engine "cudnn") and prints one CSV row of the server's engine table. Run
attnbench_cuda with ATTNSERVE_ATTENTION_ENGINE=cudnn for this: in the default (auto) mode its
attnserve row follows the built-in table, as the server does, and is our kernel again wherever
the table already chose it. The row:

  gpu,dtype,head_dim,causal,pattern,tokens,own_ms,cudnn_ms,source

gpu is --gpu, else the file's "device" (cudaDeviceProp::name, as the server matches it); source is
--source, else the file's directory. Times are the rows' ms_median. A case is left out, with the
reason on stderr, when a row is missing or failed (error or check), when the attnserve row did not
run cuDNN, or when its dtype is f32 (the table has bf16/f16 rows; f32 requests use the bf16 ones).
Block-sparse and dilated cases have no cuDNN row and are skipped silently. Two rows for the same
case (gpu, dtype, head_dim, causal, pattern, tokens) are an error: the server refuses such a table;
with --mean the files are repeated runs and each case gets one row of mean times.
Append the output (with --no-header) to the built-in table in core/cuda/engine_table.cc or write
it to a file for `attnserve --engine-table FILE`. Standard library only.
"""
import argparse
import json
import os
import sys

HEADER = "gpu,dtype,head_dim,causal,pattern,tokens,own_ms,cudnn_ms,source"
PATTERNS = ("dense", "window")


def _failed(r):
    if r.get("error"):
        return f"error: {r['error']}"
    check = r.get("check") or {}
    if check and not check.get("ok", False):
        return "check failed" + (f": {check['error']}" if check.get("error") else "")
    if not r.get("ms_median") or r["ms_median"] <= 0:
        return "no time"
    return None


def rows_from_report(doc, gpu=None, source=""):
    """(rows, skipped): the table rows of one attnbench_cuda JSON document (dicts with the table's
    columns), and "case: reason" lines for the cases left out."""
    gpu = gpu or doc.get("device") or ""
    if not gpu or gpu == "unknown":
        raise ValueError("no GPU name: the file has no 'device'; pass --gpu")
    cases = {}  # name -> {"own": row, "attnserve": row}, in file order
    for r in doc.get("results", []):
        cases.setdefault(r["name"], {})[r.get("variant", "")] = r
    rows, skipped = [], []
    for name, by_variant in cases.items():
        own, served = by_variant.get("own"), by_variant.get("attnserve")
        ref = own or served
        pattern = ref.get("spec", "").split("/")[0]
        if pattern not in PATTERNS:
            continue
        if own is None or served is None:
            skipped.append(f"{name}: no {'own' if own is None else 'attnserve'} row")
            continue
        if served.get("engine") != "cudnn":
            note = served.get("note") or ""
            skipped.append(f"{name}: the attnserve row ran {served.get('engine')}"
                           + (f" ({note})" if note else ""))
            continue
        why = _failed(own) or _failed(served)
        if why:
            skipped.append(f"{name}: {why}")
            continue
        if own["dtype"] not in ("bf16", "f16"):
            skipped.append(f"{name}: dtype {own['dtype']} (the table has bf16 and f16 rows)")
            continue
        rows.append({"gpu": gpu, "dtype": own["dtype"], "head_dim": int(own["head_dim"]),
                     "causal": bool(own["causal"]), "pattern": pattern,
                     "tokens": int(own["tokens"]), "own_ms": float(own["ms_median"]),
                     "cudnn_ms": float(served["ms_median"]), "source": source})
    return rows, skipped


def case_key(row):
    return (row["gpu"], row["dtype"], row["head_dim"], row["causal"], row["pattern"],
            row["tokens"])


def csv_line(row):
    for col in ("gpu", "source"):
        if "," in row[col] or "\n" in row[col]:
            raise ValueError(f"{col} {row[col]!r}: the table's fields hold no comma or newline")
    return ",".join([row["gpu"], row["dtype"], str(row["head_dim"]),
                     "true" if row["causal"] else "false", row["pattern"], str(row["tokens"]),
                     f"{row['own_ms']:.6g}", f"{row['cudnn_ms']:.6g}", row["source"]])


def table_lines(paths, gpu=None, source=None, header=True, log=None, mean=False):
    """The CSV lines for the files, sorted by case; ValueError for a case given twice, unless
    `mean`: then the rows of a case (repeated runs of the same cases) become one row with the
    mean own and cuDNN times, which is what the server decides on. The cases left out are listed
    on `log` (default: stderr)."""
    log = log or sys.stderr
    seen = {}  # case key -> the file it came from
    rows = []
    repeats = {}  # case key -> the rows of that case (mean)
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        src = source if source is not None else os.path.normpath(os.path.dirname(path) or ".")
        file_rows, skipped = rows_from_report(doc, gpu, src)
        for s in skipped:
            print(f"{path}: skipped {s}", file=log)
        for row in file_rows:
            key = case_key(row)
            if mean:
                repeats.setdefault(key, []).append(row)
                continue
            if key in seen:
                raise ValueError(f"{path}: case {key} is also in {seen[key]}; keep one of them "
                                 "(or --mean)")
            seen[key] = path
            rows.append(row)
    for group in repeats.values():
        row = dict(group[0])
        row["own_ms"] = sum(r["own_ms"] for r in group) / len(group)
        row["cudnn_ms"] = sum(r["cudnn_ms"] for r in group) / len(group)
        rows.append(row)
    rows.sort(key=case_key)
    return ([HEADER] if header else []) + [csv_line(r) for r in rows]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_json", nargs="+", help="attnbench_cuda --json outputs")
    p.add_argument("--gpu", help="GPU model as cudaDeviceProp::name reports it (default: the "
                   "file's 'device')")
    p.add_argument("--source", help="the source column: the results directory (default: each "
                   "file's directory)")
    p.add_argument("--no-header", action="store_true", help="rows only (to append to a table)")
    p.add_argument("--mean", action="store_true", help="files are repeated runs of the same cases: "
                   "one row per case with the mean times (else a case in two files is an error)")
    a = p.parse_args(argv)
    try:
        lines = table_lines(a.bench_json, a.gpu, a.source, header=not a.no_header, mean=a.mean)
    except (OSError, ValueError, KeyError) as e:
        print(f"engine_table: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
