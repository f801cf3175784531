"""attnserve.Client: the synchronous client (one or more gRPC channels, thread-safe).

    client = attnserve.Client("localhost:50051")
    r = client.attend(q, k, v, Spec.window(256, causal=True), return_lse=True)
    r.o, r.lse, r.header.backend

Deadlines bound whole calls (retries included). Retries only where safe: an Attend that ends
UNAVAILABLE before any response message arrived is re-sent (attention has no side effects), and
so are the read-only unary calls (Describe, GetContext, ListContexts, ListRegions); appends,
creates, deletes and region registrations never are.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Optional

import grpc

from . import _common, tensors, wire
from ._plan import AttendPlan, AttendResult, ContextInfo, prepare_attend
from ._proto import pb
from .errors import AttnserveError, Cancelled, DataLoss, InvalidArgument, from_rpc_error
from .shm import SharedArrays, ShmPool
from .spec import SpecLike, to_spec_proto

_UNARY = {
    "Describe": (pb.DescribeRequest, pb.DescribeResponse, True),
    "RegisterRegion": (pb.RegisterRegionRequest, pb.RegisterRegionResponse, False),
    "UnregisterRegion": (pb.UnregisterRegionRequest, pb.UnregisterRegionResponse, False),
    "ListRegions": (pb.ListRegionsRequest, pb.ListRegionsResponse, True),
    "CreateContext": (pb.CreateContextRequest, pb.CreateContextResponse, False),
    "GetContext": (pb.GetContextRequest, pb.GetContextResponse, True),
    "DeleteContext": (pb.DeleteContextRequest, pb.DeleteContextResponse, False),
    "ListContexts": (pb.ListContextsRequest, pb.ListContextsResponse, True),
}


class _Channel:
    """One grpc channel and its method callables."""

    def __init__(self, address: str, creds, options):
        self.channel = _open_channel(grpc, address, creds, options)
        c = self.channel
        self.attend = c.stream_stream(
            _common.SERVICE + "Attend",
            request_serializer=wire.serialize,
            response_deserializer=wire.deserialize_response,
        )
        self.append = c.stream_unary(
            _common.SERVICE + "AppendContext",
            request_serializer=wire.serialize,
            response_deserializer=pb.AppendContextResponse.FromString,
        )
        self.health, self.unary = _unary_callables(c)


def _open_channel(grpc_module, address: str, creds, options):
    """A channel of `grpc_module` (grpc or grpc.aio): plaintext when creds is None."""
    if creds is None:
        return grpc_module.insecure_channel(address, options=options)
    return grpc_module.secure_channel(address, creds, options=options)


def _unary_callables(channel) -> tuple:
    """The health check and the unary methods of _UNARY on a grpc or grpc.aio channel."""
    health = channel.unary_unary(
        _common.HEALTH_CHECK,
        request_serializer=_common.encode_health,
        response_deserializer=_common.decode_health,
    )
    unary = {
        name: channel.unary_unary(
            _common.SERVICE + name,
            request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString,
        )
        for name, (req, resp, _) in _UNARY.items()
    }
    return health, unary


class Client:
    """A client of one attnserve server.

    address: "host:port"; tls: None (plaintext), True (TLS, system roots) or
    grpc.ChannelCredentials (attnserve.tls_credentials(ca_cert, client_cert, client_key) reads PEM
    files); token: sent as "authorization: Bearer TOKEN" (None: $ATTNSERVE_TOKEN when set);
    server_name: the name the server's TLS certificate must carry when it is not the address's
    host; timeout: default
    seconds per call (None: no deadline); connections: channels (TCP connections) that calls are
    spread over (one HTTP/2 connection carries about one stream's bytes per second);
    chunk_bytes: upload chunk size; max_attempts: tries of a retryable call.
    """

    def __init__(
        self,
        address: str,
        tls: Any = None,
        token: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        connections: int = 1,
        chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
        max_attempts: int = 4,
        options: Optional[list] = None,
        server_name: Optional[str] = None,
    ):
        if connections < 1 or chunk_bytes < 1 or max_attempts < 1:
            raise ValueError("connections, chunk_bytes and max_attempts must be >= 1")
        self.address = address
        self.timeout = timeout
        self.chunk_bytes = int(chunk_bytes)
        self.max_attempts = int(max_attempts)
        self._metadata = _common.metadata(token)
        creds = _common.credentials(tls)
        opts = _common.channel_options(options, server_name)
        self._channels = [_Channel(address, creds, opts) for _ in range(connections)]
        self._next = itertools.cycle(range(connections))
        self._local = _common.is_local(address)
        self._shm = ShmPool()
        self._shared: list = []  # SharedArrays made by shared_arrays(), until closed
        self._contexts: dict = {}
        self._describe: Optional[pb.DescribeResponse] = None
        self._lock = threading.Lock()

    # ---- plumbing ----
    def _channel(self) -> _Channel:
        with self._lock:
            return self._channels[next(self._next)]

    def _deadline(self, timeout) -> Optional[float]:
        t = self.timeout if timeout is None else timeout
        return None if t is None or t == float("inf") else time.monotonic() + t

    @staticmethod
    def _remaining(deadline: Optional[float]) -> Optional[float]:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _retry_wait(self, attempt: int, deadline: Optional[float]) -> bool:
        if attempt >= self.max_attempts:
            return False
        wait = _common.backoff(attempt)
        if deadline is not None and time.monotonic() + wait >= deadline:
            return False
        time.sleep(wait)
        return True

    def _unary(self, name: str, request, timeout=None):
        retryable = _UNARY[name][2]
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._channel().unary[name](
                    request, timeout=self._remaining(deadline), metadata=self._metadata
                )
            except grpc.RpcError as e:
                if (
                    retryable
                    and e.code() == grpc.StatusCode.UNAVAILABLE
                    and self._retry_wait(attempt, deadline)
                ):
                    continue
                raise from_rpc_error(e, name) from None

    # ---- service ----
    def describe(self, timeout: Optional[float] = None) -> pb.DescribeResponse:
        d = self._unary("Describe", pb.DescribeRequest(), timeout)
        self._describe = d
        return d

    def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """grpc.health.v1 status: "SERVING", "NOT_SERVING", ... (never retried)."""
        try:
            return self._channel().health(
                service, timeout=self._remaining(self._deadline(timeout)), metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e, "Health") from None

    # ---- attend ----
    def attend(
        self,
        q,
        k=None,
        v=None,
        spec: SpecLike = None,
        *,
        causal: Optional[bool] = None,
        scale: Optional[float] = None,
        return_lse: bool = False,
        q_offset: Optional[int] = None,
        context: str = "",
        kv_heads: Optional[int] = None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        placement=None,
        dtype=None,
        transport: str = "auto",
        timeout: Optional[float] = None,
        request_id: str = "",
        response_chunk_bytes: int = 0,
        _on_call=None,
    ) -> AttendResult:
        """Attention of q [B, Nq, Hq, D] over k, v [B, Nkv, Hkv, D] (or a context's rows).

        Arrays: numpy float32/float16, uint16 bf16 bits with dtype='bf16', ml_dtypes.bfloat16,
        or torch float32/float16/bfloat16 (CPU or CUDA); O comes back as the same kind. spec:
        Spec, AttentionSpec, or its proto3 JSON (dict or str); None is dense. transport: 'grpc'
        (chunks on the stream), 'shm' (POSIX shared memory, same host), 'cuda_ipc' (torch CUDA
        tensors read and written in place by a CUDA server on this host) or 'auto' (cuda_ipc
        for CUDA tensors when that applies, else grpc).
        """
        deadline = self._deadline(timeout)
        spec_proto = to_spec_proto(spec, causal, scale)
        info = self._context_info(context, kv_heads) if context else None
        backend, devices = "", None
        if transport in ("auto", "cuda_ipc") and tensors.is_cuda_tensor(q):
            d = self._describe or self.describe(timeout=self._remaining(deadline))
            backend, devices = d.backend, d.devices
        shared = self._shared_of(q) if transport in ("auto", "shm") else None
        mode = "shm" if shared is not None else _common.resolve_transport(
            transport, q, self._local, backend
        )
        plan = prepare_attend(
            q,
            k,
            v,
            spec_proto,
            transport=mode,
            return_lse=return_lse,
            q_offset=q_offset,
            context=context,
            context_info=info,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            placement=placement,
            dtype=dtype,
            request_id=request_id,
            response_chunk_bytes=response_chunk_bytes,
            chunk_bytes=self.chunk_bytes,
            server_devices=devices,
        )
        registered: list = []
        try:
            if shared is not None:
                plan.use_shared(shared)
            elif mode == "shm":
                self._attach_shm(plan, deadline)
            elif mode == "cuda_ipc":
                for req in plan.ipc.register_requests():
                    self._unary("RegisterRegion", req, self._remaining(deadline))
                    registered.append(req.name)
            return self._run_attend(plan, deadline, _on_call)
        finally:
            for name in registered:
                self._unregister_quietly(name)
            if plan.shm is not None:
                self._release_shm(plan.shm)

    def attend_future(self, *args, **kwargs) -> "AttendFuture":
        """attend() on a thread; the returned AttendFuture can cancel the call in flight."""
        return AttendFuture(self, args, kwargs)

    def _run_attend(self, plan: AttendPlan, deadline, on_call) -> AttendResult:
        attempt = 0
        while True:
            attempt += 1
            asm = plan.assembler()
            call = self._channel().attend(
                plan.requests(), timeout=self._remaining(deadline), metadata=self._metadata
            )
            if on_call is not None:
                on_call(call)
            try:
                for message in call:
                    asm.add(message)
                asm.finish()
                return plan.result(asm, attempt)
            except grpc.RpcError as e:
                if (
                    e.code() == grpc.StatusCode.UNAVAILABLE
                    and asm.messages == 0
                    and self._retry_wait(attempt, deadline)
                ):
                    continue
                raise from_rpc_error(e, "Attend") from None
            except DataLoss:
                call.cancel()
                raise

    def shared_arrays(self, q_shape, kv_shape=None, dtype="bf16", timeout=None) -> SharedArrays:
        """Q [B, Nq, Hq, D], K and V [B, Nkv, Hkv, D] (default: Q's shape), O and LSE as numpy arrays
        in one shared memory region registered with the server (same host). Fill q, k, v in place
        (bf16: uint16 bits) and call attend(sa.q, sa.k, sa.v, spec): nothing is copied, and the
        result's o and lse are sa.o and sa.lse. Close it (or use `with`) when done."""
        dt = tensors.dtype_from_name(dtype)
        q_shape = tuple(int(x) for x in q_shape)
        kv_shape = tuple(int(x) for x in (kv_shape or q_shape))
        if len(q_shape) != 4 or len(kv_shape) != 4:
            raise InvalidArgument("shared_arrays: shapes are [B, N, H, D]")
        sa = SharedArrays(q_shape, kv_shape, tensors.NP_CARRIER[dt], dt)
        try:
            self._unary("RegisterRegion", sa.region.register_request(), timeout or 30.0)
        except AttnserveError:
            sa.close()
            raise
        sa._on_close = self._close_shared
        self._shared.append(sa)
        return sa

    def _shared_of(self, q):
        for sa in self._shared:
            if sa.locate(q) is not None:
                return sa
        return None

    def _close_shared(self, sa) -> None:
        self._unregister_quietly(sa.region.name)
        if sa in self._shared:
            self._shared.remove(sa)

    def _attach_shm(self, plan: AttendPlan, deadline) -> None:
        region = self._shm.acquire(plan.shm_bytes())
        if not region.registered:
            try:
                self._unary("RegisterRegion", region.register_request(), self._remaining(deadline))
            except AttnserveError:
                self._shm.discard(region)
                raise
            region.registered = True
        plan.use_shm(region)

    def _release_shm(self, region) -> None:
        victim = self._shm.release(region)
        if victim is not None:
            self._unregister_quietly(victim.name)
            victim.close()

    def _unregister_quietly(self, name: str) -> None:
        try:
            self._unary("UnregisterRegion", pb.UnregisterRegionRequest(name=name), 10.0)
        except AttnserveError:
            pass

    # ---- regions ----
    def register_shm_region(
        self, name: str, shm_key: str, size: int, offset: int = 0, timeout=None
    ) -> pb.RegionStatus:
        req = pb.RegisterRegionRequest(
            name=name, system=pb.SystemRegion(shm_key=shm_key, offset=offset, bytes=size)
        )
        return self._unary("RegisterRegion", req, timeout).region

    def unregister_region(self, name: str, timeout=None) -> pb.UnregisterRegionResponse:
        return self._unary("UnregisterRegion", pb.UnregisterRegionRequest(name=name), timeout)

    def list_regions(self, timeout=None) -> list:
        return list(self._unary("ListRegions", pb.ListRegionsRequest(), timeout).regions)

    # ---- contexts ----
    def create_context(
        self,
        name: str,
        dtype: Any,
        kv_heads: int,
        head_dim: int,
        capacity: Optional[int] = None,
        growable: bool = True,
        ttl: Any = None,
        shards: int = 0,
        timeout=None,
    ) -> pb.ContextStatus:
        """A context of K/V rows kept on the server: capacity rows reserved now, or growable
        (capacity None); ttl seconds (or timedelta; None: the server's default)."""
        req = _common.create_context_request(
            name, dtype, kv_heads, head_dim, capacity, growable, ttl, shards
        )
        self._contexts.pop(name, None)
        status = self._unary("CreateContext", req, timeout).context
        self._contexts[name] = _common.context_info(status)
        return status

    def append_context(
        self, name: str, k, v, expect_tokens: Optional[int] = None, dtype=None, timeout=None
    ) -> pb.ContextStatus:
        """Appends rows k, v ([T, Hkv, D] or [1, T, Hkv, D]), streamed in chunks; never retried.
        expect_tokens: refused (FailedPrecondition) unless the context holds that many rows."""
        messages = _common.append_stream(name, k, v, expect_tokens, dtype, self.chunk_bytes)
        try:
            return (
                self._channel()
                .append(
                    messages(),
                    timeout=self._remaining(self._deadline(timeout)),
                    metadata=self._metadata,
                )
                .context
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e, "AppendContext") from None

    def get_context(self, name: str, timeout=None) -> pb.ContextStatus:
        status = self._unary("GetContext", pb.GetContextRequest(name=name), timeout).context
        self._contexts[name] = _common.context_info(status)
        return status

    def list_contexts(self, timeout=None) -> list:
        return list(self._unary("ListContexts", pb.ListContextsRequest(), timeout).contexts)

    def delete_context(self, name: str, timeout=None) -> pb.DeleteContextResponse:
        self._contexts.pop(name, None)
        return self._unary("DeleteContext", pb.DeleteContextRequest(name=name), timeout)

    def _context_info(self, name, kv_heads) -> ContextInfo:
        info = self._contexts.get(name)
        if info is None:
            self.get_context(name)
            info = self._contexts[name]
        if kv_heads is not None:
            info = ContextInfo(info.dtype, int(kv_heads), info.head_dim)
        return info

    # ---- lifetime ----
    def close(self) -> None:
        """Unregisters and frees the shared memory this client registered, closes channels."""
        for sa in list(self._shared):
            sa.close()
        for region in self._shm.drain():
            if region.registered:
                self._unregister_quietly(region.name)
            region.close()
        for c in self._channels:
            c.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AttendFuture:
    """An attend() running on its own thread. cancel() cancels the gRPC call in flight (the
    server frees its memory); result() then raises Cancelled."""

    def __init__(self, client: Client, args, kwargs):
        self._call = None
        self._cancelled = False
        self._done = threading.Event()
        self._result = self._error = None
        self._lock = threading.Lock()
        kwargs = dict(kwargs, _on_call=self._set_call)
        self._thread = threading.Thread(target=self._run, args=(client, args, kwargs), daemon=True)
        self._thread.start()

    def _set_call(self, call) -> None:
        with self._lock:
            self._call = call
            if self._cancelled:
                call.cancel()

    def _run(self, client, args, kwargs) -> None:
        try:
            self._result = client.attend(*args, **kwargs)
        except BaseException as e:  # handed to result()
            self._error = e
        finally:
            self._done.set()

    def cancel(self) -> bool:
        """Cancels the call; False when it had already finished."""
        with self._lock:
            if self._done.is_set():
                return False
            self._cancelled = True
            if self._call is not None:
                self._call.cancel()
        return True

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: Optional[float] = None) -> AttendResult:
        if not self._done.wait(timeout):
            raise TimeoutError("attend still running")
        if self._error is not None:
            if self._cancelled and isinstance(self._error, AttnserveError):
                raise Cancelled(self._error.details, method="Attend") from None
            raise self._error
        return self._result
