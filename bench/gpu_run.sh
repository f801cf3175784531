#!/usr/bin/env bash
# The one script run on the GPU machine (the caller has done `source .gpu-bundle/env.sh`).
# Runs: device info + SASS check, the GPU tests, the CUDA benchmark, the PyTorch comparison, and
# last the heaviest cases (1M-token dense causal, 8M-token block-sparse). Every step is guarded
# by `timeout`; the whole script stays under ~9 minutes. Writes exactly these files to $OUT:
#   env.txt            nvidia-smi, versions, SASS instruction counts of the kernels
#   gpu_tests.log      cuda_attention_test (and cudnn_sdpa_test, if bundled) output
#   cuda_bench.json    attnbench_cuda: dense, sparse, dilated, compile cases
#   cuda_bench_huge.json  attnbench_cuda: huge cases
#   bench.log          stdout/stderr of the benches and compare_torch.py
#   compare.json       compare_torch.py on cuda_bench.json
#   compare_huge.json  compare_torch.py on cuda_bench_huge.json (SDPA on 1M-token dense causal)
#   summary.md         all markdown tables, test verdict, step timings
set -u
OUT=${OUT:?OUT must be set}
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
T0=$(date +%s)
step() { echo "- $(($(date +%s) - T0)) s: $*" >> "$SUMMARY"; }

echo "# attnserve CUDA run $(date -u +%FT%TZ)" > "$SUMMARY"
echo "" >> "$SUMMARY"

# 1. Device and toolchain, SASS check (HMMA = tensor-core MMA, LDGSTS = cp.async, LDSM = ldmatrix,
#    LDL/STL = local-memory spills: expected 0 in the flash kernels).
{
  nvidia-smi || true
  echo; nvcc --version 2>/dev/null | tail -2
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' 2>&1
  echo; echo "SASS instruction counts in $BIN/cuda_attention_test (flash kernels):"
  if command -v cuobjdump >/dev/null; then
    cuobjdump --dump-sass "$BIN/cuda_attention_test" 2>/dev/null > /tmp/attn_sass.txt
    for ins in HMMA LDGSTS LDSM MUFU.EX2 LDL STL; do
      printf '%-10s %s\n' "$ins" "$(grep -c "$ins" /tmp/attn_sass.txt)"
    done
    grep -E "Function|arch" /tmp/attn_sass.txt | grep -i flash | head -20
  else
    echo "cuobjdump not found"
  fi
} > "$OUT/env.txt" 2>&1
step "env + SASS check done"

# 2. GPU tests.
timeout 150 "$BIN/cuda_attention_test" --gtest_color=no > "$OUT/gpu_tests.log" 2>&1
TEST_RC=$?
# The cuDNN SDPA path's tests, when that binary was bundled (built only with cudnn_frontend).
if [ -x "$BIN/cudnn_sdpa_test" ]; then
  echo "==== cudnn_sdpa_test ====" >> "$OUT/gpu_tests.log"
  timeout 90 "$BIN/cudnn_sdpa_test" --gtest_color=no >> "$OUT/gpu_tests.log" 2>&1
  CUDNN_RC=$?
  echo "cudnn_sdpa_test rc=$CUDNN_RC" >> "$SUMMARY"
fi
{
  echo "## GPU tests: rc=$TEST_RC"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" "$OUT/gpu_tests.log" | tail -40
  echo
} >> "$SUMMARY"
step "tests done (rc=$TEST_RC)"

# 3. CUDA bench (everything but the huge cases).
timeout 170 "$BIN/attnbench_cuda" --cases=dense,sparse,dilated,compile --warmup=3 --iters=10 \
  --csr_dir="$CSR_DIR" --json="$OUT/cuda_bench.json" --md=/tmp/attn_bench.md >> "$LOG" 2>&1
BENCH_RC=$?
{ echo "## attnbench_cuda (rc=$BENCH_RC)"; cat /tmp/attn_bench.md 2>/dev/null; echo; } >> "$SUMMARY"
step "bench done (rc=$BENCH_RC)"

# 4. PyTorch comparison on the same cases (reads our JSON and the CSR dumps).
if [ -f "$OUT/cuda_bench.json" ]; then
  timeout 170 "$PY" "$HERE/compare_torch.py" --ours="$OUT/cuda_bench.json" --csr_dir="$CSR_DIR" \
    --json="$OUT/compare.json" --md=/tmp/attn_compare.md --cbm_timeout=45 >> "$LOG" 2>&1
  CMP_RC=$?
  { echo "## compare_torch (rc=$CMP_RC)"; cat /tmp/attn_compare.md 2>/dev/null; echo; } >> "$SUMMARY"
  step "compare done (rc=$CMP_RC)"
fi

# 5. Heaviest last: 1M-token dense causal, 8M-token 99.9%-sparse.
timeout 75 "$BIN/attnbench_cuda" --cases=huge --csr_dir="$CSR_DIR" \
  --json="$OUT/cuda_bench_huge.json" --md=/tmp/attn_bench_huge.md >> "$LOG" 2>&1
HUGE_RC=$?
{ echo "## attnbench_cuda huge (rc=$HUGE_RC)"; cat /tmp/attn_bench_huge.md 2>/dev/null; echo; } >> "$SUMMARY"
step "huge bench done (rc=$HUGE_RC)"
if [ -f "$OUT/cuda_bench_huge.json" ]; then
  timeout 45 "$PY" "$HERE/compare_torch.py" --ours="$OUT/cuda_bench_huge.json" \
    --cases=huge_dense_causal_n1048576 --csr_dir="$CSR_DIR" --json="$OUT/compare_huge.json" \
    --md=/tmp/attn_compare_huge.md >> "$LOG" 2>&1
  { echo "## compare_torch huge (rc=$?)"; cat /tmp/attn_compare_huge.md 2>/dev/null; echo; } >> "$SUMMARY"
  step "huge compare done"
fi
cat "$SUMMARY"
