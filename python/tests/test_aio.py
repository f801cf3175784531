"""attnserve.aio.Client: the same calls under asyncio, task cancellation and deadlines."""

import asyncio

import numpy as np
import pytest

import attnserve
import attnserve.aio
from attnserve import Spec
from conftest import qkv
from reference import attention, max_rel_error


def run(coro):
    return asyncio.run(coro)


def test_aio_attend_describe_health(address, rng):
    q, k, v = qkv(rng, Nq=150, Hq=4, Hkv=2, D=32)
    spec = Spec.dilated([32, 64], [1, 2], causal=True)

    async def main():
        async with attnserve.aio.Client(address) as c:
            assert await c.health() == "SERVING"
            d = await c.describe()
            assert d.backend == "cpu" and "dense" in d.patterns
            results = await asyncio.gather(
                *(c.attend(q, k, v, spec) for _ in range(3)),
                c.attend(q, k, v, spec, transport="shm"),
            )
            return results

    results = run(main())
    ref_o, _ = attention(q, k, v, spec.to_proto())
    for r in results:
        assert max_rel_error(r.o, ref_o) < 1e-4


def test_aio_contexts(address, rng):
    k = rng.standard_normal((40, 1, 32)).astype(np.float32)
    v = rng.standard_normal((40, 1, 32)).astype(np.float32)
    q = rng.standard_normal((1, 1, 2, 32)).astype(np.float32)

    async def main():
        async with attnserve.aio.Client(address) as c:
            await c.create_context("py-aio-ctx", "f32", kv_heads=1, head_dim=32)
            st = await c.append_context("py-aio-ctx", k, v, expect_tokens=0)
            assert st.tokens == 40
            r = await c.attend(q, context="py-aio-ctx", causal=True)
            assert "py-aio-ctx" in {x.name for x in await c.list_contexts()}
            await c.delete_context("py-aio-ctx")
            with pytest.raises(attnserve.NotFound):
                await c.get_context("py-aio-ctx")
            return r

    r = run(main())
    ref_o, _ = attention(q, k[None], v[None], Spec.dense(causal=True).to_proto(), q_offset=39)
    assert max_rel_error(r.o, ref_o) < 1e-4


def test_aio_cancel_and_deadline(address, rng):
    q, k, v = qkv(rng, Nq=2048, Hq=8, Hkv=8, D=64)

    async def main():
        async with attnserve.aio.Client(address) as c:
            task = asyncio.ensure_future(c.attend(q, k, v))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(attnserve.DeadlineExceeded):
                await c.attend(q, k, v, timeout=0.05)
            with pytest.raises(attnserve.InvalidArgument, match="spec.window.size"):
                await c.attend(q[:, :8], k[:, :8], v[:, :8], Spec.window(-3))
            small = qkv(rng, Nq=16)
            return await c.attend(*small)

    assert run(main()).o.shape == (1, 16, 4, 32)
