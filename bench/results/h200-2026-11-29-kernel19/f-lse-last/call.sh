# bundle bM: bin = the epilogue with both rows' LSE stored last by predicated stores (D = 128,
# 128-key tiles), var = the landed build (c148411's kernels): sm90 + cuda_attention tests; A/B
# (9 reps) on the block-sparse cases and dense (unchanged kernel, a control); ncu cycles
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bM && tar -xJf "$R/.gpu-bundle/bM.tar.xz"); st unpacked
source /tmp/bM/env.sh
B=/tmp/bM
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 150 "$B/bin/$t" > "$O/tests/$t.log" 2>&1; summarize "lse-last $t" $? "$O/tests/$t.log"
done | tee "$O/tests/summary.txt"
st "tests done"
V="landed:$B/var/attnbench_cuda.landed lse:$B/bin/attnbench_cuda"
CASES=sparse_random_s99,sparse_local_window_s99,sparse_random_s90,sparse_local_window_s90,dense_n16384 REPS=9 VARIANTS="$V" \
  timeout -k 5 200 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -9 "$O/ab/ab.md"
B=$B CASES="sparse_random_s99 sparse_local_window_s99 sparse_random_s90" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 150 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -7 "$O/cyc/cycles.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
