#!/usr/bin/env bash
# A/B of the persistent Hopper kernel's options in one run on one GPU: K/V loads by cp.async or by
# TMA (FlashKernelOptions::sm90_tma), and the D = 64 query tile (--sm90_query_tile 128 / 192).
# (Builds against each other: bench/kernel_ab.sh.) First the sm90 tests (every case with each option,
# outputs poisoned, float64 reference), then attnbench_cuda on the dense and block-sparse
# acceptance cases for each configuration, all configurations twice in turn so that drift shows.
#
# Usage (on the GPU host, bundle unpacked): BIN=/path/to/bundle/bin bench/sm90_ab.sh OUT
#   CONFIGS="cpasync:--sm90_tma=false tma:--sm90_tma=true" (name:flags, space separated) to choose.
set -u
OUT=${1:?usage: $0 OUT_DIR}
BIN=${BIN:-.gpu-bundle/bin}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
echo "# sm90 A/B $(date -u +%FT%TZ)" > "$SUMMARY"
timeout 10 nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv >> "$SUMMARY" 2>&1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

if [ -x "$BIN/flash_sm90_test" ]; then
  timeout -k 5 ${TEST_TIMEOUT:-240} "$BIN/flash_sm90_test" > "$OUT/flash_sm90_test.log" 2>&1
  echo "## flash_sm90_test rc=$?" >> "$SUMMARY"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/flash_sm90_test.log" | head -30 >> "$SUMMARY"
fi

CASES=${CASES:-dense_n16384,dense_n16384_causal,dense_d64_n16384,dense_d64_n16384_causal,sparse_random_s90,sparse_local_window_s90,sparse_random_s99,sparse_local_window_s99}
CONFIGS=${CONFIGS:-"cpasync:--sm90_tma=false tma:--sm90_tma=true tma_q128:--sm90_tma=true,--sm90_query_tile=128"}
for REP in 1 2; do
  for CONFIG in $CONFIGS; do
    NAME="${CONFIG%%:*}_$REP"
    FLAGS=$(echo "${CONFIG#*:}" | tr ',' ' ')
    timeout -k 5 90 "$BIN/attnbench_cuda" --kernel=sm90 --sm90_schedule=persistent $FLAGS \
      --cases="$CASES" --warmup=3 --iters=${ITERS:-20} \
      --json="$OUT/bench_$NAME.json" --md="$OUT/bench_$NAME.md" >> "$OUT/bench.log" 2>&1
    { echo; echo "## attnbench_cuda $FLAGS (rep $REP): rc=$?"
      cat "$OUT/bench_$NAME.md" 2>/dev/null; } >> "$SUMMARY"
  done
done
cat "$SUMMARY"
