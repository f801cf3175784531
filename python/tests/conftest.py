"""Fixtures: the real attnserve binary on the CPU backend, on a free loopback port.

ATTNSERVE_BIN names the binary (default: build/bin/attnserve of this checkout); ATTNCTL_BIN
attnctl (default: beside it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import attnserve  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def server_binary() -> str:
    return os.environ.get("ATTNSERVE_BIN", os.path.join(REPO, "build", "bin", "attnserve"))


def attnctl_binary() -> str:
    return os.environ.get("ATTNCTL_BIN", os.path.join(os.path.dirname(server_binary()), "attnctl"))


class Server:
    def __init__(self, *extra: str):
        binary = server_binary()
        if not os.path.isfile(binary):
            pytest.fail(f"attnserve binary not found at {binary} (set ATTNSERVE_BIN)")
        self.dir = tempfile.TemporaryDirectory(prefix="attnserve_py_")
        port_file = os.path.join(self.dir.name, "port")
        self.log = open(os.path.join(self.dir.name, "server.log"), "w+")
        args = [
            binary,
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            port_file,
            "--metrics-listen",
            "",
            "--backend",
            "cpu",
            "--log-level",
            "warn",
            *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                self.stop()
                pytest.fail(f"attnserve did not start: {self.log.read()[-2000:]}")
            time.sleep(0.02)
        self.address = f"127.0.0.1:{int(open(port_file).read().strip())}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def address(server) -> str:
    return server.address


@pytest.fixture
def client(address):
    with attnserve.Client(address, timeout=60) as c:
        yield c


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: reproducible, different per test."""
    seed = sum(request.node.name.encode()) * 7919 + len(request.node.name)
    return np.random.default_rng(seed)


def qkv(rng, B=1, Nq=128, Hq=4, Hkv=2, D=32, Nkv=None, dtype=np.float32):
    """Seeded random inputs (standard normal; never zeros)."""
    Nkv = Nq if Nkv is None else Nkv
    q = rng.standard_normal((B, Nq, Hq, D)).astype(dtype)
    k = rng.standard_normal((B, Nkv, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, Nkv, Hkv, D)).astype(dtype)
    return q, k, v
