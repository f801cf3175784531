# FA4 dense N = 16384, D = 128 (bf16, Hq = Hkv = 16) timed four ways in one process, interleaved
# twice, with the SM clock sampled: queued (events per call, one sync), queued with a 256 MB
# memset before each call (outside the events), synchronized per call, and triton's do_bench.
import site, subprocess, sys, threading, time
site.addsitedir(sys.argv[1])
import numpy as np, torch, triton.testing
from flash_attn.cute.interface import flash_attn_func
torch.manual_seed(0)
q, k, v = (torch.rand(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in range(3))
fn = lambda: flash_attn_func(q, k, v, causal=False)
flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
for _ in range(3): fn()
torch.cuda.synchronize()
flops = 4 * 16 * 128 * 16384 * 16384
clocks = []
stop = False
def sample():
    while not stop:
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()
        clocks.append((time.time(), out)); time.sleep(0.05)
th = threading.Thread(target=sample); th.start()
def queued(n=20, with_flush=False):
    s = [torch.cuda.Event(enable_timing=True) for _ in range(n)]; e = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for a, b in zip(s, e):
        if with_flush: flush.zero_()
        a.record(); fn(); b.record()
    torch.cuda.synchronize(); return float(np.median([a.elapsed_time(b) for a, b in zip(s, e)]))
def synced(n=20):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True); a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return float(np.median(ts))
res = []
for rnd in range(2):
    for name, f in [("queued", queued), ("queued+flush", lambda: queued(with_flush=True)), ("synced", synced),
                    ("do_bench", lambda: float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")))]:
        t0 = time.time(); ms = f(); t1 = time.time()
        cl = [c for t, c in clocks if t0 <= t <= t1]
        res.append((rnd, name, ms, flops / ms / 1e9, cl[len(cl) // 2] if cl else "-"))
        print(f"round {rnd} {name:13s} {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s  clock,power mid-run: {res[-1][4]}", flush=True)
        time.sleep(1)
stop = True; th.join()
