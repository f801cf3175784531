# bK warm (FA4 in /tmp/fa4site): FA4 in alternation with k2 (7 reps); sustained dense k2 vs FA4
set -u
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
source /tmp/bK/env.sh
B=/tmp/bK
O=$OUT/r; mkdir -p "$O"
timeout -k 5 300 python3 bench/fa4_interleaved.py --bench "$B/var/attnbench_cuda.k2" --fa4-site /tmp/fa4site --out "$O/il" --reps 7 > "$O/il.log" 2>&1
st "interleaved rc=$?"; rm -rf "$O/il/csr"; cat "$O/il/interleaved.md"
timeout -k 5 90 python3 bench/clock_soak.py --bench "$B/var/attnbench_cuda.k2" --fa4-site /tmp/fa4site --out "$O/soak" > "$O/soak.log" 2>&1
st "soak rc=$?"; cat "$O/soak/soak.md"
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$O"
st end
