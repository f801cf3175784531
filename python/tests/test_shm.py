"""transport='shm': Q/K/V/O/LSE in a POSIX shared memory region registered with the server."""

import numpy as np
import pytest

import attnserve
from attnserve import Spec
from conftest import qkv
from reference import attention, max_lse_error, max_rel_error


@pytest.mark.parametrize("return_lse", [True, False])
def test_shm_matches_reference_and_grpc(address, rng, return_lse):
    q, k, v = qkv(rng, B=2, Nq=160, Hq=4, Hkv=2, D=32)
    spec = Spec.window(24, causal=True)
    with attnserve.Client(address) as c:
        r = c.attend(q, k, v, spec, transport="shm", return_lse=return_lse)
        assert r.header.outputs_in_regions
        ref_o, ref_lse = attention(q, k, v, spec.to_proto())
        assert max_rel_error(r.o, ref_o) < 1e-4
        if return_lse:
            assert max_lse_error(r.lse, ref_lse) < 1e-4
        else:
            assert r.lse is None
        g = c.attend(q, k, v, spec, return_lse=return_lse)
        np.testing.assert_array_equal(r.o, g.o)


def test_shm_region_is_reused_and_released(address, rng):
    with attnserve.Client(address) as c:
        before = {r.name for r in c.list_regions()}
        spec = Spec.dense(causal=True)
        for dtype in (np.float32, np.float16):
            q, k, v = qkv(rng, Nq=100, Hq=2, Hkv=1, D=32, dtype=dtype)
            r = c.attend(q, k, v, spec, transport="shm", return_lse=True)
            assert r.o.dtype == dtype
            ref_o, _ = attention(q, k, v, spec.to_proto())
            assert max_rel_error(r.o, ref_o) < (1e-4 if dtype == np.float32 else 2e-2)
        # The server drops a request's leases once its outputs are written, before the response.
        ours = [x for x in c.list_regions() if x.name not in before]
        assert len(ours) == 1 and ours[0].kind == "system" and ours[0].leases == 0
    with attnserve.Client(address) as c2:
        assert not [x for x in c2.list_regions() if x.name == ours[0].name]


def test_shm_bf16_bits(address, rng):
    q, k, v = (attnserve.f32_to_bf16_bits(x) for x in qkv(rng, Nq=64, Hq=4, Hkv=4, D=32))
    with attnserve.Client(address) as c:
        r = c.attend(q, k, v, Spec.dense(), dtype="bf16", transport="shm")
        g = c.attend(q, k, v, Spec.dense(), dtype="bf16")
    assert r.o.dtype == np.uint16
    np.testing.assert_array_equal(r.o, g.o)


def test_user_registered_region(client):
    """The low-level calls: a region of one's own, registered, listed and unregistered."""
    region = attnserve.ShmRegion(4096, name="py_test_user_region")
    try:
        st = client.register_shm_region(region.name, region.key, region.size)
        assert st.kind == "system" and st.bytes == 4096
        with pytest.raises(attnserve.AlreadyExists):
            client.register_shm_region(region.name, region.key, region.size)
        assert region.name in {r.name for r in client.list_regions()}
        assert not client.unregister_region(region.name).in_use
        with pytest.raises(attnserve.NotFound):
            client.unregister_region(region.name)
    finally:
        region.close()


def test_shared_arrays_are_read_and_written_in_place(address):
    rng = np.random.default_rng(77)
    spec = attnserve.Spec.dense(causal=True)
    with attnserve.Client(address) as c:
        with c.shared_arrays((1, 96, 4, 32), (1, 96, 2, 32), dtype="f32") as sa:
            assert sa.region.name in [r.name for r in c.list_regions()]
            for _ in range(2):  # the second call overwrites the first's O in place
                sa.q[...] = rng.uniform(-1, 1, sa.q.shape)
                sa.k[...] = rng.uniform(-1, 1, sa.k.shape)
                sa.v[...] = rng.uniform(-1, 1, sa.v.shape)
                sa.o[...] = np.nan  # poisoned: every element must be written by the server
                r = c.attend(sa.q, sa.k, sa.v, spec, return_lse=True)
                assert np.shares_memory(r.o, sa.o) and np.shares_memory(r.lse, sa.lse)
                assert r.header.outputs_in_regions
                ref_o, ref_lse = attention(sa.q, sa.k, sa.v, spec.to_proto())
                assert max_rel_error(r.o, ref_o) < 1e-4
                assert max_lse_error(r.lse, ref_lse) < 1e-4
            name = sa.region.name
        # Closed: unregistered, and gone at once (the server drops a request's region leases
        # before its response, so the close found the region idle).
        assert name not in [r.name for r in c.list_regions()]


def test_shared_arrays_refuse_outputs_of_another_shape(address):
    with attnserve.Client(address) as c:
        with c.shared_arrays((1, 64, 2, 32), dtype="f32") as sa:
            sa.q[...] = 0.5
            sa.k[...] = 0.25
            sa.v[...] = 1.0
            with pytest.raises(attnserve.InvalidArgument, match="o_region"):
                c.attend(sa.q[:, :32], sa.k, sa.v)  # Q of 32 rows: O would not be sa.o
