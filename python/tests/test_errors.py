"""Typed errors: server rejections naming the field, client-side checks, deadlines, cancellation
and an unreachable server (retried, then Unavailable)."""

import time

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import Spec
from conftest import qkv


def test_bad_spec_is_invalid_argument_naming_the_field(client, rng):
    q, k, v = qkv(rng, Nq=64)
    with pytest.raises(attnserve.InvalidArgument) as e:
        client.attend(q, k, v, Spec.window(-1))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.window.size" in e.value.details
    assert isinstance(e.value, ValueError) and isinstance(e.value, attnserve.AttnserveError)
    with pytest.raises(attnserve.InvalidArgument, match=r"spec\.dilated\.dilation_rates"):
        client.attend(q, k, v, Spec.dilated([16, 32], [1, 64]))
    with pytest.raises(attnserve.InvalidArgument, match=r"block_size"):
        client.attend(q, k, v, Spec.block_sparse(local_window=1, block_size=48))
    # the next request works
    assert client.attend(q, k, v).o.shape == q.shape


def test_client_side_checks_before_sending(client, rng):
    q, k, v = qkv(rng, Nq=64, Hq=4, Hkv=2)
    with pytest.raises(attnserve.InvalidArgument, match="expected \\[B, N, H, D\\]"):
        client.attend(q[0], k, v)
    with pytest.raises(attnserve.InvalidArgument, match="multiple of kv_heads"):
        client.attend(q[:, :, :3], k, v)
    with pytest.raises(attnserve.InvalidArgument, match="dtype"):
        client.attend(q, k.astype(np.float16), v)
    with pytest.raises(attnserve.InvalidArgument, match="shapes differ"):
        client.attend(q, k, v[:, :10])
    with pytest.raises(ValueError, match="exactly one generator"):
        Spec.block_sparse(local_window=1, strided=(2, 0))


def test_spec_json_errors(client, rng):
    q, k, v = qkv(rng, Nq=64)
    with pytest.raises(ValueError, match="spec"):
        client.attend(q, k, v, {"windoww": {"size": 3}})


def test_deadline_expires(client, rng):
    q, k, v = qkv(rng, Nq=2048, Hq=8, Hkv=8, D=64)  # ~0.3 s of CPU compute, 12 MiB up
    start = time.monotonic()
    with pytest.raises(attnserve.DeadlineExceeded) as e:
        client.attend(q, k, v, Spec.dense(), timeout=0.05)
    assert time.monotonic() - start < 5
    assert isinstance(e.value, TimeoutError)
    small = qkv(rng, Nq=32)
    assert client.attend(*small).o.shape == small[0].shape


def test_cancel_in_flight(client, rng):
    q, k, v = qkv(rng, Nq=2048, Hq=8, Hkv=8, D=64)
    future = client.attend_future(q, k, v, Spec.dense())
    time.sleep(0.05)
    assert future.cancel()
    with pytest.raises(attnserve.Cancelled):
        future.result(timeout=30)
    # a finished future cannot be cancelled, and its result stays
    small = qkv(rng, Nq=32)
    done = client.attend_future(*small)
    r = done.result(timeout=30)
    assert not done.cancel() and r.o.shape == small[0].shape


def test_unreachable_server_is_unavailable_after_retries():
    with attnserve.Client("127.0.0.1:1", timeout=10, max_attempts=3) as c:
        start = time.monotonic()
        with pytest.raises(attnserve.Unavailable) as e:
            c.attend(*qkv(np.random.default_rng(1), Nq=8))
        assert time.monotonic() - start > 0.15  # two backoffs of >= 0.08 s
        assert isinstance(e.value, ConnectionError)
        with pytest.raises(attnserve.Unavailable):
            c.describe()


def test_error_for_maps_every_code():
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        err = attnserve.error_for(code, "x")
        assert err.code == code and isinstance(err, attnserve.AttnserveError)
    assert type(attnserve.error_for(grpc.StatusCode.NOT_FOUND, "x")) is attnserve.NotFound
