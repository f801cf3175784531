#!/usr/bin/env bash
# ncu of the landed kernels (dense D = 128 (176-key tiles), D = 64, random 90% skipped).
set -u
O=${1:?out}; B=${B:-/tmp/bX}
mkdir -p "$O"; source $B/env.sh
export CUDA_VISIBLE_DEVICES=0
CASES="dense_n16384 dense_d64_n16384 sparse_random_s90"
for c in $CASES; do
  timeout -k 5 150 ncu --clock-control none --set full --import-source yes --launch-skip 1 \
    --launch-count 1 --kernel-name regex:FlashFwdSm90Persistent -f -o "/tmp/prof_$c" \
    "$B/bin/attnbench_cuda" --kernel=sm90 --cases=$c --warmup=1 --iters=1 > "$O/$c.ncu.log" 2>&1
  echo "$c rc=$?"
  ncu --import "/tmp/prof_$c.ncu-rep" --page details > "$O/$c.details.txt" 2>&1
  ncu --import "/tmp/prof_$c.ncu-rep" --page source --csv --print-source sass 2>/dev/null |
    gzip -9 > "$O/$c.sass.csv.gz"
done
PAT='Duration|SM Frequency|Elapsed Cycles|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A|L2 Hit|DRAM Throughput|Warp Cycles Per Issued|highest-utilized'
for c in $CASES; do echo "== $c"; grep -E "$PAT" "$O/$c.details.txt" | head -14; done
