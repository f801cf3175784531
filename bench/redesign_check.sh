#!/usr/bin/env bash
# One GPU lease that checks a change which must not move the figures: the GPU tests of the new
# build, then the new and the old binaries side by side in the same run (interleaved, so clock or
# thermal drift hits both alike): attnbench_cuda on the kernel cases, and every spec kind through
# the service (attnserve + attnctl run --check on the float64 reference, then timed requests).
#
# Usage (on the GPU host, after unpacking both bundles):
#   NEW=.gpu-bundle OLD=.gpu-bundle-old bench/redesign_check.sh OUT_DIR
# Writes OUT_DIR/summary.md, OUT_DIR/redesign.json and one log per step.
set -u
OUT=${1:?usage: $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
OLD=${OLD:-.gpu-bundle-old}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
say() { echo "- $*" | tee -a "$SUMMARY"; }
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
PARTS=${PARTS:-tests kernel service}  # a subset fits one 10-minute call
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# --- 1. GPU tests of the new build ---------------------------------------------------------------
has tests && for t in flash_sm90_test cuda_attention_test cudnn_sdpa_test cuda_device_test; do
  [ -x "$NEW/bin/$t" ] || { say "$t: not in the bundle"; continue; }
  timeout -k 5 120 "$NEW/bin/$t" --gtest_color=no > "$OUT/$t.log" 2>&1
  say "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$t.log" | tr '\n' ' ' | cut -c1-200)"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -5 >> "$SUMMARY"
done

# --- 2. Kernel figures, old and new interleaved ---------------------------------------------------
CASES=${CASES:-dense_n16384,dense_n16384_causal,sparse_random_s90,sparse_local_window_s90,sparse_random_s99,sparse_local_window_s99}
mkdir -p /tmp/attn_csr
has kernel && for round in 1 2; do
  for side in old new; do
    B=$NEW; [ $side = old ] && B=$OLD
    timeout -k 5 90 "$B/bin/attnbench_cuda" --kernel=auto --cases="$CASES" --warmup=3 --iters=20 \
      --json="$OUT/bench_${side}_$round.json" --md="$OUT/bench_${side}_$round.md" \
      >> "$OUT/bench_$side.log" 2>&1
    say "attnbench_cuda $side round $round rc=$?"
  done
done

# --- 3. Through the service: every spec kind checked, then timed ----------------------------------
SPECS=(
  '{"dense": {}}'
  '{"dense": {}, "causal": true}'
  '{"window": {"size": 300}, "causal": true}'
  '{"dilated": {"segmentLengths": [512, 1024], "dilationRates": [1, 2]}, "causal": true}'
  '{"blockSparse": {"blockSize": 128, "localWindow": {"width": 2}}}'
  '{"blockSparse": {"blockSize": 128, "random": {"keep": 0.2, "seed": "3"}}, "causal": true}'
  '{"blockSparse": {"blockSize": 64, "strided": {"stride": 4, "width": 1}}}'
  '{"blockSparse": {"blockSize": 128, "globalLocal": {"globalBlocks": 1, "width": 1}}}'
  '{"blockSparse": {"blockSize": 128, "dilatedSparse": {"rates": [2, 4]}}}'
)
serve() {  # serve SIDE: starts that side's attnserve on a free port, sets ADDR and PID
  local B=$NEW; [ "$1" = old ] && B=$OLD
  rm -f "$OUT/port_$1"
  "$B/bin/attnserve" --listen 127.0.0.1:0 --port-file "$OUT/port_$1" --metrics-listen "" \
    >> "$OUT/attnserve_$1.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do [ -s "$OUT/port_$1" ] && break; sleep 0.1; done
  ADDR=127.0.0.1:$(cat "$OUT/port_$1" 2>/dev/null)
}
has service && for round in 1 2; do
  for side in old new; do
    B=$NEW; [ $side = old ] && B=$OLD
    serve $side
    k=0
    for spec in "${SPECS[@]}"; do
      k=$((k + 1))
      if [ $round = 1 ]; then
        timeout -k 5 60 "$B/bin/attnctl" run --server "$ADDR" --random 1,2048,8,4,128 --dtype bf16 \
          --seed $k --spec "$spec" --check > "$OUT/check_${side}_$k.log" 2>&1
        grep -q PASS "$OUT/check_${side}_$k.log" && say "$side spec $k: PASS $spec" \
          || say "$side spec $k: FAIL (rc=$?) $spec"
      fi
      for rep in 1 2 3; do
        timeout -k 5 60 "$B/bin/attnctl" run --server "$ADDR" --random 1,16384,16,8,128 \
          --dtype bf16 --seed $rep --spec "$spec" > "$OUT/time_${side}_${round}_${k}_$rep.log" 2>&1
      done
    done
    kill $PID; wait $PID 2>/dev/null
  done
done

# --- 4. Side-by-side table -----------------------------------------------------------------------
python3 - "$OUT" <<'PY' >> "$SUMMARY"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
res = {"kernel": {}, "service": {}}
def load(side):
    per = {}
    for f in sorted(glob.glob(f"{out}/bench_{side}_*.json")):
        try:
            data = json.load(open(f))
        except Exception:
            continue
        for r in data.get("results", []):
            key = f'{r.get("name")} [{r.get("variant")}/{r.get("engine")}/{r.get("flash_kernel")}]'
            per.setdefault(key, []).append(r.get("ms_median"))
    return {c: min(v for v in ms if v) for c, ms in per.items() if any(ms)}
old, new = load("old"), load("new")
print("\n| kernel case | old ms | new ms | new / old |\n|---|---|---|---|")
for c in old:
    if c in new:
        res["kernel"][c] = {"old_ms": old[c], "new_ms": new[c], "ratio": new[c] / old[c]}
        print(f"| {c} | {old[c]:.3f} | {new[c]:.3f} | {new[c] / old[c]:.3f} |")
pat = re.compile(r"total ([0-9.]+) s .*compute ([0-9.]+) s")
print("\n| service spec | old compute s | new compute s | new / old | old total s | new total s |")
print("|---|---|---|---|---|---|")
for k in range(1, 10):
    row = {}
    for side in ("old", "new"):
        tot, comp = [], []
        for f in glob.glob(f"{out}/time_{side}_*_{k}_*.log"):
            m = pat.search(open(f).read())
            if m:
                tot.append(float(m.group(1))); comp.append(float(m.group(2)))
        if comp:
            row[side] = (statistics.median(comp), statistics.median(tot))
    if len(row) == 2:
        (oc, ot), (nc, nt) = row["old"], row["new"]
        res["service"][k] = {"old_compute_s": oc, "new_compute_s": nc, "ratio": nc / oc,
                             "old_total_s": ot, "new_total_s": nt}
        print(f"| {k} | {oc:.4f} | {nc:.4f} | {nc / oc:.3f} | {ot:.3f} | {nt:.3f} |")
json.dump(res, open(f"{out}/redesign.json", "w"), indent=1)
PY
cat "$SUMMARY"
