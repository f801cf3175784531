import numpy as np, sys
raw=open(sys.argv[1],'rb').read()
head=np.frombuffer(raw[:20],dtype=np.int32); _,c,w,t,wd=head
tab=np.frombuffer(raw[20:],dtype=np.uint64).reshape(c,w,t,wd).astype(np.int64)
rows=[]
for ci in range(c):
  for wi in range(w):
    x=tab[ci,wi]; x=x[x[:,0]!=0]
    idx=x[:,wd-1]&0xffffffff
    sel=x[(idx==0)&(x[:,8]!=0)&(x[:,9]!=0)]
    rows.append(sel)
a=np.concatenate(rows)
def st(v): return f"median {np.median(v):.0f} mean {v.mean():.0f} p10 {np.percentile(v,10):.0f} p90 {np.percentile(v,90):.0f}"
print('n',len(a))
print('end->epilogue start (7->8)',st(a[:,8]-a[:,7]))
print('sums/syncwarp (8->10)',st(a[:,10]-a[:,8]))
print('row0: inv, packs, transposes, 4 stores, lse (10->11)',st(a[:,11]-a[:,10]))
print('row1 (11->12)',st(a[:,12]-a[:,11]))
print('after (12->9)',st(a[:,9]-a[:,12]))
print('total (8->9)',st(a[:,9]-a[:,8]))
