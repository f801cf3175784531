# right after c7 on the same warm machine (FA4 in /tmp/fa4site, bundle /tmp/bA): the kernel
# comparison once more, and FA4 in alternation with 15 reps
set -u
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
[ -d /tmp/fa4site ] && [ -d /tmp/bA ] || { echo "machine not warm: FA4 or the bundle missing"; exit 3; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bA/env.sh
B=/tmp/bA
O=$OUT/r2; mkdir -p "$O"
NEW=$B FA4_SITE=/tmp/fa4site timeout -k 5 300 bash bench/kernel_compare_run.sh "$O/compare" > "$O/compare.log" 2>&1
st "compare rc=$?"; rm -rf "$O/compare/csr"; sed -n '/### Block-sparse/,/effective TFLOP/p' "$O/compare/summary.md"; sed -n '/### Dense/,/^$/p' "$O/compare/summary.md" | head -8
timeout -k 5 300 python3 bench/fa4_interleaved.py --bench "$B/bin/attnbench_cuda" --fa4-site /tmp/fa4site --out "$O/il" --reps 15 > "$O/il.log" 2>&1
st "interleaved rc=$?"; rm -rf "$O/il/csr"; cat "$O/il/interleaved.md"
tar -C "$OUT" -cJf "$OUT/r2.tar.xz" r2 && rm -rf "$O"
st end
