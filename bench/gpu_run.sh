#!/usr/bin/env bash
# The one script run on the GPU machine (the caller has done `source .gpu-bundle/env.sh`).
# Runs: device info + SASS check, the GPU tests, the CUDA benchmark, the PyTorch comparison, and
# last the heaviest cases (1M-token dense causal, 8M-token block-sparse). Every step is guarded
# by `timeout` (about 6 minutes if every step ran into its limit; a typical H200 run takes ~2).
# A binary missing from the bundle is reported as "missing" and its step skipped; the script goes
# on. Everything here is single-GPU work and runs on GPU 0 (CUDA_VISIBLE_DEVICES=0), also on a
# multi-GPU host.
# Writes exactly these files (8) to $OUT:
#   env.txt            nvidia-smi, versions, SASS instruction counts of the kernels
#   gpu_tests.log      cuda_attention_test, cudnn_sdpa_test, cuda_device_test output
#   cuda_bench.json    attnbench_cuda: dense, sparse, dilated, compile cases (dense cases with an
#                      "own" row, our kernels, and an "attnserve" row, what the service runs)
#   cuda_bench_huge.json  attnbench_cuda: huge cases
#   bench.log          stdout/stderr of the benches and compare_torch.py
#   compare.json       compare_torch.py on cuda_bench.json
#   compare_huge.json  compare_torch.py on cuda_bench_huge.json (SDPA on 1M-token dense causal)
#   summary.md         all markdown tables, test verdict, step timings
set -u
OUT=${OUT:?OUT must be set}
export CUDA_VISIBLE_DEVICES=0
mkdir -p "$OUT"
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
[ -x "$BIN/attnbench_cuda" ] || BIN=build-cuda/bin
CSR_DIR=${ATTN_CSR_DIR:-/tmp/attn_csr}
mkdir -p "$CSR_DIR"
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
SUMMARY="$OUT/summary.md"
LOG="$OUT/bench.log"
: > "$LOG"
rm -f /tmp/attn_bench.md /tmp/attn_bench_huge.md /tmp/attn_compare.md /tmp/attn_compare_huge.md
T0=$(date +%s)
step() { echo "- $(($(date +%s) - T0)) s: $*" >> "$SUMMARY"; }
# have NAME: the binary is bundled (else says so in the summary and on stdout).
have() {
  if [ -x "$BIN/$1" ]; then return 0; fi
  echo "$1: missing (not in $BIN)" | tee -a "$SUMMARY"
  return 1
}

echo "# attnserve CUDA run $(date -u +%FT%TZ)" > "$SUMMARY"
echo "" >> "$SUMMARY"

# 1. Device and toolchain, SASS check (HMMA = tensor-core MMA, LDGSTS = cp.async, LDSM = ldmatrix,
#    LDL/STL = local-memory spills: expected 0 in the flash kernels).
{
  timeout 10 nvidia-smi || true
  echo; nvcc --version 2>/dev/null | tail -2
  timeout 20 "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' 2>&1
  echo; echo "SASS instruction counts in $BIN/cuda_attention_test (flash kernels):"
  if [ ! -x "$BIN/cuda_attention_test" ]; then
    echo "cuda_attention_test: missing"
  elif command -v cuobjdump >/dev/null; then
    timeout 20 cuobjdump --dump-sass "$BIN/cuda_attention_test" 2>/dev/null > /tmp/attn_sass.txt
    for ins in HMMA LDGSTS LDSM MUFU.EX2 LDL STL; do
      printf '%-10s %s\n' "$ins" "$(grep -c "$ins" /tmp/attn_sass.txt)"
    done
    grep -E "Function|arch" /tmp/attn_sass.txt | grep -i flash | head -20
  else
    echo "cuobjdump not found"
  fi
  echo; echo "cuDNN libraries visible to the loader:"
  ldconfig -p 2>/dev/null | grep -E "libcudnn\.so" | head -3
  echo "ATTNSERVE_ATTENTION_ENGINE=${ATTNSERVE_ATTENTION_ENGINE:-<unset: auto>}"
} > "$OUT/env.txt" 2>&1
step "env + SASS check done"

