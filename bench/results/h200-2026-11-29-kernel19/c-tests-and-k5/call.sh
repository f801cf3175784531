# bundle bL (bin = the landed kept-max build c2fc97b): every GPU test; the ramp cases on a build
# whose fallback skips the O rescale (must fail); k5 (kept-max scale FFMAs after the P V wait where
# ScaleBeforePvWait is false: D = 64, 176-key tiles) A/B and cycles against the landed build
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
(cd /tmp && rm -rf bL && tar -xJf "$R/.gpu-bundle/bL.tar.xz"); st unpacked
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bL/env.sh
B=/tmp/bL
O=$OUT/r; mkdir -p "$O/tests"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv | tee "$O/gpu.txt"
summarize() { echo "$1 rc=$2 $(grep -E '^\[  (PASSED|FAILED) ' "$3" | cut -c1-200 | head -4 | tr '\n' ' ') skipped=$(grep -c '^\[  SKIPPED \] .*(' "$3")"; }
export ATTNSERVE_BINARY=$B/bin/attnserve
for t in flash_sm90_test cuda_attention_test flash_decode_test rect_attention_test cudnn_sdpa_test \
    cuda_device_test pinned_host_test device_io_test ring_cuda_test dilated_ring_cuda_test \
    sharded_context_gpu_test service_ring_gpu_test; do
  timeout -k 5 150 "$B/bin/$t" > "$O/tests/$t.log" 2>&1
  summarize "$t" $? "$O/tests/$t.log"
done | tee "$O/tests/summary.txt"
st "tests done"
timeout -k 5 60 "$B/var/flash_sm90_test.broken" --gtest_filter='*ramp*' > "$O/tests/broken_ramp.log" 2>&1
summarize "broken (no O rescale in the fallback) ramp cases" $? "$O/tests/broken_ramp.log" | tee -a "$O/tests/summary.txt"
grep -E "^\[  FAILED  \] Specs" "$O/tests/broken_ramp.log" | head -6
V="landed:$B/bin/attnbench_cuda k5:$B/var/attnbench_cuda.k5"
CASES=dense_n16384,dense_n16384_causal,dense_d64_n16384,dense_d64_n16384_causal REPS=7 VARIANTS="$V" \
  timeout -k 5 120 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
st "A/B rc=$?"; head -8 "$O/ab/ab.md"
B=$B CASES="dense_n16384 dense_n16384_causal dense_d64_n16384 dense_d64_n16384_causal" LAUNCHES=5 VARIANTS="$V" \
  timeout -k 5 150 bash bench/ncu_cycles_ab.sh "$O/cyc" > "$O/cyc.log" 2>&1
st "cycles rc=$?"; head -8 "$O/cyc/cycles.md"
for t in flash_sm90_test cuda_attention_test; do
  timeout -k 5 150 "$B/var/$t.k5" > "$O/tests/k5_$t.log" 2>&1
  summarize "k5 $t" $? "$O/tests/k5_$t.log"
done | tee -a "$O/tests/summary.txt"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
