# sustained alternation: name:bin pairs, case list
O=$1; shift; CASES=$1; shift; mkdir -p $O
for rep in 1 2 3; do for v in "$@"; do n=${v%%:*}; b=${v#*:}
  timeout 120 $b --cases=$CASES --warmup=20 --iters=200 --json=$O/sus_${n}_$rep.json > /dev/null 2>&1; done; done
python3 - $O "$@" <<'PY'
import json,sys,glob,collections,statistics
o=sys.argv[1]; names=[v.split(':')[0] for v in sys.argv[2:]]
d=collections.defaultdict(lambda: collections.defaultdict(list))
for n in names:
  for f in sorted(glob.glob(f'{o}/sus_{n}_*.json')):
    j=json.load(open(f))
    for c in j['results']:
      d[c['name']][n].append(c['ms_median'])
for c in d:
  base=statistics.median(d[c][names[0]])
  print(c, ' '.join(f"{n}={statistics.median(d[c][n]):.4f}({statistics.median(d[c][n])/base:.3f})" for n in names), {n:d[c][n] for n in names})
PY
