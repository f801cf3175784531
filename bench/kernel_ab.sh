#!/usr/bin/env bash
# Interleaved A/B of attnbench_cuda builds (or flag sets) on one GPU: every variant runs the same
# cases once per round, REPS rounds, so that clock and thermal drift spread over all of them;
# then a table of per-case medians and each variant's ratio to the first.
#
# Usage (on the GPU host, bundles unpacked):
#   VARIANTS="old:/tmp/a/attnbench_cuda new:/tmp/b/attnbench_cuda new192:/tmp/b/attnbench_cuda:--sm90_query_tile=192" \
#     REPS=4 bench/kernel_ab.sh OUT
#   (name:binary[:flag,flag...]; CASES= to choose cases, default the kernel comparison's eight)
# Writes OUT/ab_<name>_<rep>.json (attnbench_cuda --json) and OUT/ab.md (the table).
set -u
OUT=${1:?usage: VARIANTS="name:binary[:flags] ..." $0 OUT}
mkdir -p "$OUT"
REPS=${REPS:-3}
CASES=${CASES:-dense_n16384,dense_n16384_causal,dense_d64_n16384,dense_d64_n16384_causal,sparse_random_s90,sparse_local_window_s90,sparse_random_s99,sparse_local_window_s99}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T0=$(date +%s)
for rep in $(seq 1 "$REPS"); do
  for v in ${VARIANTS:?VARIANTS}; do
    IFS=: read -r name bin flags <<< "$v"
    # shellcheck disable=SC2046
    timeout -k 5 120 "$bin" --cases="$CASES" --warmup=3 --iters=20 $(echo "${flags:-}" | tr ',' ' ') \
      --json="$OUT/ab_${name}_$rep.json" > "$OUT/ab_${name}_$rep.log" 2>&1
    echo "$name rep $rep rc=$? at $(($(date +%s) - T0)) s"
  done
done
python3 - "$OUT" ${VARIANTS} <<'PY' | tee "$OUT/ab.md"
import collections, glob, json, os, statistics, sys
out, names = sys.argv[1], [v.split(':')[0] for v in sys.argv[2:]]
ms = collections.defaultdict(lambda: collections.defaultdict(list))
ok = collections.defaultdict(lambda: True)
for f in sorted(glob.glob(os.path.join(out, 'ab_*.json'))):
    name = os.path.basename(f)[3:-5].rsplit('_', 1)[0]
    for r in json.load(open(f))['results']:
        if r['variant'] == 'own':
            ms[r['name']][name].append(r['ms_median'])
            ok[(r['name'], name)] &= bool(r['check']['ok'])
print('| case | ' + ' | '.join(f'{n} ms' for n in names) + ' | ' +
      ' | '.join(f'{n}/{names[0]}' for n in names[1:]) + ' |')
print('|---' * (2 * len(names)) + '|')
for case, d in ms.items():
    med = {n: statistics.median(d[n]) for n in names if d[n]}
    cells = [f"{med[n]:.3f}{'' if ok[(case, n)] else ' FAIL'}" if n in med else '-' for n in names]
    ratios = [f"{med[n] / med[names[0]]:.3f}" if n in med and names[0] in med else '-'
              for n in names[1:]]
    print(f'| {case} | ' + ' | '.join(cells + ratios) + ' |')
print()
for case, d in ms.items():
    print(f'- {case}: ' + '; '.join(f"{n} " + ', '.join(f'{x:.3f}' for x in d[n]) for n in names))
PY
