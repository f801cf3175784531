# The scale folded into bf16 Q (one candidate for taking the scale FFMAs off the FMA pipe), in
# numpy against float64: LSE and O errors of a 1024 x 2048 attention with N(0, amp^2) inputs.
# Run: python3 prescale_precision.py (numpy); output in prescale_precision.txt.
import numpy as np
def bf16(x):
    x=np.asarray(x,dtype=np.float32); b=x.view(np.uint32).astype(np.uint64)
    r=((b+0x7fff+((b>>16)&1))>>16)<<16
    return r.astype(np.uint32).view(np.float32)
rng=np.random.default_rng(1)
for D,amp in [(128,1.0),(128,3.0),(64,1.0),(64,3.0)]:
  N=1024; M=2048
  q=bf16(rng.standard_normal((N,D))*amp); k=bf16(rng.standard_normal((M,D))*amp); v=bf16(rng.standard_normal((M,D)))
  scale=1/np.sqrt(D); l2e=1/np.log(2)
  s=(q.astype(np.float64)@k.T.astype(np.float64))*scale
  m=s.max(1,keepdims=True); p=np.exp(s-m); lse=(m[:,0]+np.log(p.sum(1)))
  o=(p@v.astype(np.float64))/p.sum(1,keepdims=True)
  # prescaled Q in bf16, scores in log2 units
  qs=bf16(q.astype(np.float32)*np.float32(scale*l2e))
  s2=(qs.astype(np.float64)@k.T.astype(np.float64))  # log2 units
  m2=s2.max(1,keepdims=True); p2=np.exp2(s2-m2); lse2=(m2[:,0]+np.log2(p2.sum(1)))/l2e
  p2b=bf16(p2)  # P rounded to bf16 as the kernel does
  o2=(p2b@v.astype(np.float64))/p2.sum(1,keepdims=True)
  # baseline: kernel-like without prescale: f32 scores, f32 scale
  s3=(q.astype(np.float32)@k.T.astype(np.float32)).astype(np.float64)
  m3=s3.max(1,keepdims=True); p3=np.exp2((s3-m3)*scale*l2e); lse3=m3[:,0]*scale+np.log(p3.sum(1))
  o3=(bf16(p3)@v.astype(np.float64))/p3.sum(1,keepdims=True)
  print(f"D={D} amp={amp}: lse err prescaled {np.abs(lse2-lse).max():.2e} baseline {np.abs(lse3-lse).max():.2e} | o_rel prescaled {np.abs(o2-o).max()/np.abs(o).max():.2e} baseline {np.abs(o3-o).max()/np.abs(o).max():.2e}")
