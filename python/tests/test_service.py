"""Describe, Health, channel options and transports combined with contexts."""

import numpy as np
import pytest

import attnserve
from attnserve import Spec
from conftest import qkv
from reference import attention, max_rel_error


def test_describe_and_health(client):
    assert client.health() == "SERVING"
    d = client.describe()
    assert d.backend == "cpu" and d.devices[0].name == "cpu:0"
    assert d.limits.chunk_bytes > 0 and d.limits.max_chunk_bytes >= 4 << 20
    assert {"dense", "window", "dilated", "block_sparse"} <= set(d.patterns)
    assert {"f32", "f16", "bf16"} <= set(d.dtypes)


def test_token_and_connections(address, rng):
    q, k, v = qkv(rng, Nq=64)
    with attnserve.Client(address, token="secret", connections=3, timeout=None) as c:
        outs = [c.attend(q, k, v, Spec.window(4)).o for _ in range(4)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_tls_against_a_plaintext_server_fails_fast(address):
    with attnserve.Client(address, tls=True, timeout=5, max_attempts=1) as c:
        with pytest.raises((attnserve.Unavailable, attnserve.DeadlineExceeded)):
            c.describe()


def test_context_attend_over_shm(client, rng):
    name = "py-ctx-shm"
    client.create_context(name, "f16", kv_heads=2, head_dim=32)
    try:
        k = rng.standard_normal((1, 90, 2, 32)).astype(np.float16)
        v = rng.standard_normal((1, 90, 2, 32)).astype(np.float16)
        client.append_context(name, k, v)
        q = rng.standard_normal((1, 3, 4, 32)).astype(np.float16)
        spec = Spec.window(10, causal=True)
        r = client.attend(q, context=name, spec=spec, transport="shm", return_lse=True)
        g = client.attend(q, context=name, spec=spec, return_lse=True)
        np.testing.assert_array_equal(r.o, g.o)
        ref_o, _ = attention(q, k, v, spec.to_proto(), q_offset=87)
        assert max_rel_error(r.o, ref_o) < 2e-2
    finally:
        client.delete_context(name)
