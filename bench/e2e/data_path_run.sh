#!/usr/bin/env bash
# The request's data path on one GPU host, end to end, in one run (issue "end to end at GPU
# speed"): the ceilings (plain gRPC echo, pinned/pageable copy bandwidth), then attnserve over
# gRPC, the current build next to an older one (OLD, optional), for the three reference requests
# and for `attnctl bench` at concurrency 1, 8 and 16; then over shared memory (--shm) and CUDA IPC
# (--cuda-ipc). Every figure lands in OUT_DIR/data_path.json and OUT_DIR/summary.md.
#
# Usage (on the GPU host, bundles unpacked):
#   NEW=.gpu-bundle OLD=.gpu-bundle-old bench/e2e/data_path_run.sh OUT_DIR
# PARTS picks steps (default "tests wire copy service shm ipc"); BENCH_SECONDS the bench
# duration; SERVE_ARGS extra attnserve flags.
set -u
OUT=${1:?usage: $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
OLD=${OLD:-}
PARTS=${PARTS:-tests wire copy service shm ipc}
SERVE_ARGS=${SERVE_ARGS:-}
BENCH_SECONDS=${BENCH_SECONDS:-8}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
say() { echo "- $*" | tee -a "$SUMMARY"; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

# --- 1. GPU tests of the current build -----------------------------------------------------------
has tests && for t in device_io_test pinned_host_test cuda_device_test cuda_attention_test flash_sm90_test \
    cudnn_sdpa_test; do
  [ -x "$NEW/bin/$t" ] || { say "$t: not in the bundle"; continue; }
  timeout -k 5 150 "$NEW/bin/$t" --gtest_color=no > "$OUT/$t.log" 2>&1
  say "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$t.log" | tr '\n' ' ' | cut -c1-200)"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -5 >> "$SUMMARY"
done

# --- 2. Ceilings ---------------------------------------------------------------------------------
has wire && { timeout -k 5 200 "$NEW/bin/attnbench_echo" --mode=both --bytes 536870912 \
  --chunk-bytes 4194304 --pairs 1,8,16 --json-out "$OUT/echo.json" > "$OUT/echo.log" 2>&1
  say "attnbench_echo rc=$?"; }
has copy && { timeout -k 5 120 "$NEW/bin/attnbench_copy" --json-out "$OUT/copy.json" \
  > "$OUT/copy.log" 2>&1; say "attnbench_copy rc=$?"; }

# --- 3. Through the service ----------------------------------------------------------------------
REQ_NAMES=(dilated_1m sparse_random1_64k gqa_causal_4k)
REQ_SHAPES=(1,1048576,8,8,128 1,65536,16,16,128 1,4096,32,8,128)
REQ_SPECS=(
  '{"dilated": {"segmentLengths": [2048, 4096, 8192, 16384], "dilationRates": [1, 2, 4, 8]}}'
  '{"blockSparse": {"blockSize": 128, "random": {"keep": 0.01, "seed": "1"}}}'
  '{"dense": {}, "causal": true}'
)
serve() {  # serve SIDE BUNDLE: attnserve on free ports; sets ADDR, MADDR, PID
  rm -f "$OUT/port_$1" "$OUT/mport_$1"
  "$2/bin/attnserve" --listen 127.0.0.1:0 --port-file "$OUT/port_$1" \
    --metrics-listen 127.0.0.1:0 --metrics-port-file "$OUT/mport_$1" \
    --max-request-bytes 17179869184 $SERVE_ARGS >> "$OUT/attnserve_$1.log" 2>&1 &
  PID=$!
  for _ in $(seq 200); do [ -s "$OUT/port_$1" ] && break; sleep 0.1; done
  ADDR=127.0.0.1:$(cat "$OUT/port_$1" 2>/dev/null)
  MADDR=127.0.0.1:$(cat "$OUT/mport_$1" 2>/dev/null)
}
scrape() {  # scrape FILE: the server's /metrics
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://$MADDR/metrics', timeout=5).read().decode())" > "$1" 2>/dev/null
}
run_side() {  # run_side SIDE BUNDLE TRANSPORT(grpc|shm|ipc)
  local side=$1 B=$2 tr=$3 extra=""
  [ "$tr" = shm ] && extra="--shm"
  [ "$tr" = ipc ] && extra="--cuda-ipc --cuda-device 0"
  serve "${side}_$tr" "$B"
  for i in 0 1 2; do
    local n=${REQ_NAMES[$i]}
    timeout -k 5 60 "$B/bin/attnctl" run --server "$ADDR" $extra --random 1,2048,8,4,128 \
      --dtype bf16 --seed 7 --spec "${REQ_SPECS[$i]}" --check > "$OUT/check_${side}_${tr}_$n.log" 2>&1
    grep -q PASS "$OUT/check_${side}_${tr}_$n.log" && say "$side $tr $n check: PASS" \
      || say "$side $tr $n check: FAIL"
    for rep in 1 2 3; do
      timeout -k 5 120 "$B/bin/attnctl" run --server "$ADDR" $extra --random "${REQ_SHAPES[$i]}" \
        --dtype bf16 --seed $rep --spec "${REQ_SPECS[$i]}" --quiet \
        > "$OUT/run_${side}_${tr}_${n}_$rep.log" 2>&1 || say "$side $tr $n rep $rep rc=$?"
    done
  done
  for c in 1 8 16; do
    timeout -k 5 $((BENCH_SECONDS + 90)) "$B/bin/attnctl" bench --server "$ADDR" $extra \
      --random 1,4096,32,8,128 --dtype bf16 --spec '{"dense": {}, "causal": true}' \
      --concurrency $c --duration ${BENCH_SECONDS}s --json > "$OUT/bench_${side}_${tr}_c$c.json" \
      2> "$OUT/bench_${side}_${tr}_c$c.err" || say "$side $tr bench c$c rc=$?"
  done
  scrape "$OUT/metrics_${side}_$tr.txt"
  kill $PID; wait $PID 2>/dev/null
}
if has service; then
  [ -n "$OLD" ] && run_side old "$OLD" grpc
  run_side new "$NEW" grpc
fi
for tr in shm ipc; do
  has $tr || continue
  if "$NEW/bin/attnctl" run --help 2>&1 | grep -q -- "--shm"; then
    run_side new "$NEW" $tr
  else
    say "$tr: this attnctl has no region transports"
  fi
done

# --- 4. Summary ----------------------------------------------------------------------------------
python3 "$(dirname "$0")/data_path_summary.py" "$OUT" >> "$SUMMARY"
cat "$SUMMARY"
