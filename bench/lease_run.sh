#!/usr/bin/env bash
# One 2-GPU lease (nvidia-h200-x2), after `source .gpu-bundle/env.sh`: correctness of everything new
# first, then the figures the open issues ask for. Usage: OUT=<dir> bash bench/lease_run.sh [parts]
# parts (default "kernel sparse ring longest service scaling"):
#   kernel   flash_sm90_test once per sm90 variant ($LEASE_VARIANTS, default "v3", the one left;
#            the wgmma kernel forced, vs the float64 reference); cudnn_sdpa_test's piece tests;
#            cuda_attention_test through the default dispatch with each variant that passed. When
#            v3 fails, every later part runs with ATTNSERVE_FLASH_KERNEL=sm80 (said in the summary).
#   sparse   attnbench_cuda on sm80, on each sm90 variant that passed, on the automatic choice
#            (no variant set), and on the extra runs in $LEASE_EXTRA_RUNS ("variant:order ...",
#            order = ATTNSERVE_SM90_V3_ORDER), then compare_torch.py (PyTorch SDPA flash/cuDNN and
#            FlexAttention on the same CSR) for dense N=16384 and block-sparse N=65536
#   profile  ncu (if present; clocks left alone) on the 99%-skipped cases, one launch per variant
#            in $LEASE_PROFILE_VARIANTS: DRAM / L2 throughput, L2 hit rate, tensor pipe use
#   ring     ring_cuda_test (lean schedule, RingCudaRun, cuDNN pieces), dilated_ring_cuda_test
#   longest  bench/longest_ring.sh (longest dense causal, 1 GPU vs ring, 4 GiB per GPU)
#   service  bench/service_ring_check.sh (attnserve on both GPUs, ring requests, /metrics)
#   scaling  attnbench_ring --engine=both at N=262144 and compare_torch_ring.py (PyTorch ring)
# Every command is bounded by `timeout`; each part writes $OUT/<part>.tgz as soon as it ends, so a
# lease cut short still returns what finished, and $OUT/summary.md collects the verdicts.
set -u
OUT=${OUT:?OUT must be set}
PARTS=${1:-kernel sparse ring longest service scaling}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${ATTN_BIN_DIR:-.gpu-bundle/bin}
export ATTN_BIN_DIR=$BIN
PY=${PYTHON:-python3}
R=/tmp/attn_lease
rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
SUMMARY="$OUT/summary.md"
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$SUMMARY"; }
pack() { tar czf "$OUT/$1.tgz" -C "$R" "$1" 2>/dev/null; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
echo "# lease run $(date -u +%FT%TZ), commit $(cat .gpu-bundle/COMMIT 2>/dev/null || echo ?)" > "$SUMMARY"
timeout 10 nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv >> "$SUMMARY" 2>&1

if has kernel; then
  D="$R/kernel"; mkdir -p "$D"
  # The Hopper kernel, one process per variant (a hang in one cannot lose the other's results).
  VARIANTS_OK=""
  for V in ${LEASE_VARIANTS:-v3}; do
    CUDA_VISIBLE_DEVICES=0 ATTNSERVE_SM90_TEST_VARIANTS=$V timeout -k 5 120 "$BIN/flash_sm90_test" \
      --gtest_color=no --gtest_output="json:$D/flash_sm90_test_$V.json" > "$D/flash_sm90_test_$V.log" 2>&1
    rc=$?
    say "flash_sm90_test ($V) rc=$rc: $(grep -E '^\[  (PASSED|FAILED)  \]' "$D/flash_sm90_test_$V.log" | tr '\n' ' ' | cut -c1-300)"
    grep -E '^\[  FAILED  \]' "$D/flash_sm90_test_$V.log" | head -10 | cut -c1-200 >> "$SUMMARY"
    if [ $V = v3 ] && [ $rc -ne 0 ]; then
      export ATTNSERVE_FLASH_KERNEL=sm80
      say "flash_sm90_test (v3) failed: ATTNSERVE_FLASH_KERNEL=sm80 for everything below"
    fi
    [ $rc -eq 0 ] && VARIANTS_OK="$VARIANTS_OK $V"
  done
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 60 "$BIN/cudnn_sdpa_test" --gtest_color=no \
    --gtest_filter='*Piece*:CudnnSdpaTest*' > "$D/cudnn_sdpa_test.log" 2>&1
  say "cudnn_sdpa_test rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$D/cudnn_sdpa_test.log" | tr '\n' ' ')"
  for V in $VARIANTS_OK; do
    CUDA_VISIBLE_DEVICES=0 ATTNSERVE_SM90_VARIANT=$V timeout -k 5 90 "$BIN/cuda_attention_test" \
      --gtest_color=no > "$D/cuda_attention_test_$V.log" 2>&1
    say "cuda_attention_test (kernel ${ATTNSERVE_FLASH_KERNEL:-auto}, sm90 $V) rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$D/cuda_attention_test_$V.log" | tr '\n' ' ' | cut -c1-300)"
  done
  pack kernel
fi

