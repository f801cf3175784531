#!/usr/bin/env bash
# ncu of the landed kernel (dense D = 128, random 90% and 99% skipped): details + per-SASS samples.
set -u
O=${1:?out}; B=${B:-/tmp/bxn}
mkdir -p "$O"
export CUDA_VISIBLE_DEVICES=0
for c in dense_n16384 sparse_random_s90 sparse_random_s99; do
  timeout -k 5 160 ncu --clock-control none --set full --import-source yes --launch-skip 1 \
    --launch-count 1 --kernel-name regex:FlashFwdSm90Persistent -f -o "/tmp/prof_$c" \
    "$B/bin/attnbench_cuda" --kernel=sm90 --cases=$c --warmup=1 --iters=1 > "$O/$c.ncu.log" 2>&1
  echo "$c rc=$?"
  ncu --import "/tmp/prof_$c.ncu-rep" --page details > "$O/$c.details.txt" 2>&1
  ncu --import "/tmp/prof_$c.ncu-rep" --page source --csv --print-source sass 2>/dev/null |
    gzip -9 > "$O/$c.sass.csv.gz"
done
PAT='Duration|SM Frequency|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A|L2 Hit|DRAM Throughput|Warp Cycles Per Issued'
for c in dense_n16384 sparse_random_s90 sparse_random_s99; do echo "== $c"; grep -E "$PAT" "$O/$c.details.txt" | head -14; done
