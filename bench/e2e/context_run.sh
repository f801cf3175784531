#!/usr/bin/env bash
# Inference shapes on one GPU host, in one run (issue "inference shapes"): the GPU tests of the
# rect path, chunked prefill against one call at the kernel level (attnbench_prefill), then
# through the service: decode steps against kept contexts of 128K and 1M rows (attnbench_context),
# chunked prefill by appends and attends, and the same sequence as one dense causal Attend.
#
# Usage (on the GPU host, bundle unpacked):  NEW=/path/to/bundle bench/e2e/context_run.sh OUT_DIR
set -u
OUT=${1:?usage: $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
say() { echo "- $*" | tee -a "$SUMMARY"; }
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

for t in ${TESTS:-rect_attention_test device_io_test cuda_device_test}; do
  [ -x "$NEW/bin/$t" ] || { say "$t: not in the bundle"; continue; }
  timeout -k 5 300 "$NEW/bin/$t" --gtest_color=no > "$OUT/$t.log" 2>&1
  say "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$t.log" | tr '\n' ' ' | cut -c1-200)"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -5 >> "$SUMMARY"
done

timeout -k 5 240 "$NEW/bin/attnbench_prefill" --tokens 1048576 --chunk 65536 --q-heads 8 \
  --kv-heads 8 --head-dim 128 --iters 3 --json-out "$OUT/prefill_kernel.json" \
  > "$OUT/prefill_kernel.log" 2>&1
say "attnbench_prefill rc=$?: $(tr '\n' ' ' < "$OUT/prefill_kernel.log" | cut -c1-400)"

source "$(dirname "$0")/start_server.sh"
start_server "$NEW/bin" "$OUT"
for n in 131072 1048576; do
  timeout -k 5 200 "$NEW/bin/attnbench_context" --server "$ADDR" --mode decode \
    --context-tokens $n --append-rows 65536 --q-heads 32 --kv-heads 8 --head-dim 128 \
    --q-lens 1,4,16 --steps ${STEPS:-20} --json-out "$OUT/decode_$n.json" > "$OUT/decode_$n.log" 2>&1
  say "decode $n rc=$?:"; sed 's/^/    /' "$OUT/decode_$n.log" | tee -a "$SUMMARY"
done
timeout -k 5 240 "$NEW/bin/attnbench_context" --server "$ADDR" --mode prefill \
  --context-tokens 1048576 --append-rows 65536 --q-heads 8 --kv-heads 8 --head-dim 128 \
  --json-out "$OUT/prefill_service.json" > "$OUT/prefill_service.log" 2>&1
say "prefill through the service rc=$?: $(tr '\n' ' ' < "$OUT/prefill_service.log")"
for rep in 1 2; do
  timeout -k 5 200 "$NEW/bin/attnctl" run --server "$ADDR" --random 1,1048576,8,8,128 \
    --dtype bf16 --seed $rep --spec '{"dense": {}, "causal": true}' --quiet \
    > "$OUT/one_call_$rep.log" 2>&1
  say "one dense causal call of 1M rows (rep $rep) rc=$?: $(grep -iE 'total|end to end|kernel' "$OUT/one_call_$rep.log" | tr '\n' ' ' | cut -c1-300)"
done
stop_server
cat "$SUMMARY"
