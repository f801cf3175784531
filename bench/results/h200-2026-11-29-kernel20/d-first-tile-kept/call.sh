# bundle bF: bin = an item's first tile as a kept-max tile against the maxima of a quarter of
# its scores (CSR variants, 128-key tiles), var = HEAD (2e09bbc), the test with the fallback's
# O rescale in tile 0 (broken on purpose), stamped builds of both
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bF && tar -xJf "$R/.gpu-bundle/bF.tar.xz"); st unpacked
source /tmp/bF/env.sh
B=/tmp/bF
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
(
timeout -k 5 200 "$B/var/flash_sm90_test.broken" --gtest_filter='*spike*:*ramp*' > "$O/tests/broken.log" 2>&1; summarize "broken flash_sm90_test spike+ramp" $? "$O/tests/broken.log"
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 200 "$B/bin/$t" > "$O/tests/$t.log" 2>&1; summarize "f1 $t" $? "$O/tests/$t.log"
done ) | tee "$O/tests/summary.txt"
grep -h "^\[  FAILED  \]" "$O"/tests/broken.log | head -8
st "tests done"
V="head:$B/var/attnbench_cuda.head f1:$B/bin/attnbench_cuda"
REPS=9 VARIANTS="$V" timeout -k 5 240 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -11 "$O/ab/ab.md"
B=$B CASES="sparse_random_s99 sparse_local_window_s99 sparse_random_s90 sparse_local_window_s90 dense_n16384" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 200 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -8 "$O/cyc/cycles.md"
for v in head f1; do
  CASES="sparse_random_s99 sparse_local_window_s99" STAMPED=$B/var/attnbench_cuda.${v}_stamps \
    timeout -k 5 100 bash bench/sm90_stamps.sh "$O/stamps_$v" > "$O/stamps_$v.log" 2>&1
  echo "== stamps $v"; grep -A6 "period by" "$O/stamps_$v/summary.md" | head -14
done
st "stamps"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
