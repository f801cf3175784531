import os, site, sys, torch
site.addsitedir(sys.argv[1])
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from flash_attn.cute.interface import flash_attn_func
q, k, v = (torch.randn(1, 65536, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
kw = {}
if "sparse_random_s90".startswith("sparse_"):
    import fa4_blocks
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    rp, ci = fa4_blocks.load_csr("/root/out/r/sparse_random_s90/csr", "sparse_random_s90")
    nb = len(rp) - 1
    bs = fa4_blocks.layout_block_size(65536, rp)
    counts, idx = fa4_blocks.csr_to_kv_block_lists(rp, ci, nb)
    fc = torch.from_numpy(counts).cuda().view(1, 1, nb)
    fi = torch.from_numpy(idx).cuda().view(1, 1, nb, idx.shape[1])
    kw["block_sparse_tensors"] = BlockSparseTensorsTorch(
        mask_block_cnt=torch.zeros_like(fc), mask_block_idx=torch.zeros(
            (1, 1, nb, 1), dtype=torch.int32, device="cuda"),
        full_block_cnt=fc, full_block_idx=fi, block_size=(bs, bs))
for _ in range(3):
    flash_attn_func(q, k, v, causal=False, **kw)
torch.cuda.synchronize()
