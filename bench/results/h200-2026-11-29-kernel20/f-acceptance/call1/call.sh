# wheels.3 + bundle bA (16defbc's kernels, = d-first-tile-kept's f1, SASS identical): FA4
# installed; the kernel comparison (ours, SDPA flash / cuDNN, FlexAttention, FA4 in one run);
# FA4 in alternation (9 reps)
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
cp .wheels.3/* /tmp/wh/
(cd /tmp && rm -rf bA && tar -xJf "$R/.gpu-bundle/bA.tar.xz"); st unpacked
/tmp/wh/install-wheels /tmp/wh /tmp/fa4site > "$OUT/install.log" 2>&1; st "install rc=$?"; tail -1 "$OUT/install.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bA/env.sh
B=/tmp/bA
O=$OUT/r; mkdir -p "$O"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv > "$O/gpu.txt"
NEW=$B FA4_SITE=/tmp/fa4site timeout -k 5 300 bash bench/kernel_compare_run.sh "$O/compare" > "$O/compare.log" 2>&1
st "compare rc=$?"; rm -rf "$O/compare/csr"; sed -n '/### Dense/,$p' "$O/compare/summary.md" | head -40
timeout -k 5 240 python3 bench/fa4_interleaved.py --bench "$B/bin/attnbench_cuda" --fa4-site /tmp/fa4site --out "$O/il" --reps 9 > "$O/il.log" 2>&1
st "interleaved rc=$?"; rm -rf "$O/il/csr"; cat "$O/il/interleaved.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
