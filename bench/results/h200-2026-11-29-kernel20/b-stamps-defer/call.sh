# stamped builds (persistent bf16 kernels with -DATTNSERVE_SM90_STAMPS=1): head (2e09bbc) and
# the deferred epilogue (a-defer/defer_epilogue.patch); per-tile stamps at 99% / 90% skipped
set -u
R=$PWD
(cd /tmp && rm -rf bS && tar -xJf "$R/.gpu-bundle/bS.tar.xz")
source /tmp/bS/env.sh
O=$OUT/s; mkdir -p "$O"
for v in head defer; do
  CASES="sparse_random_s99 sparse_local_window_s99 sparse_random_s90" STAMPED=/tmp/bS/bin/attnbench_cuda.$v \
    timeout -k 5 200 bash bench/sm90_stamps.sh "$O/$v" > "$O/$v.log" 2>&1
  echo "$v rc=$?"
done
cat "$O/head/summary.md" | head -80
echo =====
cat "$O/defer/summary.md" | head -80
