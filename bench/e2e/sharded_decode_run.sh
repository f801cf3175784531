#!/usr/bin/env bash
# Context-parallel decode on a host with two or more GPUs, in one run: the GPU tests of sharded
# contexts (equal to one GPU and to the float64 reference), then attnbench_sharded against one
# server holding the same context on one GPU and split over SHARDS GPUs (latency, throughput
# under concurrency, outputs compared).
#
# Usage (on the GPU host, bundle unpacked; NVLink multicast stays off):
#   NEW=/path/to/bundle [SHARDS=2] [TOKENS=2097152] bench/e2e/sharded_decode_run.sh OUT_DIR
set -u
OUT=${1:?usage: $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
SHARDS=${SHARDS:-2}
TOKENS=${TOKENS:-2097152}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
say() { echo "- $*" | tee -a "$SUMMARY"; }
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/gpus.csv" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1

if [ -x "$NEW/bin/sharded_context_gpu_test" ]; then
  timeout -k 5 300 "$NEW/bin/sharded_context_gpu_test" --gtest_color=no \
    > "$OUT/sharded_context_gpu_test.log" 2>&1
  say "sharded_context_gpu_test rc=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' \
    "$OUT/sharded_context_gpu_test.log" | tr '\n' ' ')"
fi

source "$(dirname "$0")/start_server.sh"
start_server "$NEW/bin" "$OUT"
timeout -k 5 500 "$NEW/bin/attnbench_sharded" --server "$ADDR" --context-tokens "$TOKENS" \
  --shards "$SHARDS" --q-lens ${Q_LENS:-1,4,16} --steps ${STEPS:-30} \
  --concurrency ${CONCURRENCY:-8} --throughput-steps ${TPUT_STEPS:-40} \
  --json-out "$OUT/sharded_decode.json" > "$OUT/sharded_decode.log" 2>&1
say "attnbench_sharded rc=$?:"
sed 's/^/    /' "$OUT/sharded_decode.log" | tee -a "$SUMMARY"
stop_server
grep -E "context|error" "$OUT/attnserve.log" | head -n 20 > "$OUT/attnserve_context_lines.log"
cat "$SUMMARY"
