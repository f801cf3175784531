import site, sys, torch
site.addsitedir(sys.argv[1])
from flash_attn.cute.interface import flash_attn_func
launches = int(sys.argv[2])
for case in sys.argv[3:]:
    d = 64 if "_d64_" in case else 128
    causal = case.endswith("_causal")
    q, k, v = (torch.randn(1, 16384, 16, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flash_attn_func(q, k, v, causal=causal)  # compiles; its launch is left out of the median
    torch.cuda.synchronize()
    for _ in range(launches):
        flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
