"""TLS, mutual TLS and bearer tokens against a real attnserve: certificates from
scripts/gen-dev-certs (made per module into a temporary directory), tokens from a token file."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile

import numpy as np
import pytest

import attnserve
import attnserve.aio
from conftest import REPO, Server, qkv

ALICE = "alice-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def certs():
    d = tempfile.TemporaryDirectory(prefix="attnserve_py_certs_")
    subprocess.run(
        [os.path.join(REPO, "scripts", "gen-dev-certs"), d.name, "--test-extras"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with open(os.path.join(d.name, "py_tokens.txt"), "w") as f:
        f.write(f"alice {ALICE} max_request_bytes=1048576\n")
    yield d.name
    d.cleanup()


def cert(certs: str, name: str) -> str:
    return os.path.join(certs, name)


@pytest.fixture(scope="module")
def tls_server(certs):
    s = Server(
        "--tls-cert", cert(certs, "server.pem"),
        "--tls-key", cert(certs, "server.key"),
        "--token-file", cert(certs, "py_tokens.txt"),
    )  # fmt: skip
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mtls_server(certs):
    s = Server(
        "--tls-cert", cert(certs, "server.pem"),
        "--tls-key", cert(certs, "server.key"),
        "--tls-client-ca", cert(certs, "ca.pem"),
    )  # fmt: skip
    yield s
    s.stop()


def localhost(server) -> str:
    # The certificate names localhost and 127.0.0.1; connect by name to check the name matters.
    return "localhost:" + server.address.rsplit(":", 1)[1]


def test_tls_and_token_attend_matches_reference(certs, tls_server, rng, monkeypatch):
    monkeypatch.delenv("ATTNSERVE_TOKEN", raising=False)
    tls = attnserve.tls_credentials(ca_cert=cert(certs, "ca.pem"))
    q, k, v = qkv(rng, Nq=64)
    with attnserve.Client(localhost(tls_server), tls=tls, token=ALICE, timeout=30) as c:
        assert c.health() == "SERVING"
        o = c.attend(q, k, v).o
        s = np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, 2, axis=2)) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), np.repeat(v, 2, axis=2))
        assert np.abs(o - ref).max() < 1e-4
        # Over alice's max_request_bytes: refused, naming the limit.
        big = qkv(rng, Nq=2048)
        with pytest.raises(attnserve.ResourceExhausted, match="max_request_bytes=1048576"):
            c.attend(*big)


def test_missing_or_wrong_token_is_unauthenticated(certs, tls_server, rng, monkeypatch):
    monkeypatch.delenv("ATTNSERVE_TOKEN", raising=False)
    tls = attnserve.tls_credentials(ca_cert=cert(certs, "ca.pem"))
    q, k, v = qkv(rng, Nq=16)
    for token in (None, "wrong-0123456789abcdef0123456789"):
        with attnserve.Client(localhost(tls_server), tls=tls, token=token, timeout=30) as c:
            assert c.health() == "SERVING"  # health stays open
            with pytest.raises(attnserve.Unauthenticated) as e:
                c.attend(q, k, v)
            assert "alice" not in e.value.details
            with pytest.raises(attnserve.Unauthenticated):
                c.list_contexts()


def test_token_from_environment(certs, tls_server, rng, monkeypatch):
    monkeypatch.setenv("ATTNSERVE_TOKEN", ALICE)
    tls = attnserve.tls_credentials(ca_cert=cert(certs, "ca.pem"))
    q, k, v = qkv(rng, Nq=16)
    with attnserve.Client(localhost(tls_server), tls=tls, timeout=30) as c:
        assert c.attend(q, k, v).o.shape == q.shape


def test_wrong_ca_or_plaintext_cannot_connect(certs, tls_server, rng):
    q, k, v = qkv(rng, Nq=16)
    other = attnserve.tls_credentials(ca_cert=cert(certs, "other-ca.pem"))
    for tls in (other, None):
        with attnserve.Client(
            localhost(tls_server), tls=tls, token=ALICE, timeout=5, max_attempts=1
        ) as c:
            with pytest.raises(attnserve.Unavailable):
                c.attend(q, k, v)


def test_server_name_override(certs, tls_server, rng):
    # server_name replaces the name the certificate is checked against: "attnserve" is in it,
    # "not-it" is not.
    port = tls_server.address.rsplit(":", 1)[1]
    tls = attnserve.tls_credentials(ca_cert=cert(certs, "ca.pem"))
    with attnserve.Client(
        f"127.0.0.1:{port}", tls=tls, token=ALICE, server_name="attnserve", timeout=30
    ) as c:
        assert c.health() == "SERVING"
    with attnserve.Client(
        f"127.0.0.1:{port}", tls=tls, token=ALICE, server_name="not-it", timeout=5,
        max_attempts=1,
    ) as c:  # fmt: skip
        with pytest.raises(attnserve.Unavailable):
            c.health()


def test_mutual_tls_needs_a_client_certificate(certs, mtls_server, rng):
    q, k, v = qkv(rng, Nq=16)
    good = attnserve.tls_credentials(
        ca_cert=cert(certs, "ca.pem"),
        client_cert=cert(certs, "client.pem"),
        client_key=cert(certs, "client.key"),
    )
    with attnserve.Client(localhost(mtls_server), tls=good, timeout=30) as c:
        assert c.attend(q, k, v).o.shape == q.shape
    no_cert = attnserve.tls_credentials(ca_cert=cert(certs, "ca.pem"))
    wrong = attnserve.tls_credentials(
        ca_cert=cert(certs, "ca.pem"),
        client_cert=cert(certs, "other-client.pem"),
        client_key=cert(certs, "other-client.key"),
    )
    for tls in (no_cert, wrong):
        with attnserve.Client(localhost(mtls_server), tls=tls, timeout=5, max_attempts=1) as c:
            with pytest.raises(attnserve.Unavailable):
                c.health()
    with pytest.raises(ValueError, match="both or neither"):
        attnserve.tls_credentials(client_cert=cert(certs, "client.pem"))


def test_asyncio_client_with_tls_and_token(certs, tls_server, rng, monkeypatch):
    monkeypatch.delenv("ATTNSERVE_TOKEN", raising=False)
    q, k, v = qkv(rng, Nq=16)

    async def main():
        tls = attnserve.tls_credentials(ca_cert=cert(certs, "ca.pem"))
        async with attnserve.aio.Client(localhost(tls_server), tls=tls, token=ALICE) as c:
            assert await c.health() == "SERVING"
            assert (await c.attend(q, k, v)).o.shape == q.shape
        async with attnserve.aio.Client(localhost(tls_server), tls=tls) as c:
            with pytest.raises(attnserve.Unauthenticated):
                await c.list_contexts()

    asyncio.run(asyncio.wait_for(main(), timeout=60))
