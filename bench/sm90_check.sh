#!/usr/bin/env bash
# bench/sm90_check.sh <out_dir>: the Hopper (wgmma) kernel on one GPU (after
# `source .gpu-bundle/env.sh`; binaries in .gpu-bundle/bin, ATTN_BIN_DIR overrides, else
# build-h1/bin). Typically ~2 minutes, every command bounded by `timeout` (worst case, every
# command timing out: 2 x 120 + 3 x 45 s = 6.25 minutes):
#   1. flash_sm90_test (sm90 forced vs the float64 reference, and sm90 vs sm80 at N=16384), once
#      per sm90 variant -> flash_sm90_test_v1.json / _v3.json (gtest reports), .log
#   2. attnbench_cuda --kernel=sm80, and --kernel=sm90 with ATTNSERVE_SM90_VARIANT=v1, v3 on
#      dense N=16384 (B=1, Hq=16, D=128, bf16, causal and not) and block-sparse N=65536 (Hq=16,
#      block 128, 90% / 99% of block pairs skipped, random and local_window)
#        -> bench_sm80.json / .md, bench_sm90v{1,3}.json / .md, bench.log
#   3. summary.md: test verdict, the tables, and per case the times of sm80 / sm90 v1 / v3
#      with the speedups over sm80 and of v3 over v1.
# (v1 = single-tile schedule, v3 = persistent; v2, a one-CTA-per-tile warp-specialized schedule,
# was removed, and attnserve now refuses its name.)
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

# SASS of the sm90 kernels (HGMMA = wgmma, LDGSTS = cp.async, LDL/STL = spills: expected 0;
# the persistent kernel also SYNCS (mbarrier) and USETMAXREG).
if command -v cuobjdump > /dev/null && [ -x "$BIN/flash_sm90_test" ]; then
  timeout 30 cuobjdump --dump-sass "$BIN/flash_sm90_test" 2>/dev/null > "$OUT/all_sass.txt"
  for KN in FlashFwdSm90Kernel FlashFwdSm90PersistentKernel; do
    awk -v k="$KN" '/Function : / {on = index($0, k) > 0} on' "$OUT/all_sass.txt" \
      > "$OUT/sass_$KN.txt"
    { echo; echo "SASS ($KN, all instantiations):"
      for ins in HGMMA WARPGROUP LDGSTS MUFU.EX2 BAR.SYNC BAR.ARV SYNCS USETMAXREG LDL STL; do
        printf '%-10s %s\n' "$ins" "$(grep -c "$ins" "$OUT/sass_$KN.txt")"
      done; } >> "$SUMMARY"
  done
  rm -f "$OUT/all_sass.txt"
fi

# 1. Tests (gtest JSON report), one process per sm90 variant (ATTNSERVE_SM90_TEST_VARIANTS): a
#    hang or crash of one variant (rc 124 = timeout) leaves the other's report intact.
for V in v1 v3; do
  TEST_RC=missing
  if [ -x "$BIN/flash_sm90_test" ]; then
    ATTNSERVE_SM90_TEST_VARIANTS=$V timeout 120 "$BIN/flash_sm90_test" \
      --gtest_output="json:$OUT/flash_sm90_test_$V.json" > "$OUT/flash_sm90_test_$V.log" 2>&1
    TEST_RC=$?
  fi
  {
    echo; echo "## flash_sm90_test (sm90 variant $V): rc=$TEST_RC ($(($(date +%s) - T0)) s)"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" "$OUT/flash_sm90_test_$V.log" 2>/dev/null | head -40
  } >> "$SUMMARY"
done

# 2. Benchmarks, one process per kernel (sm90 once per variant: ATTNSERVE_SM90_VARIANT).
CASES=dense_n16384,dense_n16384_causal,sparse_random_s90,sparse_local_window_s90,sparse_random_s99,sparse_local_window_s99
for RUN in sm80 sm90v1 sm90v3; do
  K=${RUN:0:4}
  VAR=${RUN:4}
  RC=missing
  if [ -x "$BIN/attnbench_cuda" ]; then
    ATTNSERVE_SM90_VARIANT=${VAR:-v1} timeout 45 "$BIN/attnbench_cuda" --kernel="$K" \
      --cases="$CASES" --warmup=3 --iters=10 \
      --json="$OUT/bench_$RUN.json" --md="$OUT/bench_$RUN.md" >> "$LOG" 2>&1
    RC=$?
  fi
  { echo; echo "## attnbench_cuda --kernel=$K ${VAR:+ATTNSERVE_SM90_VARIANT=$VAR}: rc=$RC ($(($(date +%s) - T0)) s)"
    cat "$OUT/bench_$RUN.md" 2>/dev/null; } >> "$SUMMARY"
done

# 3. Per case (own rows): sm80, sm90 v1, v3; speedups over sm80, v3 over v1.
if command -v python3 > /dev/null && [ -f "$OUT/bench_sm80.json" ]; then
  timeout 20 python3 - "$OUT/bench_sm80.json" "$OUT/bench_sm90v1.json" "$OUT/bench_sm90v3.json" \
    >> "$SUMMARY" 2>&1 <<'PY'
import json, os, sys
def own(path):
    if not os.path.exists(path):
        return {}
    rows = json.load(open(path))["results"]
    return {r["name"]: r for r in rows if r.get("variant") == "own"}
a, b, d = (own(p) for p in sys.argv[1:4])
def ms(r):
    return r["ms_median"] if r and r.get("ms_median") else float("nan")
def cell(r):
    return f"{ms(r):.3f} ({r['tflops']:.1f})" if r else "-"
def ok(r):
    return str(r["check"]["ok"]) if r and "check" in r else "-"
def kern(r):
    return str(r.get("flash_kernel")) if r else "-"
print("\n## sm80 / sm90 v1 / v3 (own rows; ms median (TFLOP/s))\n")
print("| case | sm80 | sm90 v1 | sm90 v3 | kernels ran | v1/sm80 | v3/sm80 | v3 vs v1 | check ok |")
print("|---|---|---|---|---|---|---|---|---|")
for name in a:
    x, y, w = a[name], b.get(name), d.get(name)
    print(f"| {name} | {cell(x)} | {cell(y)} | {cell(w)} | "
          f"{kern(x)}/{kern(y)}/{kern(w)} | "
          f"{ms(x) / ms(y):.2f}x | {ms(x) / ms(w):.2f}x | "
          f"{ms(y) / ms(w):.3f}x | {ok(x)}/{ok(y)}/{ok(w)} |")
PY
fi
{ echo; echo "- total $(($(date +%s) - T0)) s"; } >> "$SUMMARY"
cat "$SUMMARY"
