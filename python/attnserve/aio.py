"""attnserve.aio.Client: the asyncio client (grpc.aio), with the methods of attnserve.Client.

    async with attnserve.aio.Client("localhost:50051") as client:
        r = await client.attend(q, k, v, Spec.dense(causal=True))

Cancelling the task that awaits a call cancels the gRPC call (the server frees its memory).
Unary calls run on grpc.aio; Attend and AppendContext stream on worker threads (see _in_thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
import time
from typing import Any, Optional

import grpc
import grpc.aio

from . import _common, wire
from ._plan import AttendResult
from ._proto import pb
from .client import _UNARY, _open_channel, _unary_callables
from .client import Client as SyncClient
from .errors import from_rpc_error
from .spec import SpecLike


class _Channel:
    def __init__(self, address: str, creds, options):
        self.channel = _open_channel(grpc.aio, address, creds, options)
        self.health, self.unary = _unary_callables(self.channel)


class _CallHolder:
    """The sync call of a thread, cancellable from the event loop before or after it starts."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: list = []
        self._cancelled = False

    def set(self, call) -> None:
        with self._lock:
            self._calls.append(call)
            if self._cancelled:
                call.cancel()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            for call in self._calls:
                call.cancel()


class Client:
    """The asyncio twin of attnserve.Client (same arguments, awaitable methods). Create it inside
    the event loop that uses it."""

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
        max_streams: int = 64,
    ):
        if connections < 1 or chunk_bytes < 1 or max_attempts < 1:
            raise ValueError("connections, chunk_bytes and max_attempts must be >= 1")
        self.address, self.timeout = address, timeout
        self.chunk_bytes, self.max_attempts = int(chunk_bytes), int(max_attempts)
        self._metadata = _common.metadata(token)
        creds = _common.credentials(tls)
        opts = _common.channel_options(options, server_name)
        self._channels = [_Channel(address, creds, opts) for _ in range(connections)]
        self._next = itertools.cycle(range(connections))
        # Attend and AppendContext stream through a sync client on worker threads (see
        # _in_thread); it holds the shared memory regions and the contexts' shapes.
        self._sync = SyncClient(
            address,
            tls=tls,
            token=token,
            timeout=timeout,
            connections=connections,
            chunk_bytes=chunk_bytes,
            max_attempts=max_attempts,
            options=options,
            server_name=server_name,
        )
        self._contexts = self._sync._contexts
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_streams, thread_name_prefix="attnserve-aio"
        )

    def _channel(self) -> _Channel:
        return self._channels[next(self._next)]

    def _deadline(self, timeout) -> Optional[float]:
        t = self.timeout if timeout is None else timeout
        return None if t is None or t == float("inf") else time.monotonic() + t

    @staticmethod
    def _remaining(deadline):
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    async def _retry_wait(self, attempt: int, deadline) -> bool:
        if attempt >= self.max_attempts:
            return False
        wait = _common.backoff(attempt)
        if deadline is not None and time.monotonic() + wait >= deadline:
            return False
        await asyncio.sleep(wait)
        return True

    async def _unary(self, name: str, request, timeout=None):
        retryable = _UNARY[name][2]
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._channel().unary[name](
                    request, timeout=self._remaining(deadline), metadata=self._metadata
                )
            except grpc.RpcError as e:
                if (
                    retryable
                    and e.code() == grpc.StatusCode.UNAVAILABLE
                    and await self._retry_wait(attempt, deadline)
                ):
                    continue
                raise from_rpc_error(e, name) from None

    async def describe(self, timeout=None) -> pb.DescribeResponse:
        d = await self._unary("Describe", pb.DescribeRequest(), timeout)
        self._sync._describe = d
        return d

    async def health(self, service: str = "", timeout=None) -> str:
        try:
            return await self._channel().health(
                service, timeout=self._remaining(self._deadline(timeout)), metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e, "Health") from None

    async def attend(self, q, k=None, v=None, spec: SpecLike = None, **kwargs) -> AttendResult:
        """See attnserve.Client.attend (same arguments)."""
        return await self._in_thread(self._sync.attend, "_on_call", q, k, v, spec, **kwargs)

    async def _in_thread(self, fn, hook: str, *args, **kwargs):
        """Runs a streaming call of the sync client on a worker thread; cancelling the awaiting
        task cancels the gRPC call. (grpc.aio reports INTERNAL instead of the server's status when
        a write fails because the server has just ended the stream, grpc/grpc#36066; the sync
        stack reports the server's status.)"""
        holder = _CallHolder()
        if hook:
            kwargs[hook] = holder.set
        future = asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(fn, *args, **kwargs)
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            holder.cancel()
            # The thread ends with Cancelled; retrieve it so asyncio does not log it.
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    async def register_shm_region(
        self, name: str, shm_key: str, size: int, offset: int = 0, timeout=None
    ) -> pb.RegionStatus:
        req = pb.RegisterRegionRequest(
            name=name, system=pb.SystemRegion(shm_key=shm_key, offset=offset, bytes=size)
        )
        return (await self._unary("RegisterRegion", req, timeout)).region

    async def unregister_region(self, name: str, timeout=None):
        return await self._unary("UnregisterRegion", pb.UnregisterRegionRequest(name=name), timeout)

    async def list_regions(self, timeout=None) -> list:
        return list((await self._unary("ListRegions", pb.ListRegionsRequest(), timeout)).regions)

    async def create_context(
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
        req = _common.create_context_request(
            name, dtype, kv_heads, head_dim, capacity, growable, ttl, shards
        )
        self._contexts.pop(name, None)
        status = (await self._unary("CreateContext", req, timeout)).context
        self._contexts[name] = _common.context_info(status)
        return status

    async def append_context(
        self, name: str, k, v, expect_tokens: Optional[int] = None, dtype=None, timeout=None
    ) -> pb.ContextStatus:
        """See attnserve.Client.append_context (never retried)."""
        return await self._in_thread(
            self._sync.append_context, "", name, k, v, expect_tokens, dtype, timeout
        )

    async def get_context(self, name: str, timeout=None) -> pb.ContextStatus:
        status = (await self._unary("GetContext", pb.GetContextRequest(name=name), timeout)).context
        self._contexts[name] = _common.context_info(status)
        return status

    async def list_contexts(self, timeout=None) -> list:
        return list((await self._unary("ListContexts", pb.ListContextsRequest(), timeout)).contexts)

    async def delete_context(self, name: str, timeout=None) -> pb.DeleteContextResponse:
        self._contexts.pop(name, None)
        return await self._unary("DeleteContext", pb.DeleteContextRequest(name=name), timeout)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._sync.close)
        self._pool.shutdown(wait=False)
        for c in self._channels:
            await c.channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
