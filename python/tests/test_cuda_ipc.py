"""CUDA IPC with torch CUDA tensors: read and written in place by a CUDA server on this host.

Skips without torch, without a visible GPU, or when the binary has no CUDA backend (a CPU build:
the server then answers FAILED_PRECONDITION, which this test also checks)."""

import subprocess

import numpy as np
import pytest

import attnserve
from attnserve import Spec
from conftest import Server, server_binary
from reference import attention, max_lse_error, max_rel_error

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)


@pytest.fixture(scope="module")
def cuda_server():
    help_text = subprocess.run([server_binary(), "--help"], capture_output=True, text=True).stdout
    if "cuda" not in help_text:
        pytest.skip("attnserve built without the CUDA backend")
    s = Server("--backend", "cuda")
    s_cmd_backend = attnserve.Client(s.address).describe().backend
    if s_cmd_backend != "cuda":
        s.stop()
        pytest.skip("the server did not start its CUDA backend")
    yield s
    s.stop()


def test_cuda_ipc_in_place(cuda_server):
    gen = torch.Generator(device="cuda").manual_seed(5)
    shape_q, shape_kv = (1, 512, 8, 64), (1, 512, 2, 64)
    q = torch.randn(shape_q, device="cuda", generator=gen).to(torch.bfloat16)
    k = torch.randn(shape_kv, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(shape_kv, device="cuda", generator=gen).to(torch.bfloat16)
    spec = Spec.dense(causal=True)
    with attnserve.Client(cuda_server.address) as c:
        r = c.attend(q, k, v, spec, return_lse=True)  # auto: cuda_ipc on the same host
        assert not c.list_regions()  # the call's regions are unregistered afterwards
        g = c.attend(q, k, v, spec, return_lse=True, transport="grpc")
    assert r.o.is_cuda and r.o.dtype == torch.bfloat16 and r.lse.is_cuda
    assert r.header.outputs_in_regions
    ref_o, ref_lse = attention(*(x.float().cpu().numpy() for x in (q, k, v)), spec.to_proto())
    assert max_rel_error(r.o.float().cpu().numpy(), ref_o) < 2e-2
    assert max_lse_error(r.lse.cpu().numpy(), ref_lse) < 2e-3
    assert g.o.is_cuda
    np.testing.assert_allclose(g.o.float().cpu().numpy(), r.o.float().cpu().numpy(), atol=2e-2)


def test_cuda_ipc_with_a_cpu_backend_server():
    """A server on its CPU backend: a CPU-only build refuses CUDA IPC (FAILED_PRECONDITION naming
    CUDA); a CUDA build on this GPU host opens the memory and copies it through host memory. Either
    way nothing wrong comes back."""
    server = Server("--backend", "cpu")
    gen = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn((1, 64, 2, 32), device="cuda", generator=gen)
    k = torch.randn((1, 64, 1, 32), device="cuda", generator=gen)
    v = torch.randn((1, 64, 1, 32), device="cuda", generator=gen)
    try:
        with attnserve.Client(server.address) as c:
            try:
                r = c.attend(q, k, v, Spec.dense(), transport="cuda_ipc")
            except attnserve.FailedPrecondition as e:
                assert "CUDA" in str(e)
                return
        ref_o, _ = attention(*(x.cpu().numpy() for x in (q, k, v)), Spec.dense().to_proto())
        assert r.o.is_cuda
        assert max_rel_error(r.o.cpu().numpy(), ref_o) < 1e-4
    finally:
        server.stop()


def test_cuda_tensors_through_grpc(address):
    """A CPU server: CUDA tensors travel through host memory and O comes back on the device."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn((1, 96, 4, 32), device="cuda", generator=gen).to(torch.bfloat16)
    k = torch.randn((1, 96, 2, 32), device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn((1, 96, 2, 32), device="cuda", generator=gen).to(torch.bfloat16)
    spec = Spec.dense(causal=True)
    with attnserve.Client(address) as c:
        r = c.attend(q, k, v, spec, return_lse=True)  # auto: grpc, the backend is cpu
    assert r.o.is_cuda and r.o.dtype == torch.bfloat16 and r.lse.is_cuda
    ref_o, _ = attention(*(x.float().cpu().numpy() for x in (q, k, v)), spec.to_proto())
    assert max_rel_error(r.o.float().cpu().numpy(), ref_o) < 2e-2


def test_ipc_export_shares_one_region_per_allocation():
    from attnserve.cuda_ipc import IpcPlan

    base = torch.empty(1 << 16, device="cuda")  # one caching-allocator block
    a, b = base[:1024], base[1024:2048]
    plan = IpcPlan()
    plan.add("q_region", a, 0)
    plan.add("k_region", b, 0)
    (req,) = plan.register_requests()
    assert len(req.cuda_ipc.handle) == 64 and req.cuda_ipc.bytes >= (1 << 16) * 4
    assert plan.refs["k_region"].offset - plan.refs["q_region"].offset == 4096
    assert plan.refs["q_region"].bytes == 4096
    with pytest.raises(attnserve.InvalidArgument, match="multiple of 64"):
        plan.add("v_region", base[1:5], 0)
