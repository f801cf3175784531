# wheels.3 + bundle bK: install FA4; sm90 + cuda_attention tests of k1 (kept max, full tiles) and k2
# (kept max, every variant); A/B main / k1 / k2 (7 reps); ncu cycles main / k1 / k2 + FA4
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
cp .wheels.3/* /tmp/wh/
(cd /tmp && rm -rf bK && tar -xJf "$R/.gpu-bundle/bK.tar.xz"); st unpacked
/tmp/wh/install-wheels /tmp/wh /tmp/fa4site > "$OUT/install.log" 2>&1; st "install rc=$?"; tail -1 "$OUT/install.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bK/env.sh
B=/tmp/bK
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 150 "$B/bin/$t" > "$O/tests/k1_$t.log" 2>&1; summarize "k1 $t" $? "$O/tests/k1_$t.log"
  timeout -k 5 150 "$B/var/$t.k2" > "$O/tests/k2_$t.log" 2>&1; summarize "k2 $t" $? "$O/tests/k2_$t.log"
done | tee "$O/tests/summary.txt"
grep -E "FAILED|Failure|error" "$O"/tests/*.log | head -20
st "tests done"
V="main:$B/var/attnbench_cuda.main k1:$B/bin/attnbench_cuda k2:$B/var/attnbench_cuda.k2"
CUDA_VISIBLE_DEVICES=0 REPS=7 VARIANTS="$V" timeout -k 5 200 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -12 "$O/ab/ab.md"
B=$B FA4_SITE=/tmp/fa4site CASES="sparse_random_s90 sparse_local_window_s90 sparse_random_s99 dense_n16384 dense_n16384_causal dense_d64_n16384" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 200 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -10 "$O/cyc/cycles.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
