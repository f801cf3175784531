import site, sys, torch
site.addsitedir(sys.argv[1])
from flash_attn.cute.interface import flash_attn_func
q, k, v = (torch.randn(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    flash_attn_func(q, k, v, causal=False)
torch.cuda.synchronize()