if has sparse; then
  D="$R/sparse"; mkdir -p "$D" /tmp/attn_csr
  CASES=dense_n16384,dense_n16384_causal,sparse_random_s90,sparse_local_window_s90,sparse_random_s99,sparse_local_window_s99
  RUNS="sm80:v3:"
  for V in ${VARIANTS_OK:-v3}; do RUNS="$RUNS sm90:$V:"; done
  RUNS="$RUNS sm90:auto:"
  for X in ${LEASE_EXTRA_RUNS:-}; do RUNS="$RUNS sm90:$X"; done
  for KVO in $RUNS; do
    K=${KVO%%:*}; VO=${KVO#*:}; V=${VO%%:*}; O=${VO#*:}
    TAG=$K; [ $K = sm90 ] && TAG=sm90$V$O
    VE=$V; [ $V = auto ] && VE=
    CUDA_VISIBLE_DEVICES=0 ATTNSERVE_SM90_VARIANT=$VE ATTNSERVE_SM90_V3_ORDER=$O timeout -k 5 50 \
      "$BIN/attnbench_cuda" --kernel="$K" --cases="$CASES" --warmup=3 --iters=20 \
      --csr_dir=/tmp/attn_csr --json="$D/bench_$TAG.json" --md="$D/bench_$TAG.md" >> "$D/bench.log" 2>&1
    say "attnbench_cuda --kernel=$K (sm90 variant ${V}, order ${O:-default}) rc=$?"
    cat "$D/bench_$TAG.md" >> "$SUMMARY" 2>/dev/null
  done
  # FlexAttention / PyTorch SDPA on the same cases and CSR, in the same lease.
  OURS="$D/bench_sm90v3.json"; [ -f "$OURS" ] || OURS="$D/bench_sm90auto.json"
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 100 "$PY" bench/compare_torch.py --ours="$OURS" \
    --csr_dir=/tmp/attn_csr --json="$D/compare.json" --md="$D/compare.md" --cbm_timeout=30 \
    >> "$D/bench.log" 2>&1
  say "compare_torch.py rc=$?"
  cat "$D/compare.md" >> "$SUMMARY" 2>/dev/null
  pack sparse
fi

if has profile && command -v ncu > /dev/null; then
  D="$R/profile"; mkdir -p "$D" /tmp/attn_csr
  M=dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active
  for V in ${LEASE_PROFILE_VARIANTS:-v3}; do
    for C in sparse_random_s99 sparse_local_window_s99; do
      CUDA_VISIBLE_DEVICES=0 ATTNSERVE_SM90_VARIANT=$V timeout -k 5 60 ncu --clock-control none \
        --kernel-name regex:FlashFwdSm90 --launch-skip 1 --launch-count 1 --metrics "$M" --csv \
        "$BIN/attnbench_cuda" --kernel=sm90 --cases=$C --warmup=1 --iters=1 --csr_dir=/tmp/attn_csr \
        > "$D/ncu_${V}_$C.csv" 2> "$D/ncu_${V}_$C.err"
      say "ncu $V $C rc=$?"
      grep -E '"(dram|lts|sm__|gpu__)' "$D/ncu_${V}_$C.csv" | awk -F'","' '{print $(NF-2), $NF}' \
        | tr -d '"' | head -8 >> "$SUMMARY"
    done
  done
  pack profile
fi
if has ring; then
  D="$R/ring"; mkdir -p "$D"
  timeout -k 5 200 "$BIN/ring_cuda_test" --gtest_color=no > "$D/ring_cuda_test.log" 2>&1
  say "ring_cuda_test rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$D/ring_cuda_test.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$D/ring_cuda_test.log" | head -10 >> "$SUMMARY"
  if [ -x "$BIN/dilated_ring_cuda_test" ]; then
    timeout -k 5 90 "$BIN/dilated_ring_cuda_test" --gtest_color=no > "$D/dilated_ring_cuda_test.log" 2>&1
    say "dilated_ring_cuda_test rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$D/dilated_ring_cuda_test.log" | tr '\n' ' ')"
  fi
  pack ring
fi

if has longest; then
  D="$R/longest"; mkdir -p "$D"
  timeout -k 5 180 bash bench/longest_ring.sh "$D" > "$D/stdout.log" 2>&1
  say "longest_ring.sh rc=$?"
  tail -8 "$D/longest_ring.log" >> "$SUMMARY" 2>/dev/null
  pack longest
fi

if has service; then
  D="$R/service"; mkdir -p "$D"
  timeout -k 5 200 bash bench/service_ring_check.sh "$D" > "$D/stdout.log" 2>&1
  say "service_ring_check.sh rc=$?"
  tail -25 "$D/stdout.log" >> "$SUMMARY"
  pack service
fi

if has scaling; then
  D="$R/scaling"; mkdir -p "$D"
  timeout -k 5 150 "$BIN/attnbench_ring" --engine=both --ns=262144 --longest= --reps=3 --warmup=1 \
    --budget_s=130 --json="$D/ring_bench.json" > "$D/ring_bench.log" 2>&1
  say "attnbench_ring --engine=both rc=$?"
  grep -E "^\[|^\|" "$D/ring_bench.log" | tail -12 >> "$SUMMARY"
  timeout -k 5 90 torchrun --standalone --nproc_per_node=2 bench/compare_torch_ring.py --ns=262144 --reps=3 \
    --json="$D/torch_ring.json" > "$D/torch_ring.log" 2>&1
  say "compare_torch_ring.py rc=$?"
  tail -6 "$D/torch_ring.log" >> "$SUMMARY"
  pack scaling
fi
say "done"
cat "$SUMMARY"
