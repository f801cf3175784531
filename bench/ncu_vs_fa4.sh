#!/usr/bin/env bash
# Nsight Compute profile of our Hopper kernel and FlashAttention-4's on the same case, one
# launch each, in one run: where the two spend their cycles (tensor pipe, MUFU, issue slots, shared
# memory, stall reasons) and per-SASS counters to compare instruction mixes per tile.
#
# Usage (on the GPU host, bundle unpacked, FA4 installed into FA4_SITE as docs/DEVELOPERS.md
# "GPU runs" says): NEW=/path/to/bundle FA4_SITE=/tmp/fa4site bench/ncu_vs_fa4.sh OUT [D]
#   D = 128 (default) or 64; bf16, N = 16384, Hq = Hkv = 16, non-causal (attnbench_cuda's
#   dense_n16384 / dense_d64_n16384). CASE=sparse_random_s90 (env; any block-sparse case of
#   attnbench_cuda, N = 65536, D = 128): both kernels on the same CSR. Without FA4_SITE only our
#   kernel is profiled (FA4's profile of an earlier run still compares, FA4 being the same
#   wheel).
# Writes OUT/{own,fa4}.ncu-rep, OUT/{own,fa4}.details.txt (ncu --page details) and
# OUT/{own,fa4}.sass.csv.gz (ncu --page source --csv --print-source sass). Timings under the
# profiler (--clock-control none) are not figures; the ratios of counters are what it is for.
set -u
OUT=${1:?usage: NEW=BUNDLE FA4_SITE=DIR $0 OUT [D]}
D=${2:-128}
NEW=${NEW:-.gpu-bundle}
mkdir -p "$OUT"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
[ -f "$NEW/env.sh" ] && source "$NEW/env.sh"
NCU=${NCU:-ncu}
CASE=${CASE:-dense_n16384}; [ "$D" = 64 ] && CASE=dense_d64_n16384
# CASE=sparse_random_s90 (or another block-sparse case of attnbench_cuda, N = 65536, D = 128):
# our run dumps the layout (--csr_dir) and FA4 takes the same kept blocks as "full" blocks
# (bench/fa4_blocks.py), as compare_torch.py gives them.
N=16384; CSR_ARGS=()
case $CASE in sparse_*) N=65536; D=128; CSR_ARGS=(--csr_dir="$OUT/csr"); mkdir -p "$OUT/csr" ;; esac
ARGS=(--clock-control none --set full --import-source yes --launch-skip 1 --launch-count 1)
timeout -k 5 240 "$NCU" "${ARGS[@]}" --kernel-name regex:FlashFwdSm90Persistent -f -o "$OUT/own" \
  "$NEW/bin/attnbench_cuda" --kernel=sm90 --cases=$CASE "${CSR_ARGS[@]}" --warmup=1 --iters=1 \
  > "$OUT/own.log" 2>&1
echo "own ncu rc=$?"
if [ -n "${FA4_SITE:-}" ]; then
cat > "$OUT/fa4_dense.py" <<PY
import os, site, sys, torch
site.addsitedir(sys.argv[1])
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from flash_attn.cute.interface import flash_attn_func
q, k, v = (torch.randn(1, $N, 16, $D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
kw = {}
if "$CASE".startswith("sparse_"):
    import fa4_blocks
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    rp, ci = fa4_blocks.load_csr("$OUT/csr", "$CASE")
    nb = len(rp) - 1
    bs = fa4_blocks.layout_block_size($N, rp)
    counts, idx = fa4_blocks.csr_to_kv_block_lists(rp, ci, nb)
    fc = torch.from_numpy(counts).cuda().view(1, 1, nb)
    fi = torch.from_numpy(idx).cuda().view(1, 1, nb, idx.shape[1])
    kw["block_sparse_tensors"] = BlockSparseTensorsTorch(
        mask_block_cnt=torch.zeros_like(fc), mask_block_idx=torch.zeros(
            (1, 1, nb, 1), dtype=torch.int32, device="cuda"),
        full_block_cnt=fc, full_block_idx=fi, block_size=(bs, bs))
for _ in range(3):
    flash_attn_func(q, k, v, causal=False, **kw)
torch.cuda.synchronize()
PY
timeout -k 5 300 "$NCU" "${ARGS[@]}" --kernel-name regex:'(?i)flash' -f -o "$OUT/fa4" \
  python3 "$OUT/fa4_dense.py" "$FA4_SITE" > "$OUT/fa4.log" 2>&1
echo "fa4 ncu rc=$?"
else
  echo "FA4_SITE unset: our kernel only"
fi
for w in own fa4; do
  [ -f "$OUT/$w.ncu-rep" ] || continue
  "$NCU" --import "$OUT/$w.ncu-rep" --page details > "$OUT/$w.details.txt" 2>&1
  "$NCU" --import "$OUT/$w.ncu-rep" --page source --csv --print-source sass 2>/dev/null |
    gzip -9 > "$OUT/$w.sass.csv.gz"
done
# Side by side: the lines that say where the cycles go.
PAT='Duration|SM Frequency|Registers Per|Issue Slots Busy|Eligible Warps|No Eligible|highest-utilized|Shared Memory Configuration|Executed Ipc A|L1/TEX Hit|Mem Pipes|Warp Cycles Per Issued'
for w in own fa4; do echo "== $w"; grep -E "$PAT" "$OUT/$w.details.txt" 2>/dev/null | head -20; done
