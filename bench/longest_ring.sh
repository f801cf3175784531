#!/usr/bin/env bash
# Longest dense causal sequence under a per-GPU memory budget: one GPU vs the ring over 2 GPUs
# (issue 5, "longest dense causal on 2 GPUs >= 1.8x one GPU"). Usage:
#   bench/longest_ring.sh <out_dir>      (nvidia-h200-x2; after `source .gpu-bundle/env.sh`)
# Binaries in .gpu-bundle/bin (ATTN_BIN_DIR overrides; else build-h2/bin). Runs
#   attnbench_ring --longest-causal --memory-budget-gib=4 --time-cap-s=20
# bounded by `timeout` (170 s; the bench itself stops searching after --budget_s=140 s), so the
# whole script stays under 3 minutes. Writes <out_dir>/longest_ring.json (N1, N2, N2/N1, per-GPU
# peak bytes, times, the ring's (q_chunks, kv_pieces), every attempt) and longest_ring.log.
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (and the binary forces it again).
set -u
OUT=${1:?usage: bench/longest_ring.sh <out_dir>}
mkdir -p "$OUT"
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
[ -x "$BIN/attnbench_ring" ] || BIN=build-h2/bin
export NCCL_NVLS_ENABLE=0
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || cat .gpu-bundle/COMMIT 2>/dev/null || echo unknown)
T0=$(date +%s)
timeout -k 5 170 "$BIN/attnbench_ring" --longest-causal --memory-budget-gib=4 --time-cap-s=20 \
  --budget_s=140 --heads=8 --dim=128 --devices=2 --commit="$COMMIT" \
  --json="$OUT/longest_ring.json" > "$OUT/longest_ring.log" 2>&1
RC=$?
echo "attnbench_ring --longest-causal rc=$RC in $(($(date +%s) - T0)) s" >> "$OUT/longest_ring.log"
tail -30 "$OUT/longest_ring.log"
exit $RC
