"""What the sync and asyncio clients share: channel set-up, call metadata, the health codec,
request builders for contexts, and the retry policy."""

from __future__ import annotations

import datetime
import os
import random
from typing import Any, Optional

import grpc

from . import tensors, wire
from ._plan import ContextInfo
from ._proto import pb
from .errors import InvalidArgument

SERVICE = "/attnserve.v1.AttentionService/"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # Each channel its own TCP connection (see `connections`).
    ("grpc.use_local_subchannel_pool", 1),
]


def credentials(tls: Any) -> Optional[grpc.ChannelCredentials]:
    """None/False: plaintext; True: TLS with the system roots; or ChannelCredentials (e.g. from
    attnserve.tls_credentials)."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    raise TypeError(f"tls: expected None, True or grpc.ChannelCredentials, got {type(tls)}")


def tls_credentials(
    ca_cert: Optional[str] = None,
    client_cert: Optional[str] = None,
    client_key: Optional[str] = None,
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files: ca_cert (the CA that signed the server's
    certificate; None: the system's roots) and, for a server with mutual TLS, client_cert and
    client_key (both or neither)."""
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key: give both or neither")

    def read(path: Optional[str]) -> Optional[bytes]:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_cert),
        private_key=read(client_key),
        certificate_chain=read(client_cert),
    )


def resolve_token(token: Optional[str]) -> Optional[str]:
    """The token to send: `token`, else the environment variable ATTNSERVE_TOKEN, else none."""
    if token:
        return token
    env = os.environ.get("ATTNSERVE_TOKEN", "").strip()
    return env or None


def channel_options(options: Optional[list], server_name: Optional[str]) -> list:
    """CHANNEL_OPTIONS, the caller's options and the TLS name override."""
    opts = CHANNEL_OPTIONS + list(options or [])
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return opts


def metadata(token: Optional[str]) -> tuple:
    token = resolve_token(token)
    return (("authorization", f"Bearer {token}"),) if token else ()


def is_local(address: str) -> bool:
    """Whether the address names this host (shared memory and CUDA IPC need the same host)."""
    a = address.split("://", 1)[-1]
    if address.startswith("unix:") or a.startswith("unix:"):
        return True
    host = a.rsplit(":", 1)[0] if not a.startswith("[") else a[1 : a.index("]")]
    return host in ("localhost", "::1", "0.0.0.0", "") or host.startswith("127.")


def encode_health(service: str) -> bytes:
    data = service.encode()
    return b"\x0a" + wire._varint(len(data)) + data if data else b""


def decode_health(raw: bytes) -> str:
    """HealthCheckResponse{status = 1} -> its name."""
    pos, status = 0, 0
    buf = memoryview(raw)
    while pos < len(buf):
        tag, pos = wire._read_varint(buf, pos)
        if tag & 7 == 0:
            value, pos = wire._read_varint(buf, pos)
            if tag >> 3 == 1:
                status = value
        elif tag & 7 == 2:
            n, pos = wire._read_varint(buf, pos)
            pos += n
        else:
            break
    return HEALTH_STATUS.get(status, str(status))


def backoff(
    attempt: int, initial: float = 0.1, multiplier: float = 2.0, maximum: float = 2.0
) -> float:
    """Seconds to wait before retry `attempt` (1-based), +-20% jitter."""
    return min(maximum, initial * multiplier ** (attempt - 1)) * random.uniform(0.8, 1.2)


def ttl_seconds(ttl: Any) -> int:
    if ttl is None:
        return 0
    if isinstance(ttl, datetime.timedelta):
        return int(ttl.total_seconds())
    return int(ttl)


def create_context_request(
    name: str,
    dtype: Any,
    kv_heads: int,
    head_dim: int,
    capacity: Optional[int],
    growable: bool,
    ttl: Any,
    shards: int,
) -> pb.CreateContextRequest:
    if capacity is None and not growable:
        raise InvalidArgument("capacity: give a capacity in tokens, or growable=True")
    if capacity is not None and capacity < 1:
        raise InvalidArgument(f"capacity: must be >= 1, got {capacity}")
    return pb.CreateContextRequest(
        name=name,
        dtype=tensors.dtype_from_name(dtype),
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        capacity_tokens=int(capacity or 0),
        ttl_seconds=ttl_seconds(ttl),
        shards=int(shards),
    )


def append_stream(
    name: str, k: Any, v: Any, expect_tokens: Optional[int], dtype: Any, chunk_bytes: int
):
    """AppendContext's messages (header, then K and V chunks) from [T, Hkv, D] or [1, T, Hkv, D]
    tensors."""
    rk, rv = tensors.to_raw(k, "k", dtype), tensors.to_raw(v, "v", dtype)
    if rk.shape != rv.shape or rk.dtype != rv.dtype:
        raise InvalidArgument(
            f"k, v: must be alike, got {list(rk.shape)} "
            f"{tensors.DTYPE_NAMES[rk.dtype]} and {list(rv.shape)} "
            f"{tensors.DTYPE_NAMES[rv.dtype]}"
        )
    shape = rk.shape
    if len(shape) == 4 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != 3 or shape[0] < 1:
        raise InvalidArgument(
            f"k, v: expected [T, Hkv, D] or [1, T, Hkv, D] with T >= 1, got " f"{list(rk.shape)}"
        )
    header = pb.AppendContextHeader(context=name, tokens=shape[0])
    if expect_tokens is not None:
        header.expect_tokens = int(expect_tokens)

    def messages():
        yield pb.AppendContextRequest(header=header)
        yield from wire.iter_chunks(pb.TENSOR_K, rk.bytes_view(), chunk_bytes)
        yield from wire.iter_chunks(pb.TENSOR_V, rv.bytes_view(), chunk_bytes)

    return messages


def context_info(status: pb.ContextStatus) -> ContextInfo:
    return ContextInfo(status.dtype, status.kv_heads, status.head_dim)


def resolve_transport(transport: str, q: Any, local: bool, backend: str) -> str:
    from ._plan import TRANSPORTS

    if transport not in TRANSPORTS:
        raise InvalidArgument(f"transport: expected one of {TRANSPORTS}, got {transport!r}")
    if transport != "auto":
        return transport
    if tensors.is_cuda_tensor(q) and local and backend == "cuda":
        return "cuda_ipc"
    return "grpc"
