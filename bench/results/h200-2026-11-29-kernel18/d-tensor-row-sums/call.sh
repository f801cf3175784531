# bundle bT: tsum (row sums on the tensor pipe) against main and zse (HEAD): every GPU test of tsum
# first (correctness), then A/B 9 reps, then ncu cycles
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bT && tar -xJf "$R/.gpu-bundle/bT.tar.xz"); st unpacked
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bT/env.sh
B=/tmp/bT
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
export ATTNSERVE_BINARY=$B/bin/attnserve
timeout -k 5 150 "$B/bin/flash_sm90_test" > "$O/tests/flash_sm90_test.log" 2>&1
summarize flash_sm90_test $? "$O/tests/flash_sm90_test.log" | tee "$O/tests/summary.txt"
V="main:$B/var/attnbench_cuda_main zse:$B/var/attnbench_cuda_zse tsum:$B/bin/attnbench_cuda"
CUDA_VISIBLE_DEVICES=0 REPS=9 VARIANTS="$V" timeout -k 5 200 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -12 "$O/ab/ab.md"; python3 -c "import json,sys; [print(r['name'], r['check']) for r in json.load(open(sys.argv[1]))['results'] if r['variant'] == 'own']" "$O/ab/ab_tsum_1.json"
B=$B CASES="sparse_random_s90 sparse_local_window_s90 sparse_random_s99 sparse_local_window_s99 dense_d64_n16384" LAUNCHES=5 \
  VARIANTS="$V" timeout -k 5 200 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -9 "$O/cyc/cycles.md"
for t in cuda_attention_test flash_decode_test rect_attention_test cudnn_sdpa_test \
    cuda_device_test pinned_host_test device_io_test ring_cuda_test dilated_ring_cuda_test \
    sharded_context_gpu_test service_ring_gpu_test; do
  timeout -k 5 150 "$B/bin/$t" > "$O/tests/$t.log" 2>&1
  summarize "$t" $? "$O/tests/$t.log"
done | tee -a "$O/tests/summary.txt"
grep -h -m5 "Failure\|error:" "$O"/tests/*.log | head -10
st "tests done"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
