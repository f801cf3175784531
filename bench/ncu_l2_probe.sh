#!/usr/bin/env bash
# Memory side of our Hopper kernel under Nsight Compute: per launch the elapsed SM cycles, the
# time, the SM clock, the share of the launch an SM is busy on average (the rest: waiting for
# the last CTAs), the L2 hit rate and the DRAM bytes read and written, for attnbench_cuda
# builds on the same cases. Where the kernel runs at the 700 W cap (the block-sparse cases at
# N = 65536 do, down to 99% skipped) bytes not moved from DRAM turn into clock, so this says
# what a change does to the traffic that bench/kernel_ab.sh only sees as time. Clocks are left
# alone (--clock-control none).
#
# Usage (on the GPU host, bundle unpacked as docs/DEVELOPERS.md "GPU runs" says):
#   CASES="sparse_random_s99 sparse_random_s90" bench/ncu_l2_probe.sh OUT \
#     main:/tmp/bundle/var/attnbench_cuda_main new:/tmp/bundle/bin/attnbench_cuda \
#     static:/tmp/bundle/bin/attnbench_cuda:--sm90_item_deal=static
#   (name:binary[:flag,flag...], as bench/kernel_ab.sh takes them)
# Writes OUT/<name>_<case>.csv (ncu --csv, every launch) and OUT/l2.md: per variant and case the
# means over the launches of the case's large shape (its small-shape check launches too).
set -u
O=${1:?usage: CASES="..." $0 OUT name:binary ...}
shift
mkdir -p "$O"
CASES=${CASES:-sparse_random_s99 sparse_random_s90}
M=sm__cycles_elapsed.max,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
M=$M,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_active.avg
for c in $CASES; do
  for v in "$@"; do
    IFS=: read -r name bin flags <<< "$v"
    # shellcheck disable=SC2046
    timeout -k 5 120 ncu --clock-control none --metrics "$M" --csv \
      --kernel-name regex:FlashFwdSm90Persistent --launch-count 5 "$bin" --kernel=sm90 \
      --cases="$c" --warmup=1 --iters=2 $(echo "${flags:-}" | tr ',' ' ') \
      > "$O/${name}_$c.csv" 2> "$O/${name}_$c.err"
    echo "$name $c rc=$?"
  done
done
python3 - "$O" <<'PY' | tee "$O/l2.md"
import collections, csv, glob, os, sys
print('| variant / case | cycles | us | GHz | SM active % | L2 hit % | DRAM read GB '
      '| DRAM write GB |')
print('|---|---|---|---|---|---|---|---|')
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.csv'))):
    rows = list(csv.reader(open(f)))
    head = [i for i, r in enumerate(rows) if 'Metric Name' in r]
    if not head:
        continue
    h = rows[head[0]]
    d = collections.defaultdict(list)
    for r in rows[head[0] + 1:]:
        if len(r) == len(h):
            d[r[h.index('Metric Name')]].append(float(r[h.index('Metric Value')].replace(',', '')))
    cyc = d['sm__cycles_elapsed.max']
    big = [i for i, c in enumerate(cyc) if c > 0.5 * max(cyc)]
    mean = lambda k: sum(d[k][i] for i in big) / len(big)
    print(f"| {os.path.basename(f)[:-4]} | {mean('sm__cycles_elapsed.max'):.0f} | "
          f"{mean('gpu__time_duration.sum') / 1e3:.1f} | "
          f"{mean('sm__cycles_elapsed.avg.per_second') / 1e9:.2f} | "
          f"{100 * mean('sm__cycles_active.avg') / mean('sm__cycles_elapsed.max'):.1f} | "
          f"{mean('lts__t_sector_hit_rate.pct'):.1f} | {mean('dram__bytes_read.sum') / 1e9:.3f} | "
          f"{mean('dram__bytes_write.sum') / 1e9:.3f} |")
PY
