#!/usr/bin/env bash
# Ring runs on all the GPUs of a 4- or 8-GPU lease (nvidia-h200-x4 / -x8), after
# `source .gpu-bundle/env.sh`: OUT=<dir> bash bench/x4_run.sh. Each part bounded by `timeout`,
# writing $OUT/<part>.tgz when it ends; $OUT/summary.md collects the verdicts.
#   service  attnserve on every GPU: two dense causal ring requests, then every spec kind through
#            the ring placement, each checked against the float64 reference (attnctl --check); the
#            NCCL cache, per-GPU memory balance and traffic checks of bench/service_ring_check.sh
#   scaling  attnbench_ring --devices=P --engine=cudnn at N = 262144 and 1048576 (T1 = one GPU on
#            cuDNN, TP = ring over P GPUs, efficiency T1 / (P x TP), ring output vs T1's output)
#   torch    the PyTorch + NCCL ring (torchrun, P processes) at the same N, same lease
#   longest  the longest dense causal sequence under 4 GiB per GPU, 1 GPU vs the ring over P GPUs
set -u
OUT=${OUT:?OUT must be set}
PARTS=${1:-service scaling torch longest}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
export ATTN_BIN_DIR=$BIN
P=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
R=/tmp/attn_xp
rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
SUMMARY="$OUT/summary.md"
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$SUMMARY"; }
pack() { tar czf "$OUT/$1.tgz" -C "$R" "$1" 2>/dev/null; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
echo "# $P-GPU lease $(date -u +%FT%TZ), commit $(cat .gpu-bundle/COMMIT 2>/dev/null || echo ?)" > "$SUMMARY"
timeout 10 nvidia-smi --query-gpu=index,name,memory.total --format=csv >> "$SUMMARY" 2>&1
timeout 10 nvidia-smi topo -m >> "$SUMMARY" 2>&1
DEVS=$(seq -s, 0 $((P - 1)))

if has service; then
  D="$R/service"; mkdir -p "$D"
  ATTN_DEVICES=$DEVS timeout -k 5 200 bash bench/service_ring_check.sh "$D" > "$D/stdout.log" 2>&1
  say "service_ring_check.sh on $DEVS rc=$?"
  grep -E "^(PASS|FAIL)|N=262144" "$D/stdout.log" | sort -u >> "$SUMMARY"
  pack service
fi

if has scaling; then
  D="$R/scaling"; mkdir -p "$D"
  timeout -k 5 200 "$BIN/attnbench_ring" --devices=$P --engine=cudnn --ns=262144,1048576 \
    --longest= --reps=2 --warmup=1 --budget_s=180 --json="$D/ring_bench.json" \
    > "$D/ring_bench.log" 2>&1
  say "attnbench_ring --devices=$P --engine=cudnn rc=$?"
  grep -E "^\[|^\|" "$D/ring_bench.log" | tail -8 >> "$SUMMARY"
  pack scaling
fi

if has torch; then
  D="$R/torch"; mkdir -p "$D"
  timeout -k 5 150 torchrun --standalone --nproc_per_node=$P bench/compare_torch_ring.py \
    --ns=262144,1048576 --reps=2 --warmup=1 --budget_s=120 --json="$D/torch_ring.json" \
    > "$D/torch_ring.log" 2>&1
  say "compare_torch_ring.py on $P GPUs rc=$?"
  python3 -c "
import json
for c in json.load(open('$D/torch_ring.json'))['cases']:
    print('PyTorch ring N=%d causal=%s T1 %.4f TP %.4f eff %.3f' % (c['n'], c['causal'], c['t1_s'], c['t2_s'], c['efficiency']))
" >> "$SUMMARY" 2>&1
  pack torch
fi

if has longest; then
  D="$R/longest"; mkdir -p "$D"
  timeout -k 5 150 "$BIN/attnbench_ring" --longest-causal --memory-budget-gib=4 --time-cap-s=20 \
    --budget_s=130 --heads=8 --dim=128 --devices=$P --json="$D/longest_ring.json" \
    > "$D/longest_ring.log" 2>&1
  say "attnbench_ring --longest-causal --devices=$P rc=$?"
  tail -3 "$D/longest_ring.log" >> "$SUMMARY"
  pack longest
fi
say "done"
cat "$SUMMARY"
