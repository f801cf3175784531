"""Every spec kind through the real server (CPU backend) against the float64 reference."""

import json
import os
import subprocess
import tempfile

import numpy as np
import pytest

from attnserve import Spec
from conftest import attnctl_binary, qkv
from reference import attention, max_lse_error, max_rel_error

F32_TOL = 1e-4  # attnctl --check's tolerance for f32 on the cpu backend


def _csr_spec(nb: int, causal: bool) -> Spec:
    # Each query block keeps itself, block 0 and (for odd rows) the block two before it.
    row_ptr, col_idx = [0], []
    for i in range(nb):
        cols = sorted({0, i} | ({i - 2} if i % 2 and i >= 2 else set()))
        col_idx += cols
        row_ptr.append(len(col_idx))
    return Spec.csr(row_ptr, col_idx, block_size=64, causal=causal)


SPECS = {
    "dense": lambda c: Spec.dense(causal=c),
    "window": lambda c: Spec.window(37, causal=c),
    "dilated": lambda c: Spec.dilated(segment_lengths=[64, 128], dilation_rates=[1, 2], causal=c),
    "local_window": lambda c: Spec.block_sparse(local_window=1, block_size=64, causal=c),
    "dilated_sparse": lambda c: Spec.dilated_sparse([2, 3], block_size=64, causal=c),
    "global_local": lambda c: Spec.global_local(1, 0, block_size=64, causal=c),
    "strided": lambda c: Spec.strided(3, 0, block_size=64, causal=c),
    "csr": lambda c: _csr_spec(5, c),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_spec_matches_reference(client, rng, kind, causal):
    q, k, v = qkv(rng, B=2, Nq=300, Hq=4, Hkv=2, D=32)  # 300: a short last block
    spec = SPECS[kind](causal)
    r = client.attend(q, k, v, spec, return_lse=True)
    ref_o, ref_lse = attention(q, k, v, spec.to_proto())
    assert r.o.dtype == np.float32 and r.o.shape == q.shape
    assert r.lse.shape == (2, 4, 300)
    assert r.backend == "cpu"
    assert max_rel_error(r.o, ref_o) < F32_TOL
    assert max_lse_error(r.lse, ref_lse) < F32_TOL


def test_scale_and_json_spec(client, rng):
    q, k, v = qkv(rng, Nq=96, D=64)
    as_dict = {"window": {"size": 16}, "causal": True, "scale": 0.25}
    expect_o, expect_lse = attention(q, k, v, Spec.from_json(as_dict).to_proto())
    for spec in (as_dict, json.dumps(as_dict), Spec.window(16, causal=True, scale=0.25)):
        r = client.attend(q, k, v, spec, return_lse=True)
        assert max_rel_error(r.o, expect_o) < F32_TOL
        assert max_lse_error(r.lse, expect_lse) < F32_TOL
    # causal= and scale= override the spec's own
    r = client.attend(q, k, v, {"window": {"size": 16}}, causal=True, scale=0.25)
    assert max_rel_error(r.o, expect_o) < F32_TOL
    assert Spec.from_json(
        {"blockSparse": {"blockSize": 64, "localWindow": {"width": 2}}}
    ) == Spec.block_sparse(local_window=2, block_size=64)


@pytest.mark.parametrize("kind", ["dense", "window", "dilated", "local_window", "strided"])
def test_queries_against_more_keys(client, rng, kind):
    """Nq != Nkv with q_offset: a chunk of a prefill (rows 150..186 of 200 keys), and decode."""
    spec = SPECS[kind](True)
    for nq, nkv, off in ((37, 200, 150), (1, 200, 199), (16, 160, 160)):
        q, k, v = qkv(rng, Nq=nq, Nkv=nkv, Hq=4, Hkv=1, D=32)
        r = client.attend(q, k, v, spec, q_offset=off, return_lse=True)
        ref_o, ref_lse = attention(q, k, v, spec.to_proto(), q_offset=off)
        assert r.o.shape == q.shape
        assert max_rel_error(r.o, ref_o) < F32_TOL, (nq, nkv, off)
        assert max_lse_error(r.lse, ref_lse) < F32_TOL


def test_random_block_sparse_matches_attnctl(client, rng):
    """`random` draws blocks with the server's own generator: attnctl run --check verifies the
    server on these inputs against the C++ float64 reference, and our result must equal its O."""
    q, k, v = qkv(rng, B=1, Nq=320, Hq=4, Hkv=2, D=32)
    spec = Spec.random(0.3, seed=11, block_size=64, causal=True)
    r = client.attend(q, k, v, spec, return_lse=True)
    with tempfile.TemporaryDirectory() as d:
        paths = {n: os.path.join(d, f"{n}.npy") for n in ("q", "k", "v", "o", "lse")}
        for n, a in (("q", q), ("k", k), ("v", v)):
            np.save(paths[n], a)
        out = subprocess.run(
            [
                attnctl_binary(),
                "run",
                "--server",
                client.address,
                "--q",
                paths["q"],
                "--k",
                paths["k"],
                "--v",
                paths["v"],
                "--spec",
                json.dumps(spec.to_json()),
                "--check",
                "--out",
                paths["o"],
                "--lse",
                paths["lse"],
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "PASS" in out.stdout
        np.testing.assert_array_equal(r.o, np.load(paths["o"]))
        np.testing.assert_array_equal(r.lse, np.load(paths["lse"]))
    # The diagonal is always kept, so every row has keys.
    assert np.isfinite(r.lse).all()


def test_many_chunks_each_way(address, rng):
    """Small upload and response chunks: many messages, reassembled byte for byte."""
    import attnserve

    q, k, v = qkv(rng, B=1, Nq=200, Hq=4, Hkv=4, D=32)
    spec = Spec.dense(causal=True)
    with attnserve.Client(address, chunk_bytes=1000, connections=2) as c:
        r = c.attend(q, k, v, spec, return_lse=True, response_chunk_bytes=4096)
        r2 = c.attend(q, k, v, spec, return_lse=True)
    ref_o, _ = attention(q, k, v, spec.to_proto())
    assert max_rel_error(r.o, ref_o) < F32_TOL
    np.testing.assert_array_equal(r.o, r2.o)
    np.testing.assert_array_equal(r.lse, r2.lse)
