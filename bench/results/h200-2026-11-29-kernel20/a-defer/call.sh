# bundle bD: bin = the deferred epilogue (D = 128 CSR, 128-key tiles: tile 0 packs the finished O,
# tile 1 stores it after issuing S(1), then O = P(0) V(0)), var = HEAD (2e09bbc): sm90 + cuda
# attention + rect tests; A/B (9 reps) on the eight comparison cases; ncu cycles
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bD && tar -xJf "$R/.gpu-bundle/bD.tar.xz"); st unpacked
source /tmp/bD/env.sh
B=/tmp/bD
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
for t in flash_sm90_test cuda_attention_test rect_attention_test; do
  timeout -k 5 200 "$B/bin/$t" > "$O/tests/$t.log" 2>&1; summarize "defer $t" $? "$O/tests/$t.log"
done | tee "$O/tests/summary.txt"
grep -h -B2 -A12 "FAILED  \]\|Failure" "$O"/tests/*.log | head -60
st "tests done"
V="head:$B/var/attnbench_cuda.head defer:$B/bin/attnbench_cuda"
REPS=9 VARIANTS="$V" timeout -k 5 240 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -11 "$O/ab/ab.md"
B=$B CASES="sparse_random_s99 sparse_local_window_s99 sparse_random_s90 sparse_local_window_s90 dense_n16384" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 200 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -8 "$O/cyc/cycles.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
