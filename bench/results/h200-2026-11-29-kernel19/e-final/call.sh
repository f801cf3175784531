# wheels.3 + bundle bL (the landed build, c2fc97b's kernels): FA4 installed; the kernel comparison
# (ours, SDPA flash / cuDNN, FlexAttention, FA4 in one run); FA4 in alternation (9 reps);
# Nsight Compute of ours and FA4 on the same CSR at 90% skipped; sustained dense
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
cp .wheels.3/* /tmp/wh/
(cd /tmp && rm -rf bL && tar -xJf "$R/.gpu-bundle/bL.tar.xz"); st unpacked
/tmp/wh/install-wheels /tmp/wh /tmp/fa4site > "$OUT/install.log" 2>&1; st "install rc=$?"; tail -1 "$OUT/install.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bL/env.sh
B=/tmp/bL
O=$OUT/r; mkdir -p "$O/ncu"
NEW=$B FA4_SITE=/tmp/fa4site timeout -k 5 300 bash bench/kernel_compare_run.sh "$O/compare" > "$O/compare.log" 2>&1
st "compare rc=$?"; rm -rf "$O/compare/csr"; sed -n '/### Dense/,$p' "$O/compare/summary.md" | head -40
timeout -k 5 200 python3 bench/fa4_interleaved.py --bench "$B/bin/attnbench_cuda" --fa4-site /tmp/fa4site --out "$O/il" --reps 9 > "$O/il.log" 2>&1
st "interleaved rc=$?"; rm -rf "$O/il/csr"; cat "$O/il/interleaved.md"
for c in sparse_random_s90 sparse_local_window_s90; do
  CASE=$c NEW=$B FA4_SITE=/tmp/fa4site timeout -k 5 200 bash bench/ncu_vs_fa4.sh "$O/ncu/$c" > "$O/ncu/$c.log" 2>&1
  st "$c ncu rc=$?"
  for s in own fa4; do
    echo "$c $s: $(grep -m1 -E '^\s+Elapsed Cycles' "$O/ncu/$c/$s.details.txt") | $(grep -m1 -E '^\s+Duration' "$O/ncu/$c/$s.details.txt") | $(grep -m1 -E '^\s+SM Frequency' "$O/ncu/$c/$s.details.txt")"
  done
  rm -rf "$O/ncu/$c/csr" "$O/ncu/$c"/*.ncu-rep "$O/ncu/$c/fa4_dense.py"
done
timeout -k 5 90 python3 bench/clock_soak.py --bench "$B/bin/attnbench_cuda" --fa4-site /tmp/fa4site --out "$O/soak" > "$O/soak.log" 2>&1
st "soak rc=$?"; cat "$O/soak/soak.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
