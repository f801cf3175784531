"""Per-call GPU timing with CUDA events, for the torch side of the benchmarks (compare_torch.py,
clock_soak.py): calls queued back to back, each between its own pair of events, as
attnbench_cuda times ours."""
import torch


def event_times(fn, n):
    """ms of each of n calls of fn queued back to back, each between its own pair of CUDA
    events, with one synchronize at the end."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for a, b in zip(starts, stops):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, stops)]


def once_ms(fn):
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize()
    a.record()
    fn()
    b.record()
    b.synchronize()
    return float(a.elapsed_time(b))
