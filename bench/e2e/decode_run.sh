#!/usr/bin/env bash
# Decode steps on one GPU host, in one run: the split-KV decode kernel at the kernel level against
# the memory floor and the prefill kernels (attnbench_decode), side by side with PyTorch SDPA's
# backends and FlashAttention-4 on the same shapes (bench/decode_compare.py), then through the
# service: decode steps against kept contexts of 128K and 1M rows (attnbench_context).
#
# Usage (on the GPU host, bundle unpacked; FA4 installed into FA4_SITE, docs/BENCHMARKS.md):
#   NEW=/path/to/bundle FA4_SITE=/tmp/site bench/e2e/decode_run.sh OUT_DIR
set -u
OUT=${1:?usage: $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
say() { echo "- $*" | tee -a "$SUMMARY"; }
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
SHAPE="--q-heads 32 --kv-heads 8 --head-dim 128"
QL=${Q_LENS:-1,2,4,8,16}  # query rows per decode step

timeout -k 5 300 "$NEW/bin/attnbench_decode" --context-tokens 131072,1048576 --q-lens $QL \
  $SHAPE --iters ${ITERS:-30} --json-out "$OUT/decode_kernel.json" > "$OUT/decode_kernel.log" 2>&1
say "attnbench_decode rc=$?:"; sed 's/^/    /' "$OUT/decode_kernel.log" | tee -a "$SUMMARY"

PYTHONUNBUFFERED=1 timeout -k 5 400 python3 "$HERE/bench/decode_compare.py" \
  --contexts 131072,1048576 --q-lens $QL $SHAPE --iters ${ITERS:-30} \
  --fa4-site "${FA4_SITE:-}" --ours "$OUT/decode_kernel.json" --json-out "$OUT/decode_compare.json" \
  --md-out "$OUT/decode_compare.md" > "$OUT/decode_compare.log" 2>&1
say "decode_compare rc=$?:"; cat "$OUT/decode_compare.md" >> "$SUMMARY" 2>/dev/null
tail -n 30 "$OUT/decode_compare.log"

source "$(dirname "$0")/start_server.sh"
start_server "$NEW/bin" "$OUT"
for n in 131072 1048576; do
  timeout -k 5 200 "$NEW/bin/attnbench_context" --server "$ADDR" --mode decode \
    --context-tokens $n --append-rows 65536 $SHAPE --q-lens $QL --steps ${STEPS:-30} \
    --json-out "$OUT/decode_service_$n.json" > "$OUT/decode_service_$n.log" 2>&1
  say "decode through the service, $n rows, rc=$?:"
  sed 's/^/    /' "$OUT/decode_service_$n.log" | tee -a "$SUMMARY"
done
stop_server
cat "$SUMMARY"
