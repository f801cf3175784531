# 1) stamped diagnostic builds of head (2e09bbc), all with wrong outputs on purpose: nostore (the
# epilogue's O stores predicated off: `if (r < n && r < 0)`), notrans (no quad transposes: same
# stores, wrong columns), nolse (LSE stores off); stamps + times at 99% skipped
set -u
R=$PWD
(cd /tmp && rm -rf bS && tar -xJf "$R/.gpu-bundle/bS.tar.xz")
source /tmp/bS/env.sh
O=$OUT/s; mkdir -p "$O"
for v in head nostore notrans nolse; do
  CASES="sparse_random_s99 sparse_local_window_s99" STAMPED=/tmp/bS/bin/attnbench_cuda.$v \
    timeout -k 5 100 bash bench/sm90_stamps.sh "$O/$v" > "$O/$v.log" 2>&1
  echo "$v rc=$?"
done
V=""; for v in head nostore notrans nolse; do V="$V $v:/tmp/bS/bin/attnbench_cuda.$v"; done
CASES=sparse_random_s99,sparse_local_window_s99 REPS=5 VARIANTS="$V" timeout -k 5 100 bash bench/kernel_ab.sh "$O/ab" > "$O/ab.log" 2>&1
head -5 "$O/ab/ab.md"
for v in head nostore notrans nolse; do echo "== $v"; grep -A9 "period by" "$O/$v/summary.md" | head -10; done
# 2) (next call) Nsight Compute source counters of head at 99% skipped (ncu/):
#   for c in sparse_random_s99 sparse_local_window_s99; do
#     CASE=$c NEW=/tmp/bP bash bench/ncu_vs_fa4.sh "$OUT/$c"; done
