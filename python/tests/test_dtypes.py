"""f16 and bf16 round trips in every form the client accepts, and GQA shapes."""

import numpy as np
import pytest

import attnserve
from attnserve import Spec
from conftest import qkv
from reference import attention, max_lse_error, max_rel_error

LOW_TOL = 2e-2  # attnctl --check's tolerance for f16/bf16


def test_f16(client, rng):
    q, k, v = qkv(rng, Nq=130, Hq=8, Hkv=2, D=64, dtype=np.float16)
    spec = Spec.window(20, causal=True)
    r = client.attend(q, k, v, spec, return_lse=True)
    assert r.o.dtype == np.float16 and r.o.shape == q.shape
    ref_o, ref_lse = attention(q, k, v, spec.to_proto())
    assert max_rel_error(r.o, ref_o) < LOW_TOL
    assert max_lse_error(r.lse, ref_lse) < LOW_TOL


def test_bf16_as_uint16_bits(client, rng):
    q32, k32, v32 = qkv(rng, Nq=150, Hq=4, Hkv=2, D=32)
    q, k, v = (attnserve.f32_to_bf16_bits(x) for x in (q32, k32, v32))
    assert q.dtype == np.uint16
    spec = Spec.dense(causal=True)
    r = client.attend(q, k, v, spec, dtype="bf16", return_lse=True)
    assert r.o.dtype == np.uint16 and r.o.shape == q.shape  # the same kind back: bf16 bits
    ref_o, ref_lse = attention(*(attnserve.bf16_bits_to_f32(x) for x in (q, k, v)), spec.to_proto())
    assert max_rel_error(attnserve.bf16_bits_to_f32(r.o), ref_o) < LOW_TOL
    assert max_lse_error(r.lse, ref_lse) < LOW_TOL
    # float32 inputs converted on the way out give the same bits
    r2 = client.attend(q32, k32, v32, spec, dtype="bf16")
    np.testing.assert_array_equal(r2.o, r.o)
    # uint16 without dtype= is refused before anything is sent
    with pytest.raises(attnserve.InvalidArgument, match="bf16"):
        client.attend(q, k, v, spec)


def test_bf16_bits_conversion_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38], dtype=np.float32)
    bits = attnserve.f32_to_bf16_bits(x)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0)
    np.testing.assert_array_equal(
        attnserve.bf16_bits_to_f32(bits)[:4], np.array([1.0, 1.0, 1.015625, -2.5], dtype=np.float32)
    )


def test_bf16_ml_dtypes(client, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q32, k32, v32 = qkv(rng, Nq=64, Hq=2, Hkv=1, D=32)
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q32, k32, v32))
    spec = Spec.window(8)
    r = client.attend(q, k, v, spec)
    assert r.o.dtype == ml_dtypes.bfloat16 and r.o.shape == q.shape
    ref_o, _ = attention(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), spec.to_proto()
    )
    assert max_rel_error(r.o.astype(np.float32), ref_o) < LOW_TOL


@pytest.mark.parametrize("torch_dtype", ["bfloat16", "float16", "float32"])
def test_torch_cpu_tensors(client, rng, torch_dtype):
    torch = pytest.importorskip("torch")
    q32, k32, v32 = qkv(rng, Nq=96, Hq=4, Hkv=2, D=32)
    dt = getattr(torch, torch_dtype)
    q, k, v = (torch.from_numpy(x).to(dt) for x in (q32, k32, v32))
    spec = Spec.dense(causal=True)
    r = client.attend(q, k, v, spec, return_lse=True)
    assert isinstance(r.o, torch.Tensor) and r.o.dtype == dt and tuple(r.o.shape) == q32.shape
    assert isinstance(r.lse, torch.Tensor) and r.lse.dtype == torch.float32
    ref_o, _ = attention(*(x.float().numpy() for x in (q, k, v)), spec.to_proto())
    tol = 1e-4 if torch_dtype == "float32" else LOW_TOL
    assert max_rel_error(r.o.float().numpy(), ref_o) < tol


def test_float64_needs_dtype(client, rng):
    q, k, v = qkv(rng, Nq=64, D=32, dtype=np.float64)
    with pytest.raises(attnserve.InvalidArgument, match="float64"):
        client.attend(q, k, v)
    r = client.attend(q, k, v, dtype="f32")
    assert r.o.dtype == np.float32
    ref_o, _ = attention(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), Spec.dense().to_proto()
    )
    assert max_rel_error(r.o, ref_o) < 1e-4


def test_non_contiguous_inputs(client, rng):
    """Strided views are made contiguous (a copy) rather than sent wrongly."""
    q, k, v = qkv(rng, Nq=64, Hq=2, Hkv=2, D=32)
    big = np.concatenate([q, q], axis=3)  # q is big[..., :32]
    r = client.attend(big[..., :32], k, v)
    ref_o, _ = attention(q, k, v, Spec.dense().to_proto())
    assert max_rel_error(r.o, ref_o) < 1e-4
