#!/usr/bin/env bash
# The Python client against attnctl, in one run, on one large request: the same shape, spec and
# dtype through one server, over gRPC chunks and over POSIX shared memory, each the median of
# REPEAT timed requests after a warm-up. Writes attnctl's lines, bench_client.py's JSON and a
# summary with the two ratios we hold the Python client to:
#   shm:  Python end to end / attnctl end to end          (<= 1.1), for Python's zero-copy
#         shared arrays (inputs made in the registered region, as attnctl makes them) and, for
#         reference, its copying shm transport (numpy arrays copied in, O copied out)
#   gRPC: Python bytes/s / attnctl bytes/s (same bytes)   (>= 0.6)
#
# Usage: BIN=build/bin PY=.venv/bin/python bench/e2e/python_client_run.sh OUT_DIR
#   SHAPE=B,N,Hq,Hkv,D (default 1,262144,8,8,128) SPEC=JSON (default a 64-token window: a large
#   request whose compute is small next to its 1.5 GB upload) DTYPE=bf16 REPEAT=3 SERVE_ARGS=...
set -u
OUT=${1:?usage: $0 OUT_DIR}
BIN=${BIN:-build/bin}
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
SHAPE=${SHAPE:-1,262144,8,8,128}
SPEC=${SPEC:-'{"window": {"size": 64}}'}
DTYPE=${DTYPE:-bf16}
REPEAT=${REPEAT:-3}
mkdir -p "$OUT"
source "$HERE/bench/e2e/start_server.sh"
start_server "$BIN" "$OUT"
trap stop_server EXIT

# attnctl: one warm-up and REPEAT timed runs per transport; "total X s" is its end to end.
for t in grpc shm; do
  extra=""; [ $t = shm ] && extra="--shm"
  : > "$OUT/attnctl_$t.log"
  for i in $(seq 0 "$REPEAT"); do
    "$BIN/attnctl" run --server "$ADDR" --random "$SHAPE" --dtype "$DTYPE" --spec "$SPEC" \
      --causal --seed $((i + 1)) $extra >> "$OUT/attnctl_$t.log" 2>&1 || echo "attnctl $t failed" >&2
  done
done
# -P: import the installed package, not the source tree beside the script (no generated stubs).
PYTHONUNBUFFERED=1 "$PY" -P "$HERE/python/bench_client.py" --server "$ADDR" --shape "$SHAPE" \
  --dtype "$DTYPE" --spec "$SPEC" --causal --transport grpc,shm,shared --repeat "$REPEAT" --json \
  > "$OUT/python.json" 2> "$OUT/python.log"

"$PY" - "$OUT" "$SHAPE" "$DTYPE" <<'PYEOF'
import json, re, statistics, sys
out, shape, dtype = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
b, n, hq, hkv, d = shape
es = {"f32": 4, "f16": 2, "bf16": 2}[dtype]
moved = (2 * b * n * hq * d + 2 * b * n * hkv * d) * es  # Q, K, V up and O down
py = {r["transport"]: r["median_seconds"] for r in json.load(open(f"{out}/python.json"))["results"]}
rows, summary = [], {"shape": shape, "dtype": dtype, "bytes_moved": moved}
for t in ("grpc", "shm"):
    totals = [float(m) for m in re.findall(r"timings\s+total ([0-9.]+) s", open(f"{out}/attnctl_{t}.log").read())]
    ctl = statistics.median(totals[1:]) if len(totals) > 1 else float("nan")
    summary[t] = {"attnctl_s": ctl, "python_s": py.get(t), "attnctl_runs_s": totals[1:]}
    rows.append(f"| {t} | {ctl:.3f} s ({moved / ctl / 1e9:.2f} GB/s) | {py[t]:.3f} s ({moved / py[t] / 1e9:.2f} GB/s) |")
summary["shared"] = {"python_s": py.get("shared")}
rows.append(f"| shm, Python shared arrays (zero copy) | (attnctl as above) | {py['shared']:.3f} s ({moved / py['shared'] / 1e9:.2f} GB/s) |")
summary["shm_python_over_attnctl_time"] = summary["shared"]["python_s"] / summary["shm"]["attnctl_s"]
summary["shm_copying_python_over_attnctl_time"] = summary["shm"]["python_s"] / summary["shm"]["attnctl_s"]
summary["grpc_python_over_attnctl_throughput"] = summary["grpc"]["attnctl_s"] / summary["grpc"]["python_s"]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
md = ["| transport | attnctl end to end | Python client end to end |", "|---|---|---|"] + rows
md.append(f"\nshm: Python shared arrays / attnctl time {summary['shm_python_over_attnctl_time']:.3f} (target <= 1.1; "
          f"copying shm {summary['shm_copying_python_over_attnctl_time']:.3f}); "
          f"gRPC: Python / attnctl throughput {summary['grpc_python_over_attnctl_throughput']:.3f} (target >= 0.6)")
open(f"{out}/summary.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PYEOF
