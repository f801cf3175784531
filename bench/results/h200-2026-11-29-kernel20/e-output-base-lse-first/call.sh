# bundle bQ: var f1 = 16defbc (first-tile kept max); q1 = f1 + the item's OutputBase from the Q
# warp's metadata (CSR 128-key variants); bin = q2 = q1 + the LSE stored before O in the
# 128-key kernels (and the accumulate-mode LSE read off the 16-byte store path): tests of q2
# and q1, A/B of the three (9 reps), ncu cycles
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bQ && tar -xJf "$R/.gpu-bundle/bQ.tar.xz"); st unpacked
source /tmp/bQ/env.sh
B=/tmp/bQ
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 200 "$B/bin/$t" > "$O/tests/q2_$t.log" 2>&1; summarize "q2 $t" $? "$O/tests/q2_$t.log"
done | tee "$O/tests/summary.txt"
st "q2 tests done"
V="f1:$B/var/attnbench_cuda.f1 q1:$B/var/attnbench_cuda.q1 q2:$B/bin/attnbench_cuda"
REPS=9 VARIANTS="$V" timeout -k 5 240 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -11 "$O/ab/ab.md"
B=$B CASES="sparse_random_s99 sparse_local_window_s99 sparse_random_s90 sparse_local_window_s90 dense_d64_n16384" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 200 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -8 "$O/cyc/cycles.md"
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 200 "$B/var/$t.q1" > "$O/tests/q1_$t.log" 2>&1; summarize "q1 $t" $? "$O/tests/q1_$t.log"
done | tee -a "$O/tests/summary.txt"
st "q1 tests done"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
