# bundle bZ: A/B main / zse (HEAD) / zsenf (scale early except at an item's first tile), 9 reps;
# ncu cycles with the diagnostic nofadd (zse without the row-sum adds: wrong output, cycles only);
# flash_sm90 + cuda_attention tests of zsenf
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bZ && tar -xJf "$R/.gpu-bundle/bZ.tar.xz"); st unpacked
source /tmp/bZ/env.sh
B=/tmp/bZ
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
V="main:$B/var/attnbench_cuda_main zse:$B/bin/attnbench_cuda zsenf:$B/var/zsenf/attnbench_cuda"
CUDA_VISIBLE_DEVICES=0 REPS=9 VARIANTS="$V" timeout -k 5 200 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -12 "$O/ab/ab.md"
B=$B CASES="sparse_random_s90 sparse_local_window_s90 sparse_random_s99 sparse_local_window_s99 dense_n16384_causal" LAUNCHES=5 \
  VARIANTS="$V nofadd:$B/var/attnbench_cuda_nofadd" timeout -k 5 200 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -9 "$O/cyc/cycles.md"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 150 "$B/var/zsenf/$t" > "$O/tests/zsenf_$t.log" 2>&1
  summarize "zsenf $t" $? "$O/tests/zsenf_$t.log"
done | tee "$O/tests/summary.txt"
st "tests done"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
