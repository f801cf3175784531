#!/usr/bin/env bash
# The kernel comparison on one GPU host, in one run: our CUDA kernels (attnbench_cuda) side by
# side with FlashAttention-4, PyTorch SDPA (flash, cuDNN) and FlexAttention (bench/compare_torch.py)
# on the same shapes, inputs made the same way, and block-sparse layouts from the identical CSR.
#
# Usage (on the GPU host, bundle unpacked; FA4 installed into FA4_SITE as docs/DEVELOPERS.md
# "GPU runs" describes; without FA4_SITE the FA4 columns say "not installed"):
#   NEW=/path/to/bundle FA4_SITE=/tmp/fa4site bench/kernel_compare_run.sh OUT_DIR
#   (BENCH_FLAGS="--sm90_key_tile=176 ..." adds attnbench_cuda flags: a kernel option measured
#   against FA4 before it becomes the default; TIMING=do_bench times the torch side with
#   triton's do_bench instead of attnbench_cuda's own loop, the default, see compare_torch.py)
# Cases (bf16, Hq = Hkv = 16, D = 128 unless named):
#   dense_n16384, dense_n16384_causal              N = 16384, D = 128
#   dense_d64_n16384, dense_d64_n16384_causal      N = 16384, D = 64
#   sparse_{random,local_window}_{s90,s99}         N = 65536, block 128, 90% / 99% of pairs skipped
# Writes to OUT_DIR:
#   ours.json, ours.md, ours.log  attnbench_cuda (own and attnserve rows; --csr_dir csr/)
#   csr/                          the block-sparse layouts (.npy), read by compare_torch.py
#   compare.json, compare.md, compare.log   compare_torch.py (FA4 columns, output checks)
#   summary.md                    device, step verdicts, then bench/kernel_compare_summary.py:
#                                 own vs FA4 dense TFLOP/s, own vs FA4 ms per sparse case, own
#                                 effective TFLOP/s vs own dense rate, FAIL lines
# Every step is bounded by `timeout` (90 + 400 + 30 s at most: one run stays under 9 minutes);
# a typical Hopper run takes 2-4 minutes, most of it FA4's and FlexAttention's first-call compiles.
set -u
OUT=${1:?usage: NEW=BUNDLE FA4_SITE=DIR $0 OUT_DIR}
NEW=${NEW:-.gpu-bundle}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT/csr"
SUMMARY="$OUT/summary.md"
T0=$(date +%s)
say() { echo "- $(($(date +%s) - T0)) s: $*" | tee -a "$SUMMARY"; }
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# The bundle's shared libraries (gRPC, abseil, ...) for its binaries.
if [ -f "$NEW/env.sh" ]; then
  # shellcheck disable=SC1091
  source "$NEW/env.sh"
elif [ -d "$NEW/lib" ]; then
  export LD_LIBRARY_PATH="$NEW/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
DEFAULT_CASES=dense_n16384,dense_n16384_causal,dense_d64_n16384,dense_d64_n16384_causal
DEFAULT_CASES=$DEFAULT_CASES,sparse_random_s90,sparse_local_window_s90
DEFAULT_CASES=$DEFAULT_CASES,sparse_random_s99,sparse_local_window_s99
CASES=${CASES:-$DEFAULT_CASES}  # attnbench_cuda case names (and groups), the same for both steps

{
  echo "# Kernel comparison $(date -u +%FT%TZ) (bundle: $NEW, FA4 site: ${FA4_SITE:-none}, flags: ${BENCH_FLAGS:-none})"
  echo
  timeout 10 nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv 2>&1
  echo
} > "$SUMMARY"

# 1. Our kernels. A bundle built before the dense_d64 cases existed runs the others only (unknown
#    names select nothing): say so instead of leaving the D = 64 rows silently empty.
BENCH=$NEW/bin/attnbench_cuda
if [ -x "$BENCH" ]; then
  if ! "$BENCH" --list 2>/dev/null | grep -qx dense_d64_n16384; then
    say "NOTE: $BENCH has no dense_d64 cases (built before they existed): D = 64 rows missing"
  fi
  # shellcheck disable=SC2086
  timeout -k 5 90 "$BENCH" --cases="$CASES" --warmup=3 --iters=20 --csr_dir="$OUT/csr" \
    ${BENCH_FLAGS:-} --json="$OUT/ours.json" --md="$OUT/ours.md" > "$OUT/ours.log" 2>&1
  say "attnbench_cuda rc=$? (0: every own check passed, 1: a check failed, 124: timeout)"
  cat "$OUT/ours.md" >> "$SUMMARY" 2>/dev/null
else
  say "attnbench_cuda: missing ($BENCH)"
fi

# 2. The alternatives on the same cases: FA4, SDPA flash / cuDNN, FlexAttention.
if [ -f "$OUT/ours.json" ]; then
  PYTHONUNBUFFERED=1 timeout -k 5 400 "$PY" "$HERE/bench/compare_torch.py" --ours="$OUT/ours.json" \
    --csr_dir="$OUT/csr" --cases="$CASES" --fa4-site="${FA4_SITE:-}" --timing="${TIMING:-events}" \
    --json="$OUT/compare.json" --md="$OUT/compare.md" > "$OUT/compare.log" 2>&1
  say "compare_torch rc=$? (124: timeout; compare.json holds the cases done before it)"
  tail -n 5 "$OUT/compare.log"
fi

# 3. The summary tables (standard library only).
if [ -f "$OUT/compare.json" ]; then
  echo >> "$SUMMARY"
  timeout 30 "$PY" "$HERE/bench/kernel_compare_summary.py" "$OUT/compare.json" >> "$SUMMARY" 2>&1
  say "summary rc=$?"
fi
say "total"
cat "$SUMMARY"
