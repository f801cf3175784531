"""A context's life: create, appends guarded by expect_tokens, attends sending only Q (checked
against the reference over every row appended), get, list, delete."""

import numpy as np
import pytest

import attnserve
from attnserve import Spec
from reference import attention, max_lse_error, max_rel_error


def test_context_lifecycle(client, rng):
    name = "py-ctx-life"
    hkv, d, hq = 2, 32, 8
    st = client.create_context(name, "f32", kv_heads=hkv, head_dim=d, ttl=60)
    assert st.name == name and st.tokens == 0 and st.capacity_tokens == 0  # growable
    with pytest.raises(attnserve.AlreadyExists):
        client.create_context(name, "f32", kv_heads=hkv, head_dim=d)
    k0 = rng.standard_normal((120, hkv, d)).astype(np.float32)
    v0 = rng.standard_normal((120, hkv, d)).astype(np.float32)
    k1 = rng.standard_normal((1, 45, hkv, d)).astype(np.float32)  # [1, T, Hkv, D] works too
    v1 = rng.standard_normal((1, 45, hkv, d)).astype(np.float32)
    assert client.append_context(name, k0, v0, expect_tokens=0).tokens == 120
    with pytest.raises(attnserve.FailedPrecondition):
        client.append_context(name, k1, v1, expect_tokens=0)  # a doubled append is refused
    assert client.append_context(name, k1, v1, expect_tokens=120).tokens == 165
    assert client.get_context(name).tokens == 165
    assert name in {c.name for c in client.list_contexts()}

    k_all = np.concatenate([k0, k1[0]])[None]
    v_all = np.concatenate([v0, v1[0]])[None]
    spec = Spec.dense(causal=True)
    for nq in (1, 7):  # a decode step, and a chunk: aligned with the last rows
        q = rng.standard_normal((1, nq, hq, d)).astype(np.float32)
        r = client.attend(q, context=name, spec=spec, return_lse=True)
        ref_o, ref_lse = attention(q, k_all, v_all, spec.to_proto(), q_offset=165 - nq)
        assert max_rel_error(r.o, ref_o) < 1e-4
        assert max_lse_error(r.lse, ref_lse) < 1e-4
    # an explicit q_offset, and a window
    q = rng.standard_normal((1, 5, hq, d)).astype(np.float32)
    spec = Spec.window(30, causal=True)
    r = client.attend(q, context=name, spec=spec, q_offset=100)
    ref_o, _ = attention(q, k_all, v_all, spec.to_proto(), q_offset=100)
    assert max_rel_error(r.o, ref_o) < 1e-4
    assert client.get_context(name).attends == 3

    client.delete_context(name)
    with pytest.raises(attnserve.NotFound, match=name):
        client.get_context(name)
    with pytest.raises(attnserve.NotFound):
        client.attend(q, context=name, kv_heads=hkv)
    with pytest.raises(attnserve.NotFound):
        client.append_context(name, k0, v0)


def test_context_bf16_capacity(client, rng):
    name = "py-ctx-cap"
    st = client.create_context(name, "bf16", kv_heads=1, head_dim=32, capacity=64)
    try:
        assert st.capacity_tokens == 64
        k = attnserve.f32_to_bf16_bits(rng.standard_normal((64, 1, 32)))
        v = attnserve.f32_to_bf16_bits(rng.standard_normal((64, 1, 32)))
        client.append_context(name, k, v, dtype="bf16")
        with pytest.raises(attnserve.ResourceExhausted):
            client.append_context(name, k[:1], v[:1], dtype="bf16")
        q = attnserve.f32_to_bf16_bits(rng.standard_normal((1, 2, 4, 32)))
        r = client.attend(q, context=name, dtype="bf16", spec=Spec.dense(causal=True))
        assert r.o.dtype == np.uint16 and r.o.shape == (1, 2, 4, 32)
        f = attnserve.bf16_bits_to_f32
        ref_o, _ = attention(
            f(q), f(k)[None], f(v)[None], Spec.dense(causal=True).to_proto(), q_offset=62
        )
        assert max_rel_error(f(r.o), ref_o) < 2e-2
        with pytest.raises(attnserve.InvalidArgument):  # f32 Q against a bf16 context
            client.attend(f(q), context=name)
    finally:
        client.delete_context(name)


def test_create_context_checks(client):
    with pytest.raises(attnserve.InvalidArgument, match="capacity"):
        client.create_context("py-x", "f32", 1, 32, capacity=None, growable=False)
    with pytest.raises(attnserve.InvalidArgument, match="head_dim"):
        client.create_context("py-bad-head", "f32", kv_heads=1, head_dim=0)
