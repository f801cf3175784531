#!/usr/bin/env bash
# The service's GPU ring on 2 GPUs, end to end, in under 3 minutes: attnserve (--backend cuda
# --devices 0,1) and attnctl from .gpu-bundle/bin (ATTN_BIN_DIR overrides), run from the
# repository root after `source .gpu-bundle/env.sh`. Two ring requests in a row, each checked
# against the float64 reference (attnctl run --check), then /metrics:
#   - attnserve_nccl_groups_created_total == 1 and attnserve_nccl_communicators_created_total
#     == 1 per device (the second ring reused the first one's communicators; the log says
#     "new NCCL group" once);
#   - attnserve_device_memory_peak_bytes > 0 on cuda:0 and cuda:1, within 10% of each other (each
#     rank ran on its own device's worker and allocator); tokens, busy seconds and NCCL bytes
#     moved on both.
# Usage: bench/service_ring_check.sh OUT_DIR   (writes attnserve.log, attnctl.log, metrics.txt,
# summary.md there; exit 0 only when every check passed).
set -u
OUT=${1:?usage: bench/service_ring_check.sh OUT_DIR}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
FAILED=0
fail() { echo "FAIL: $*" | tee -a "$OUT/summary.md"; FAILED=1; }
pass() { echo "PASS: $*" | tee -a "$OUT/summary.md"; }
: > "$OUT/summary.md"
rm -f "$OUT/port" "$OUT/mport"

# ATTN_DEVICES: the GPUs to serve (default 0,1); every check below covers each of them.
DEVICES=${ATTN_DEVICES:-0,1}
DEVLIST=$(echo "$DEVICES" | sed 's/\([0-9]\+\)/cuda:\1/g; s/,/, /g')
export ATTN_DEVLIST="$DEVLIST"
stamp "start attnserve --backend cuda --devices $DEVICES"
timeout -k 5 170 "$BIN/attnserve" --backend cuda --devices "$DEVICES" --listen 127.0.0.1:0 \
  --port-file "$OUT/port" --metrics-listen 127.0.0.1:0 --metrics-port-file "$OUT/mport" \
  > "$OUT/attnserve.log" 2>&1 &
SPID=$!
for _ in $(seq 1 150); do
  [ -s "$OUT/port" ] && [ -s "$OUT/mport" ] && break
  kill -0 $SPID 2>/dev/null || break
  sleep 0.2
done
if [ ! -s "$OUT/port" ] || [ ! -s "$OUT/mport" ]; then
  fail "attnserve did not start within 30 s (see attnserve.log)"
  kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null
  tail -20 "$OUT/attnserve.log"
  exit 1
fi
ADDR=127.0.0.1:$(cat "$OUT/port")
MPORT=$(cat "$OUT/mport")

: > "$OUT/attnctl.log"
for i in 1 2; do
  stamp "ring request $i"
  timeout -k 5 40 "$BIN/attnctl" run --server "$ADDR" --random 1,2048,8,4,128 --dtype bf16 \
    --seed $((10 + i)) --spec '{"dense": {}, "causal": true}' --placement ring --check \
    > "$OUT/run$i.log" 2>&1
  rc=$?
  cat "$OUT/run$i.log" >> "$OUT/attnctl.log"; echo "rc=$rc" >> "$OUT/attnctl.log"
  if [ $rc -ne 0 ]; then fail "ring request $i: attnctl rc=$rc"; continue; fi
  grep -q "placement ring" "$OUT/run$i.log" || fail "ring request $i: response placement is not ring"
  grep -q "$DEVLIST" "$OUT/run$i.log" || fail "ring request $i: devices are not $DEVLIST"
  grep -q "PASS" "$OUT/run$i.log" && pass "ring request $i matches the reference" \
    || fail "ring request $i: --check did not pass"
done

