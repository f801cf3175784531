#!/usr/bin/env bash
# The one multi-GPU run (nvidia-h200-x2), after `source .gpu-bundle/env.sh`; binaries in
# .gpu-bundle/bin (ATTN_BIN_DIR overrides). Steps, each bounded by `timeout`, total < 7 minutes:
#   1. nvidia-smi, nvidia-smi topo -m                                      (~2 s)
#   2. cuda_attention_test (single-GPU kernel regression: the flash_fwd params changed; <= 75 s),
#      parallel_ring_cuda_plan_test (<= 10 s), ring_cuda_test (<= 105 s; expected ~60 s)
#   3. attnbench_ring: T1 vs ring T2 at N = 256K, 512K; memory; longest N   (<= 165 s)
#   4. torchrun compare_torch_ring.py at N = 256K (PyTorch + NCCL ring)      (<= 60 s)
# Worst case ~420 s. Both benches rewrite their JSON after every case, so a timeout keeps results.
# Writes exactly these files to $OUT (all small):
#   env.txt          nvidia-smi, topology, versions
#   ring_tests.log   cuda_attention_test (summary lines only) and the ring tests' output
#   ring_bench.json  attnbench_ring results
#   torch_ring.json  compare_torch_ring.py results
#   summary.md       step timings, bench table, torch results, verdicts (printed last)
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (and the binaries force it again).
set -u
OUT=${OUT:?OUT must be set}
mkdir -p "$OUT"
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
[ -x "$BIN/attnbench_ring" ] || BIN=build-ring-gpu/bin
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SUMMARY="$OUT/summary.md"
BENCH_LOG=/tmp/attn_ring_bench.log
TORCH_LOG=/tmp/attn_torch_ring.log
T0=$(date +%s)
step() { echo "- $(($(date +%s) - T0)) s: $*" >> "$SUMMARY"; }
echo "# attnserve multi-GPU ring run $(date -u +%FT%TZ)" > "$SUMMARY"
echo "" >> "$SUMMARY"

# 1. Devices and interconnect.
{
  nvidia-smi || true
  echo; nvidia-smi topo -m || true
  echo; "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.device_count(), "GPUs")' 2>&1
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} > "$OUT/env.txt" 2>&1
step "env done"

# 2. Tests: the host-side schedule, then the GPU ring (1-GPU emulation + 2-GPU NCCL ring).
: > "$OUT/ring_tests.log"
KERNEL_RC=na
if [ -x "$BIN/cuda_attention_test" ]; then
  timeout -k 5 75 "$BIN/cuda_attention_test" --gtest_color=no > /tmp/attn_kernel_tests.log 2>&1
  KERNEL_RC=$?
  {
    echo "==== cuda_attention_test rc=$KERNEL_RC ===="
    grep -E '^\[  (PASSED|FAILED)  \]|^\[==========\]' /tmp/attn_kernel_tests.log
    grep -E -B3 '^\[  FAILED  \]' /tmp/attn_kernel_tests.log | head -40
    echo "==== ring tests ===="
  } >> "$OUT/ring_tests.log"
fi
step "cuda_attention_test rc=$KERNEL_RC"
PLAN_RC=na
if [ -x "$BIN/parallel_ring_cuda_plan_test" ]; then
  timeout -k 5 10 "$BIN/parallel_ring_cuda_plan_test" --gtest_color=no >> "$OUT/ring_tests.log" 2>&1
  PLAN_RC=$?
fi
timeout -k 5 105 "$BIN/ring_cuda_test" --gtest_color=no >> "$OUT/ring_tests.log" 2>&1
TEST_RC=$?
step "ring tests rc=$TEST_RC (plan test rc=$PLAN_RC)"

# 3. attnbench_ring.
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || cat .gpu-bundle/COMMIT 2>/dev/null || echo unknown)
timeout -k 5 165 "$BIN/attnbench_ring" --json="$OUT/ring_bench.json" --ns=262144 --reps=5 \
  --warmup=1 --heads=8 --dim=128 --devices=2 --longest=1048576,2097152,4194304 \
  --max_run_s=30 --budget_s=60 --commit="$COMMIT" > "$BENCH_LOG" 2>&1
BENCH_RC=$?
step "attnbench_ring rc=$BENCH_RC"

# 4. PyTorch ring, same shapes.
timeout -k 5 50 torchrun --standalone --nproc_per_node=2 "$HERE/compare_torch_ring.py" \
  --json="$OUT/torch_ring.json" --ns=262144 --reps=5 --warmup=1 --budget_s=30 \
  > "$TORCH_LOG" 2>&1
TORCH_RC=$?
step "compare_torch_ring rc=$TORCH_RC"

{
  echo ""
  echo "## Verdicts"
  echo "- cuda_attention_test rc=$KERNEL_RC: $(grep -E '^\[  (PASSED|FAILED)  \]' /tmp/attn_kernel_tests.log 2>/dev/null | head -2 | tr '\n' ' ')"
  echo "- parallel_ring_cuda_plan_test rc=$PLAN_RC; ring_cuda_test rc=$TEST_RC: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/ring_tests.log" | tail -3 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/ring_tests.log" | head -20 | sed 's/^/  /'
  echo "- attnbench_ring rc=$BENCH_RC; compare_torch_ring rc=$TORCH_RC"
  echo ""
  echo "## attnbench_ring (bf16, B=1, Hq=Hkv=8, D=128, dense; eff = T1 / (2 * T2))"
  sed -n '/^| N |/,$p' "$BENCH_LOG" | head -30
  echo ""
  echo "### attnbench_ring log tail"
  grep -vE '^\|' "$BENCH_LOG" | tail -25 | sed 's/^/    /'
  echo ""
  echo "## PyTorch ring (torchrun, SDPA flash + NCCL P2P)"
  echo "| N | causal | T1 (s) | T2 (s) | eff | T1 TF/s | T2 TF/s | check |"
  echo "|---|---|---|---|---|---|---|---|"
  "$PY" - "$OUT/torch_ring.json" <<'PYEOF' 2>&1
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"(no torch results: {e})")
    sys.exit(0)
for c in d["cases"]:
    if "skipped" in c:
        print(f"| {c['n']} | {c['causal']} | skipped ({c['skipped']}) | | | | | |")
        continue
    print(f"| {c['n']} | {c['causal']} | {c['t1_s']:.4f} | {c['t2_s']:.4f} | "
          f"{c['efficiency']:.3f} | {c['t1_tflops']:.1f} | {c['t2_tflops']:.1f} | "
          f"{c['check_o_rel_rank0']:.2e} |")
PYEOF
  if [ "$TORCH_RC" != 0 ]; then echo; echo "### torch log tail"; tail -15 "$TORCH_LOG" | sed 's/^/    /'; fi
  echo ""
  echo "total $(($(date +%s) - T0)) s"
} >> "$SUMMARY"
cat "$SUMMARY"
