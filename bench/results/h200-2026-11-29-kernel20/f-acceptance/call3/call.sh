# right after c8 on the same warm machine: the kernel comparison three more times (the spread of
# the one-run figures; FA4 is timed after ours in each)
set -u
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
[ -d /tmp/fa4site ] && [ -d /tmp/bA ] || { echo "machine not warm: FA4 or the bundle missing"; exit 3; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source /tmp/bA/env.sh
O=$OUT/r3; mkdir -p "$O"
for i in 1 2 3; do
  NEW=/tmp/bA FA4_SITE=/tmp/fa4site timeout -k 5 200 bash bench/kernel_compare_run.sh "$O/compare$i" > "$O/compare$i.log" 2>&1
  st "compare $i rc=$?"; rm -rf "$O/compare$i/csr"
  grep -E "^\| (dense|sparse)_" "$O/compare$i/summary.md" | grep -v " own \| " | cut -d'|' -f2,5-9,11 | head -8
done
tar -C "$OUT" -cJf "$OUT/r3.tar.xz" r3 && rm -rf "$O"
st end
