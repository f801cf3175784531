#!/usr/bin/env bash
# Nsight Compute profile of our Hopper kernel on attnbench_cuda cases, one launch each (the second
# call of the case, so that the first's setup is not profiled): `--set full` with source counters,
# then the details page and the per-SASS counters as text for reading off the GPU host.
#
# Usage (on the GPU host, bundle unpacked as docs/DEVELOPERS.md "GPU runs" says):
#   B=/path/to/bundle CASES="dense_n16384 sparse_random_s90" bench/ncu_cases.sh OUT
# Writes OUT/<case>.ncu.log, OUT/<case>.details.txt (ncu --page details) and OUT/<case>.sass.csv.gz
# (ncu --page source --csv --print-source sass), then prints each case's headline counters.
# Clocks are not locked (--clock-control none): cycle counts and ratios are what it is for, not
# times. bench/ncu_vs_fa4.sh profiles FA4's dense kernel next to ours.
set -u
O=${1:?usage: B=BUNDLE CASES="case ..." $0 OUT}
B=${B:?B: the unpacked bundle (bin/, lib/, env.sh)}
CASES=${CASES:-dense_n16384 sparse_random_s90 sparse_random_s99}
mkdir -p "$O"
# shellcheck disable=SC1091
[ -f "$B/env.sh" ] && source "$B/env.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
for c in $CASES; do
  timeout -k 5 160 ncu --clock-control none --set full --import-source yes --launch-skip 1 \
    --launch-count 1 --kernel-name regex:FlashFwdSm90Persistent -f -o "/tmp/prof_$c" \
    "$B/bin/attnbench_cuda" --kernel=sm90 --cases="$c" --warmup=1 --iters=1 > "$O/$c.ncu.log" 2>&1
  echo "$c rc=$?"
  ncu --import "/tmp/prof_$c.ncu-rep" --page details > "$O/$c.details.txt" 2>&1
  ncu --import "/tmp/prof_$c.ncu-rep" --page source --csv --print-source sass 2>/dev/null |
    gzip -9 > "$O/$c.sass.csv.gz"
done
PAT='Duration|SM Frequency|Elapsed Cycles|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A'
PAT="$PAT|L2 Hit|DRAM Throughput|Warp Cycles Per Issued|highest-utilized"
for c in $CASES; do echo "== $c"; grep -E "$PAT" "$O/$c.details.txt" | head -14; done
