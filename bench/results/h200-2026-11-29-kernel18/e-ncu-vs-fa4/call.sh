# wheels.3 + bundle bS (zse, the landed kernels): FA4 installed, then Nsight Compute of our kernel and
# FA4's on the same CSR at 90% skipped (random, local_window): elapsed cycles side by side
set -u
R=$PWD
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
cp .wheels.3/* /tmp/wh/
(cd /tmp && rm -rf bS && tar -xJf "$R/.gpu-bundle/bS.tar.xz"); st unpacked
/tmp/wh/install-wheels /tmp/wh /tmp/fa4site > "$OUT/install.log" 2>&1; st "install rc=$?"
O=$OUT/r; mkdir -p "$O"
for c in sparse_random_s90; do  # the second call: sparse_local_window_s90 sparse_random_s99, no install
  CASE=$c NEW=/tmp/bS FA4_SITE=/tmp/fa4site timeout -k 5 260 bash bench/ncu_vs_fa4.sh "$O/$c" > "$O/$c.log" 2>&1
  st "$c rc=$?"
  for s in own fa4; do
    echo "$c $s: $(grep -m1 -E '^\s+Elapsed Cycles' "$O/$c/$s.details.txt") | $(grep -m1 -E '^\s+Duration' "$O/$c/$s.details.txt") | $(grep -m1 -E '^\s+SM Frequency' "$O/$c/$s.details.txt")"
  done
  rm -rf "$O/$c/csr" "$O/$c"/*.ncu-rep
done
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
