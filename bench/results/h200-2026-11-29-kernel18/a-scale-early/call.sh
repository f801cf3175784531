# call 3: wheels.3 + bundle: install FA4, A/B main / se128 / seall, every GPU test of se128
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
cp .wheels.3/* /tmp/wh/ && ls /tmp/wh
(cd /tmp && rm -rf bX && tar -xJf "$R/.gpu-bundle/bX.tar.xz"); st unpacked
/tmp/wh/install-wheels /tmp/wh /tmp/fa4site > "$OUT/install.log" 2>&1; st "install rc=$?"; tail -2 "$OUT/install.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bX/env.sh
B=/tmp/bX
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
CUDA_VISIBLE_DEVICES=0 REPS=${REPS:-7} VARIANTS="main:$B/var/attnbench_cuda_main se128:$B/bin/attnbench_cuda seall:$B/var/attnbench_cuda_seall zs:$B/var/attnbench_cuda_zs" \
  timeout -k 5 330 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -16 "$O/ab/ab.md"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | cut -c1-200 | head -8 | tr '\n' ' ')"; }
export ATTNSERVE_BINARY=$B/bin/attnserve
for t in flash_sm90_test cuda_attention_test flash_decode_test rect_attention_test cudnn_sdpa_test \
    cuda_device_test pinned_host_test device_io_test ring_cuda_test dilated_ring_cuda_test \
    sharded_context_gpu_test service_ring_gpu_test; do
  [ -x "$B/bin/$t" ] || { echo "$t missing"; continue; }
  timeout -k 5 150 "$B/bin/$t" > "$O/tests/$t.log" 2>&1
  summarize "$t" $? "$O/tests/$t.log"
done | tee "$O/tests/summary.txt"
grep -h "window_int64_max" "$O/tests/flash_decode_test.log" | head -3
st "tests done"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
