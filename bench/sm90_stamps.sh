#!/usr/bin/env bash
# Per-tile clock stamps of the sm90 persistent kernel's consumer warpgroups (the ping-pong
# cadence), on the GPU host.
#
# Build a stamped attnbench_cuda here (the stamps cost a few instructions per tile, so never in
# a product build):
#   cmake -S . -B build-stamps -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
#     -DCMAKE_CUDA_FLAGS=-DATTNSERVE_SM90_STAMPS=1 && cmake --build build-stamps -j --target attnbench_cuda
# then, with the bundle unpacked:
#   STAMPED=/path/attnbench_cuda [PLAIN=/path/attnbench_cuda] bench/sm90_stamps.sh OUT
# Per case: <case>.bin (the stamps of the last launch of >= 1024 items: ATTNSERVE_SM90_STAMPS_OUT),
# <case>.md and .summary.json (bench/sm90_stamps.py), and with PLAIN the time of both builds
# without the dump (time_*.json), so that what the stamps cost is on record; all in
# OUT/stamps.tar.gz, the tables also in OUT/summary.md. Only the kernels without
# clusters dump (dense D = 128 runs here with --sm90_key_tile=128 for that reason).
set -u
FINAL=${1:?usage: STAMPED=bin [PLAIN=bin] $0 OUT}
mkdir -p "$FINAL"
OUT=$(mktemp -d)
STAMPED=${STAMPED:?STAMPED: the stamped attnbench_cuda}
CASES=${CASES:-sparse_random_s90 sparse_local_window_s90 sparse_random_s99 dense_n16384:--sm90_key_tile=128}
HERE=$(cd "$(dirname "$0")" && pwd)
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
for spec in $CASES; do
  IFS=: read -r case flags <<< "$spec"
  # shellcheck disable=SC2086
  ATTNSERVE_SM90_STAMPS_OUT="$OUT/$case.bin" timeout -k 5 120 "$STAMPED" --cases="$case" \
    --warmup=2 --iters=3 $(echo "${flags:-}" | tr ',' ' ') > "$OUT/$case.log" 2>&1
  echo "$case stamps rc=$?"
  python3 "$HERE/sm90_stamps.py" "$OUT/$case.bin" --json "$OUT/$case.summary.json" \
    > "$OUT/$case.md" 2>&1
  cat "$OUT/$case.md" | tee -a "$FINAL/summary.md"
  if [ -n "${PLAIN:-}" ]; then
    for b in stamped:"$STAMPED" plain:"$PLAIN"; do
      # shellcheck disable=SC2086
      timeout -k 5 120 "${b#*:}" --cases="$case" --warmup=3 --iters=20 \
        $(echo "${flags:-}" | tr ',' ' ') --json="$OUT/time_${b%%:*}_$case.json" > /dev/null 2>&1
    done
    python3 - "$OUT" "$case" <<'PY'
import json, sys
out, case = sys.argv[1:]
ms = {b: [r['ms_median'] for r in json.load(open(f'{out}/time_{b}_{case}.json'))['results']
          if r['variant'] == 'own'][0] for b in ('stamped', 'plain')}
print(f"{case}: stamped {ms['stamped']:.4f} ms, plain {ms['plain']:.4f} ms, "
      f"ratio {ms['stamped'] / ms['plain']:.3f}")
PY
  fi | tee -a "$FINAL/summary.md"
done
tar -czf "$FINAL/stamps.tar.gz" -C "$OUT" .
rm -rf "$OUT"
