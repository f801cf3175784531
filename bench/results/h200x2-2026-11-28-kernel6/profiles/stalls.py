"""Stall samples of one ncu per-SASS export (ncu --page source --csv --print-source sass, gzipped):
the stall reasons over all samples, and the share of samples per opcode.

    python3 stalls.py dense_n16384.sass.csv.gz
"""
import csv,gzip,sys,collections,re
f=sys.argv[1]
rows=list(csv.reader(gzip.open(f,'rt')))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
stall_cols=[h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]
tot=collections.Counter(); byop=collections.Counter(); execs=collections.Counter(); total_samples=0
for r in data:
    try: s=int(r[ix['Warp Stall Sampling (All Samples)']])
    except: continue
    total_samples+=s
    src=r[ix['Source']].strip()
    op=re.sub(r'^@!?U?P\w+\s+','',src).split(' ')[0]
    byop[op.split('.')[0] if not op.startswith('WARPGROUP') and not op.startswith('SYNCS') else op]+=s
    for c in stall_cols:
        v=r[ix[c]]
        if v and v!='0': tot[c]+=int(v)
    try: execs[op.split('.')[0]]+=int(r[ix['Instructions Executed']])
    except: pass
print('samples',total_samples, 'instructions executed', sum(execs.values()))
print('stalls:', ', '.join('%s %.1f%%'%(k[6:],100*v/total_samples) for k,v in tot.most_common(10)))
print('by op:', ', '.join('%s %.1f%%'%(k,100*v/total_samples) for k,v in byop.most_common(14)))
