# bundle bT: every GPU test binary of the final tree (its kernels' SASS identical to 16defbc's,
# the measured f1): one H200, so the two-GPU ring cases skip
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bT && tar -xJf "$R/.gpu-bundle/bT.tar.xz"); st unpacked
source /tmp/bT/env.sh
O=$OUT/t; mkdir -p "$O"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv > "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-160 | head -3 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
for t in flash_sm90_test cuda_attention_test rect_attention_test flash_decode_test cudnn_sdpa_test cuda_device_test pinned_host_test device_io_test ring_cuda_test dilated_ring_cuda_test; do
  timeout -k 5 240 /tmp/bT/bin/$t > "$O/$t.log" 2>&1; summarize "$t" $? "$O/$t.log"
done | tee "$O/summary.txt"
st "tests done"
tar -C "$OUT" -cJf "$OUT/t.tar.xz" t && rm -rf "$O"