# Every spec kind through the ring placement, checked against the reference; the dilated one has
# a segment as long as the sequence (longer than a shard), so it runs as the dilated composition
# (local parts + rings over gathered positions) rather than shard-locally.
k=0
for spec in '{"dense": {}}' '{"window": {"size": 300}, "causal": true}' \
    '{"blockSparse": {"blockSize": 128, "random": {"keep": 0.2, "seed": "3"}}, "causal": true}' \
    '{"dilated": {"segmentLengths": [512, 1024], "dilationRates": [1, 2]}, "causal": true}' \
    '{"dilated": {"segmentLengths": [512, 2048], "dilationRates": [1, 2]}}'; do
  k=$((k + 1))
  stamp "ring request, spec $spec"
  timeout -k 5 40 "$BIN/attnctl" run --server "$ADDR" --random 1,2048,8,4,128 --dtype bf16 \
    --seed $((20 + k)) --spec "$spec" --placement ring --check > "$OUT/spec$k.log" 2>&1
  rc=$?
  { echo "### $spec"; cat "$OUT/spec$k.log"; echo "rc=$rc"; } >> "$OUT/attnctl.log"
  if [ $rc -eq 0 ] && grep -q "PASS" "$OUT/spec$k.log"; then
    pass "ring request $spec matches the reference ($(grep -o 'placement [a-z]*' "$OUT/spec$k.log" | head -1))"
  else
    fail "ring request $spec: rc=$rc"
  fi
done
# A long causal ring request (timing only; attnbench_ring compares one GPU with the ring). No
# single-GPU request here: it would raise one GPU's peak and the balance check below is about rings.
for placement in ring; do
  stamp "N=262144 causal, placement $placement"
  timeout -k 5 60 "$BIN/attnctl" run --server "$ADDR" --random 1,262144,8,8,128 --dtype bf16 \
    --seed 5 --spec '{"dense": {}, "causal": true}' --placement $placement \
    > "$OUT/long_$placement.log" 2>&1
  echo "N=262144 $placement rc=$?: $(grep -iE 'placement|seconds|ms' "$OUT/long_$placement.log" | head -3 | tr '\n' ' ')" \
    | tee -a "$OUT/summary.md"
done
stamp "scrape /metrics"
timeout 15 python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
  "http://127.0.0.1:$MPORT/metrics" > "$OUT/metrics.txt" 2>&1 || fail "could not scrape /metrics"
kill -TERM $SPID 2>/dev/null
for _ in $(seq 1 50); do kill -0 $SPID 2>/dev/null || break; sleep 0.2; done
kill -KILL $SPID 2>/dev/null
wait $SPID 2>/dev/null

timeout 15 python3 - "$OUT/metrics.txt" >> "$OUT/summary.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def sample(name, **labels):
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$', line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None
bad = 0
def check(ok, what):
    global bad
    print(("PASS: " if ok else "FAIL: ") + what)
    bad += 0 if ok else 1
g = sample("attnserve_nccl_groups_created_total")
check(g == 1, f"attnserve_nccl_groups_created_total = {g} (1: the second ring reused the group)")
peaks = {}
import os
for d in os.environ.get("ATTN_DEVLIST", "cuda:0, cuda:1").split(", "):
    c = sample("attnserve_nccl_communicators_created_total", device=d)
    check(c == 1, f"attnserve_nccl_communicators_created_total{{device={d}}} = {c} (1: reused)")
    p = sample("attnserve_device_memory_peak_bytes", device=d) or 0
    peaks[d] = p
    check(p > 0, f"attnserve_device_memory_peak_bytes{{device={d}}} = {p:.0f}")
    t = sample("attnserve_device_tokens_total", device=d) or 0
    check(t > 0, f"attnserve_device_tokens_total{{device={d}}} = {t:.0f}")
    b = sample("attnserve_device_busy_seconds_total", device=d) or 0
    check(b > 0, f"attnserve_device_busy_seconds_total{{device={d}}} = {b:.3f}")
    s = sample("attnserve_nccl_bytes_total", device=d, direction="send") or 0
    check(s > 0, f"attnserve_nccl_bytes_total{{device={d},direction=send}} = {s:.0f}")
hi, lo = max(peaks.values()), min(peaks.values())
ratio = (hi - lo) / hi if hi > 0 else 1.0
check(hi > 0 and ratio <= 0.10, f"peak imbalance (max - min) / max = {ratio:.3f} (<= 0.10)")
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || FAILED=1
n=$(grep -c "new NCCL group" "$OUT/attnserve.log")
[ "$n" -eq 1 ] && pass "log: 'new NCCL group' once" || fail "log: 'new NCCL group' $n times (want 1)"
n=$(grep -c "NCCL communicator rank" "$OUT/attnserve.log")
NDEV=$(echo "$DEVICES" | tr ',' '\n' | wc -l)
[ "$n" -eq "$NDEV" ] && pass "log: $NDEV communicators created" || fail "log: $n communicators created (want $NDEV)"
stamp "done, failed=$FAILED"
cat "$OUT/summary.md"
exit $FAILED
