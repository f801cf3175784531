#!/usr/bin/env bash
# Cycle A/B of attnbench_cuda builds (and FlashAttention-4) under Nsight Compute: elapsed SM
# cycles per launch of our Hopper kernel on the dense cases. A compute-bound kernel takes about the
# same number of cycles at whatever clock the 700 W power cap leaves it, while its time (and the
# medians of bench/kernel_ab.sh) moves by up to 10% between reps with that clock; so cycles say
# which build does less work per tile where times cannot. They are not the times users see
# (bench/kernel_ab.sh and bench/kernel_compare_run.sh measure those). Clocks are left alone
# (--clock-control none): the card's settings are not ours to change.
#
# Usage (on the GPU host, bundle unpacked as docs/DEVELOPERS.md "GPU runs" says; FA4 optional):
#   B=/tmp/bundle VARIANTS="main:/tmp/bundle/var/attnbench_cuda_main new:/tmp/bundle/bin/attnbench_cuda" \
#     [FA4_SITE=/tmp/fa4site] [CASES="dense_n16384 ..."] [LAUNCHES=5] bench/ncu_cycles_ab.sh OUT
#   (name:binary[:flag,flag...] as in bench/kernel_ab.sh; cases: attnbench_cuda's dense cases,
#   bf16 N = 16384, Hq = Hkv = 16, whose names say D and causal; its block-sparse cases run our
#   builds only, FA4's column is '-' there: bench/ncu_vs_fa4.sh profiles FA4 on the same CSR)
# Writes OUT/<name>_<case>.csv (ncu --csv), OUT/fa4.csv, and OUT/cycles.md: per case the median
# cycles of each variant over its LAUNCHES launches, each variant's ratio to the first, and
# FA4's cycles over each variant's (> 1: that variant needs fewer cycles than FA4).
set -u
O=${1:?usage: B=BUNDLE VARIANTS="name:binary[:flags] ..." $0 OUT}
mkdir -p "$O"
# shellcheck disable=SC1091
[ -n "${B:-}" ] && [ -f "$B/env.sh" ] && source "$B/env.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
CASES=${CASES:-dense_n16384 dense_n16384_causal dense_d64_n16384 dense_d64_n16384_causal}
LAUNCHES=${LAUNCHES:-5}
METRICS=sm__cycles_elapsed.max,gpu__time_duration.sum
NCU=(ncu --clock-control none --metrics "$METRICS" --csv)
for c in $CASES; do
  for v in ${VARIANTS:?VARIANTS}; do
    IFS=: read -r name bin flags <<< "$v"
    # The case's small-shape check launches too: the summary keeps the launches of the large
    # shape (the grid of the most cycles).
    # shellcheck disable=SC2046
    timeout -k 5 150 "${NCU[@]}" --kernel-name regex:FlashFwdSm90Persistent \
      --launch-count $((LAUNCHES + 3)) "$bin" --kernel=sm90 --cases="$c" --warmup=1 \
      --iters="$LAUNCHES" $(echo "${flags:-}" | tr ',' ' ') \
      > "$O/${name}_$c.csv" 2> "$O/${name}_$c.err"
    echo "$name $c rc=$?"
  done
done
# FA4 runs the dense cases only (a block-sparse case needs the CSR our run dumps: ncu_vs_fa4.sh).
FA4_CASES=$(for c in $CASES; do case $c in sparse_*) ;; *) printf '%s ' "$c" ;; esac; done)
if [ -n "${FA4_SITE:-}" ] && [ -d "$FA4_SITE" ] && [ -n "$FA4_CASES" ]; then
  # One process for every case (FA4 compiles each kernel at its first call): per case in
  # FA4_CASES order one call, then LAUNCHES calls; the summary drops each case's first launch.
  cat > "$O/fa4_cases.py" <<'PY'
import site, sys, torch
site.addsitedir(sys.argv[1])
from flash_attn.cute.interface import flash_attn_func
launches = int(sys.argv[2])
for case in sys.argv[3:]:
    d = 64 if "_d64_" in case else 128
    causal = case.endswith("_causal")
    q, k, v = (torch.randn(1, 16384, 16, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flash_attn_func(q, k, v, causal=causal)  # compiles; its launch is left out of the median
    torch.cuda.synchronize()
    for _ in range(launches):
        flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
PY
  # shellcheck disable=SC2086
  timeout -k 5 400 "${NCU[@]}" --kernel-name regex:'flash_fwd_sm90' \
    python3 "$O/fa4_cases.py" "$FA4_SITE" "$LAUNCHES" $FA4_CASES > "$O/fa4.csv" 2> "$O/fa4.err"
  echo "fa4 rc=$?"
fi
# shellcheck disable=SC2086
python3 - "$O" "$LAUNCHES" "$CASES" "$FA4_CASES" ${VARIANTS} <<'PY' | tee "$O/cycles.md"
import csv, os, statistics, sys
out, launches, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
fa4_cases = sys.argv[4].split()
names = [v.split(':')[0] for v in sys.argv[5:]]

def launches_of(path):
    """[(grid, cycles)] in launch order from an ncu --csv file (other lines are the app's)."""
    rows, hdr = {}, None
    if not os.path.exists(path):
        return []
    for rec in csv.reader(line for line in open(path, errors="replace") if line.startswith('"')):
        if hdr is None:
            hdr = rec
            continue
        d = dict(zip(hdr, rec))
        if d.get("Metric Name") == "sm__cycles_elapsed.max":
            rows[int(d["ID"])] = (d.get("Grid Size", ""), float(d["Metric Value"].replace(",", "")))
    return [rows[i] for i in sorted(rows)]

def median_large(ls):
    if not ls:
        return None
    top = max(c for _, c in ls)
    return statistics.median(c for _, c in ls if c >= 0.5 * top)

fa4 = launches_of(os.path.join(out, "fa4.csv"))
print("| case | " + " | ".join(f"{n} Mcycles" for n in names) + " | FA4 Mcycles | " +
      " | ".join(f"{n}/{names[0]}" for n in names[1:]) + (" | " if len(names) > 1 else "") +
      " | ".join(f"FA4/{n}" for n in names) + " |")
print("|---" * (3 * len(names) + 1) + "|")
for c in cases:
    own = [median_large(launches_of(os.path.join(out, f"{n}_{c}.csv"))) for n in names]
    f = None
    if c in fa4_cases:
        i = fa4_cases.index(c)
        chunk = fa4[i * (launches + 1) + 1:(i + 1) * (launches + 1)]
        f = statistics.median(x for _, x in chunk) if len(chunk) == launches else None
    fmt = lambda x: "-" if x is None else f"{x / 1e6:.3f}"
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.3f}"
    cells = ([fmt(x) for x in own] + [fmt(f)] + [ratio(x, own[0]) for x in own[1:]] +
             [ratio(f, x) for x in own])
    print(f"| {c} | " + " | ".join(cells) + " |")
print()
print("Elapsed SM cycles per launch (sm__cycles_elapsed.max) under ncu, clocks not locked; "
      f"median of {launches} launches per build and case (FA4: one process, the {launches} "
      "launches of each case after its first; dense cases only, '-' for block-sparse ones).")
PY
