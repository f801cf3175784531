# wheels.3 + bundle bY: install FA4; A/B main / zm / zse (9 reps); ncu cycles; every GPU test of zm,
# sm90 + cuda_attention tests of zse; FA4 in alternation with zm (7 reps); sustained dense zm vs FA4
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
cp .wheels.3/* /tmp/wh/
(cd /tmp && rm -rf bY && tar -xJf "$R/.gpu-bundle/bY.tar.xz"); st unpacked
/tmp/wh/install-wheels /tmp/wh /tmp/fa4site > "$OUT/install.log" 2>&1; st "install rc=$?"; tail -1 "$OUT/install.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bY/env.sh
B=/tmp/bY
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
V="main:$B/var/attnbench_cuda_main zm:$B/bin/attnbench_cuda zse:$B/var/zse/attnbench_cuda"
CUDA_VISIBLE_DEVICES=0 REPS=9 VARIANTS="$V" timeout -k 5 200 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -12 "$O/ab/ab.md"
B=$B CASES="sparse_random_s90 sparse_local_window_s90 sparse_random_s99 dense_d64_n16384 dense_n16384" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 150 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -8 "$O/cyc/cycles.md"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
export ATTNSERVE_BINARY=$B/bin/attnserve
for t in flash_sm90_test cuda_attention_test flash_decode_test rect_attention_test cudnn_sdpa_test \
    cuda_device_test pinned_host_test device_io_test ring_cuda_test dilated_ring_cuda_test \
    sharded_context_gpu_test service_ring_gpu_test; do
  timeout -k 5 150 "$B/bin/$t" > "$O/tests/$t.log" 2>&1
  summarize "$t" $? "$O/tests/$t.log"
done | tee "$O/tests/summary.txt"
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 150 "$B/var/zse/$t" > "$O/tests/zse_$t.log" 2>&1
  summarize "zse $t" $? "$O/tests/zse_$t.log"
done | tee -a "$O/tests/summary.txt"
st "tests done"
timeout -k 5 200 python3 bench/fa4_interleaved.py --bench "$B/bin/attnbench_cuda" --fa4-site /tmp/fa4site --out "$O/il" --reps 7 > "$O/il.log" 2>&1
st "interleaved rc=$?"; rm -rf "$O/il/csr"; cat "$O/il/interleaved.md"
timeout -k 5 60 python3 bench/clock_soak.py --bench "$B/bin/attnbench_cuda" --fa4-site /tmp/fa4site --out "$O/soak" > "$O/soak.log" 2>&1
st "soak rc=$?"; cat "$O/soak/soak.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
