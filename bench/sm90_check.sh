#!/usr/bin/env bash
# bench/sm90_check.sh <out_dir>: the Hopper (wgmma) kernel on one GPU (after
# `source .gpu-bundle/env.sh`; binaries in .gpu-bundle/bin, ATTN_BIN_DIR overrides, else
# build-h1/bin). Under 4 minutes in all, every command bounded by `timeout`:
#   1. flash_sm90_test (sm90 forced vs the float64 reference, sm90 vs sm80 at N=16384)
#        -> flash_sm90_test.json (gtest report), flash_sm90_test.log
#   2. attnbench_cuda --kernel=sm80 and --kernel=sm90 on dense N=16384 (B=1, Hq=16, D=128, bf16,
#      causal and not) and block-sparse N=65536 (Hq=16, block 128, 90% / 99% of block pairs
#      skipped, random and local_window)
#        -> bench_sm80.json / .md, bench_sm90.json / .md, bench.log
#   3. summary.md: test verdict, both tables, and per case the sm90 / sm80 time ratio.
set -u
OUT=${1:?usage: bench/sm90_check.sh <out_dir>}
mkdir -p "$OUT"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
[ -x "$BIN/attnbench_cuda" ] || BIN=build-h1/bin
SUMMARY="$OUT/summary.md"
LOG="$OUT/bench.log"
: > "$LOG"
T0=$(date +%s)
echo "# sm90 check $(date -u +%FT%TZ) (bin: $BIN)" > "$SUMMARY"
timeout 10 nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv >> "$SUMMARY" 2>&1

# SASS of the sm90 kernels (HGMMA = wgmma, LDGSTS = cp.async, LDL/STL = spills: expected 0).
if command -v cuobjdump > /dev/null && [ -x "$BIN/flash_sm90_test" ]; then
  timeout 30 cuobjdump --dump-sass "$BIN/flash_sm90_test" 2>/dev/null \
    | awk '/Function : .*FlashFwdSm90Kernel/ {on = 1} /Function : / && !/FlashFwdSm90Kernel/ {on = 0} on' \
    > "$OUT/sm90_sass.txt"
  { echo; echo "SASS (FlashFwdSm90Kernel, all instantiations):"
    for ins in HGMMA WARPGROUP LDGSTS MUFU.EX2 BAR.SYNC LDL STL; do
      printf '%-10s %s\n' "$ins" "$(grep -c "$ins" "$OUT/sm90_sass.txt")"
    done; } >> "$SUMMARY"
fi

# 1. Tests (gtest JSON report).
TEST_RC=missing
if [ -x "$BIN/flash_sm90_test" ]; then
  timeout 120 "$BIN/flash_sm90_test" --gtest_output="json:$OUT/flash_sm90_test.json" \
    > "$OUT/flash_sm90_test.log" 2>&1
  TEST_RC=$?
fi
{
  echo; echo "## flash_sm90_test: rc=$TEST_RC ($(($(date +%s) - T0)) s)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" "$OUT/flash_sm90_test.log" 2>/dev/null | head -40
} >> "$SUMMARY"

# 2. Benchmarks, one process per kernel.
CASES=dense_n16384,dense_n16384_causal,sparse_random_s90,sparse_local_window_s90,sparse_random_s99,sparse_local_window_s99
for K in sm80 sm90; do
  RC=missing
  if [ -x "$BIN/attnbench_cuda" ]; then
    timeout 45 "$BIN/attnbench_cuda" --kernel="$K" --cases="$CASES" --warmup=3 --iters=10 \
      --json="$OUT/bench_$K.json" --md="$OUT/bench_$K.md" >> "$LOG" 2>&1
    RC=$?
  fi
  { echo; echo "## attnbench_cuda --kernel=$K: rc=$RC ($(($(date +%s) - T0)) s)"; cat "$OUT/bench_$K.md" 2>/dev/null; } >> "$SUMMARY"
done

# 3. sm90 / sm80 per case (own rows).
if command -v python3 > /dev/null && [ -f "$OUT/bench_sm80.json" ] && [ -f "$OUT/bench_sm90.json" ]; then
  timeout 20 python3 - "$OUT/bench_sm80.json" "$OUT/bench_sm90.json" >> "$SUMMARY" 2>&1 <<'PY'
import json, sys
def own(path):
    rows = json.load(open(path))["results"]
    return {r["name"]: r for r in rows if r.get("variant") == "own"}
a, b = own(sys.argv[1]), own(sys.argv[2])
print("\n## sm90 vs sm80 (own rows)\n")
print("| case | sm80 ms | sm80 TFLOP/s | sm90 ms | sm90 TFLOP/s | kernel ran | speedup | check ok |")
print("|---|---|---|---|---|---|---|---|")
for name in a:
    if name not in b:
        continue
    x, y = a[name], b[name]
    sp = x["ms_median"] / y["ms_median"] if x["ms_median"] and y["ms_median"] else float("nan")
    print(f"| {name} | {x['ms_median']:.3f} | {x['tflops']:.1f} | {y['ms_median']:.3f} | "
          f"{y['tflops']:.1f} | {x.get('flash_kernel')}/{y.get('flash_kernel')} | {sp:.2f}x | "
          f"{x['check']['ok']}/{y['check']['ok']} |")
PY
fi
{ echo; echo "- total $(($(date +%s) - T0)) s"; } >> "$SUMMARY"
cat "$SUMMARY"
