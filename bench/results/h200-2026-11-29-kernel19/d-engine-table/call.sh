# bundle bL warm (the landed build): the engine table measured again, three runs with cuDNN as
# the attnserve row's engine (bench/engine_table.py --mean)
set -u
T0=$(date +%s); st() { echo "[$(($(date +%s) - T0)) s] $*"; }
[ -d /tmp/bL ] || (cd /tmp && tar -xJf "$PWD/.gpu-bundle/bL.tar.xz")
source /tmp/bL/env.sh
O=$OUT/r/engine-table; mkdir -p "$O"
for i in 1 2 3; do
  ATTNSERVE_ATTENTION_ENGINE=cudnn timeout -k 5 150 /tmp/bL/bin/attnbench_cuda \
    --cases=dense_n4096,dense_n4096_causal,dense_n16384,dense_n16384_causal,dense_n65536,dense_n65536_causal,dense_d64_n16384,dense_d64_n16384_causal \
    --warmup=3 --iters=30 --json="$O/bench_$i.json" --md="$O/bench_$i.md" > "$O/bench_$i.log" 2>&1
  st "run $i rc=$?"
done
python3 bench/engine_table.py --mean "$O"/bench_1.json "$O"/bench_2.json "$O"/bench_3.json
tar -C "$OUT" -cJf "$OUT/r.tar.xz" r && rm -rf "$OUT/r"
st end