# 2. GPU tests, each binary when bundled (cudnn_sdpa_test exists only in builds with the cuDNN
#    path; cuda_device_test skips its cuDNN expectations where libcudnn cannot be loaded).
: > "$OUT/gpu_tests.log"
TEST_RC=0
echo "## GPU tests" >> "$SUMMARY"
for t in cuda_attention_test:40 cudnn_sdpa_test:30 cuda_device_test:60; do
  name=${t%%:*}; limit=${t##*:}
  echo "==== $name ====" >> "$OUT/gpu_tests.log"
  if ! have "$name"; then
    echo "$name: missing" >> "$OUT/gpu_tests.log"
    continue
  fi
  timeout "$limit" "$BIN/$name" --gtest_color=no >> "$OUT/gpu_tests.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && TEST_RC=$rc
  echo "- $name rc=$rc" >> "$SUMMARY"
done
{
  grep -E "^==== |: missing$|tests? ran|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests?," \
    "$OUT/gpu_tests.log" | tail -60
  echo
} >> "$SUMMARY"
step "tests done (rc=$TEST_RC)"

# 3. CUDA bench (everything but the huge cases).
BENCH_RC=missing
if have attnbench_cuda; then
  timeout 60 "$BIN/attnbench_cuda" --cases=dense,sparse,dilated,compile --warmup=3 --iters=10 \
    --csr_dir="$CSR_DIR" --json="$OUT/cuda_bench.json" --md=/tmp/attn_bench.md >> "$LOG" 2>&1
  BENCH_RC=$?
fi
{ echo "## attnbench_cuda (rc=$BENCH_RC)"; cat /tmp/attn_bench.md 2>/dev/null; echo; } >> "$SUMMARY"
step "bench done (rc=$BENCH_RC)"

# 4. PyTorch comparison on the same cases (reads our JSON and the CSR dumps).
if [ -f "$OUT/cuda_bench.json" ]; then
  timeout 80 "$PY" "$HERE/compare_torch.py" --ours="$OUT/cuda_bench.json" --csr_dir="$CSR_DIR" \
    --json="$OUT/compare.json" --md=/tmp/attn_compare.md --cbm_timeout=45 >> "$LOG" 2>&1
  CMP_RC=$?
  { echo "## compare_torch (rc=$CMP_RC)"; cat /tmp/attn_compare.md 2>/dev/null; echo; } >> "$SUMMARY"
  step "compare done (rc=$CMP_RC)"
fi

# 5. Heaviest last: 1M-token dense causal, 8M-token 99.9%-sparse (ATTN_SKIP_HUGE=1 skips them when
#    the lease is short).
HUGE_RC=missing
if [ "${ATTN_SKIP_HUGE:-0}" = 1 ]; then
  HUGE_RC=skipped
elif have attnbench_cuda; then
  timeout 35 "$BIN/attnbench_cuda" --cases=huge --csr_dir="$CSR_DIR" \
    --json="$OUT/cuda_bench_huge.json" --md=/tmp/attn_bench_huge.md >> "$LOG" 2>&1
  HUGE_RC=$?
fi
{ echo "## attnbench_cuda huge (rc=$HUGE_RC)"; cat /tmp/attn_bench_huge.md 2>/dev/null; echo; } >> "$SUMMARY"
step "huge bench done (rc=$HUGE_RC)"
if [ -f "$OUT/cuda_bench_huge.json" ]; then
  timeout 30 "$PY" "$HERE/compare_torch.py" --ours="$OUT/cuda_bench_huge.json" \
    --cases=huge_dense_causal_n1048576 --csr_dir="$CSR_DIR" --json="$OUT/compare_huge.json" \
    --md=/tmp/attn_compare_huge.md >> "$LOG" 2>&1
  { echo "## compare_torch huge (rc=$?)"; cat /tmp/attn_compare_huge.md 2>/dev/null; echo; } >> "$SUMMARY"
  step "huge compare done"
fi
cat "$SUMMARY"
