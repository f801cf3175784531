#!/usr/bin/env bash
# One call for a kernel candidate: on a two-GPU host (nvidia-h200-x2) every GPU test binary of the
# candidate's bundle runs on GPU 1 while bench/kernel_ab.sh interleaves the attnbench_cuda builds
# on GPU 0; on a one-GPU host the tests run on GPU 0 after the A/B (never next to it: they would
# disturb its timing). Then the FlashAttention-4 comparison of the candidate (when FA4 is
# installed), then the tests that need two GPUs (they skip their two-GPU cases on one GPU).
# About 4-5 minutes on an H200 pair, a minute or two more on one H200.
#
# Usage (bundle unpacked at B, as docs/DEVELOPERS.md "GPU runs" says; FA4 in FA4_SITE or absent):
#   B=/tmp/bundle FA4_SITE=/tmp/fa4site \
#   VARIANTS="main:/tmp/bundle/var/attnbench_cuda_main new:/tmp/bundle/bin/attnbench_cuda" \
#     bench/kernel_candidate_run.sh OUT
# Writes OUT/ab/ (kernel_ab.sh), OUT/tests/ and OUT/ring/ (a log per test binary and summary.txt),
# OUT/compare/ (kernel_compare_run.sh), OUT/interleaved/ (fa4_interleaved.py, five reps). A call returns a limited number of files: tar OUT.
set -u
O=${1:?usage: B=BUNDLE VARIANTS=... $0 OUT}
B=${B:?B: the unpacked bundle (bin/, lib/, env.sh)}
VARIANTS=${VARIANTS:-new:$B/bin/attnbench_cuda}
REPS=${REPS:-7}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$O/tests" "$O/ring"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# shellcheck disable=SC1091
[ -f "$B/env.sh" ] && source "$B/env.sh"
T0=$(date +%s); stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
summarize() {  # binary rc log -> one line (a failed parameterized test's line carries its
  # parameter's byte dump: the verdict lines are cut, the log keeps them whole)
  echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | cut -c1-200 | head -8 | tr '\n' ' ')"
}
timeout 10 nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv
NGPU=$(timeout 10 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TEST_GPU=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)
run_tests() {
  export CUDA_VISIBLE_DEVICES=$TEST_GPU
  for t in flash_sm90_test cuda_attention_test flash_decode_test rect_attention_test \
      cudnn_sdpa_test cuda_device_test pinned_host_test device_io_test; do
    [ -x "$B/bin/$t" ] || { echo "$t missing from the bundle"; continue; }
    timeout -k 5 240 "$B/bin/$t" > "$O/tests/$t.log" 2>&1
    summarize "$t" $? "$O/tests/$t.log"
  done
}
TP=
if [ "$TEST_GPU" = 1 ]; then
  run_tests > "$O/tests/summary.txt" 2>&1 &
  TP=$!
fi
stamp "A/B start ($VARIANTS)"
CUDA_VISIBLE_DEVICES=0 REPS=$REPS VARIANTS="$VARIANTS" \
  timeout -k 5 300 bash "$HERE/bench/kernel_ab.sh" "$O/ab" > "$O/ab.log" 2>&1
stamp "A/B rc=$?"; head -12 "$O/ab/ab.md" 2>/dev/null
if [ -n "$TP" ]; then wait "$TP"; else (run_tests) > "$O/tests/summary.txt" 2>&1; fi
stamp "single-GPU tests done (GPU $TEST_GPU)"; cat "$O/tests/summary.txt"
if [ -n "${FA4_SITE:-}" ] && [ -d "$FA4_SITE" ]; then
  CUDA_VISIBLE_DEVICES=0 NEW=$B FA4_SITE=$FA4_SITE \
    timeout -k 5 200 bash "$HERE/bench/kernel_compare_run.sh" "$O/compare" > "$O/compare.log" 2>&1
  stamp "FA4 comparison rc=$?"; tail -25 "$O/compare/summary.md"
  # The same cases with ours and FA4 alternating rep by rep (same thermal history on both sides).
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 240 python3 "$HERE/bench/fa4_interleaved.py" \
    --bench "$B/bin/attnbench_cuda" --fa4-site "$FA4_SITE" --out "$O/interleaved" --reps 5 \
    > "$O/interleaved.log" 2>&1
  stamp "FA4 in alternation rc=$?"; rm -rf "$O/interleaved/csr"; cat "$O/interleaved/interleaved.md"
else
  stamp "FA4_SITE not set or missing: FA4 comparison skipped"
fi
export ATTNSERVE_BINARY=$B/bin/attnserve
for t in ring_cuda_test dilated_ring_cuda_test sharded_context_gpu_test service_ring_gpu_test; do
  [ -x "$B/bin/$t" ] || { echo "$t missing from the bundle"; continue; }
  timeout -k 5 150 "$B/bin/$t" > "$O/ring/$t.log" 2>&1
  summarize "$t" $? "$O/ring/$t.log"
done | tee "$O/ring/summary.txt"
stamp "two-GPU tests done"
