"""POSIX shared memory regions (RegisterRegion with a SystemRegion), as the C++ client uses them.

One region holds a request's Q, K, V, O and LSE, each at a 64-byte aligned offset (the server
refuses other offsets), in that order; the header names byte ranges of it (q_region ... lse_region)
and the request stream is just the header. The caller's inputs are complete before Attend is sent
(plain memory writes), and O and LSE are complete once the response header arrives.

ShmPool keeps regions registered between calls (registering costs two RPCs and an mmap on the
server), handing each out to one call at a time.
"""

from __future__ import annotations

import itertools
import os
import threading
from multiprocessing import shared_memory
from typing import Optional

import numpy as np

from ._proto import pb

ALIGN = 64
_counter = itertools.count()


def align(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Aligned offsets of consecutive tensors of these byte sizes, and the total size."""
    offsets, pos = [], 0
    for n in sizes:
        pos = align(pos)
        offsets.append(pos)
        pos += n
    return offsets, max(pos, 1)


class ShmRegion:
    """A POSIX shared memory object of `size` bytes (shm_open + mmap), unlinked by close()."""

    def __init__(self, size: int, name: Optional[str] = None):
        self.size = int(size)
        self.name = name or f"py_{os.getpid()}_{next(_counter)}"  # the server-side region name
        self._shm = shared_memory.SharedMemory(create=True, size=self.size)
        raw = self._shm._name if hasattr(self._shm, "_name") else self._shm.name
        self.key = raw if raw.startswith("/") else "/" + raw  # what shm_open takes
        self.registered = False

    @property
    def buf(self) -> memoryview:
        return self._shm.buf

    def ndarray(self, offset: int, shape: tuple, dtype) -> np.ndarray:
        """A numpy view of the region's bytes at offset (valid until close())."""
        return np.ndarray(shape, dtype=dtype, buffer=self._shm.buf, offset=offset)

    def register_request(self) -> pb.RegisterRegionRequest:
        return pb.RegisterRegionRequest(
            name=self.name, system=pb.SystemRegion(shm_key=self.key, offset=0, bytes=self.size)
        )

    def ref(self, offset: int, nbytes: int) -> pb.RegionRef:
        return pb.RegionRef(region=self.name, offset=offset, bytes=nbytes)

    def close(self) -> None:
        if self._shm is None:
            return
        try:
            self._shm.close()
        finally:
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass
            self._shm = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class SharedArrays:
    """Q, K, V, O and LSE as numpy arrays inside one shared memory region that the server has
    registered (Client.shared_arrays): fill q, k and v in place, pass them to attend(), and the
    server reads them where they are and writes O and LSE into o and lse -- no copy on either
    side. The result's o and lse are these arrays (the next attend with them overwrites them).
    Carrier dtypes: float32, float16, or uint16 holding bf16 bits. close() unregisters and frees
    the region (the Client closes any left open)."""

    def __init__(self, q_shape: tuple, kv_shape: tuple, carrier: np.dtype, dtype: int):
        b, n, hq, d = q_shape
        self.dtype = dtype  # proto DType
        it = carrier.itemsize
        sizes = [
            int(np.prod(q_shape)) * it,
            int(np.prod(kv_shape)) * it,
            int(np.prod(kv_shape)) * it,
            int(np.prod(q_shape)) * it,
            b * hq * n * 4,
        ]
        offsets, total = layout(sizes)
        self.region = ShmRegion(total)
        self.q = self.region.ndarray(offsets[0], q_shape, carrier)
        self.k = self.region.ndarray(offsets[1], kv_shape, carrier)
        self.v = self.region.ndarray(offsets[2], kv_shape, carrier)
        self.o = self.region.ndarray(offsets[3], q_shape, carrier)
        self.lse = self.region.ndarray(offsets[4], (b, hq, n), np.dtype("<f4"))
        self.o_offset, self.lse_offset = offsets[3], offsets[4]
        self._bytes = self.region.ndarray(0, (total,), np.uint8)
        self._base = self._bytes.ctypes.data
        self._on_close = None

    def locate(self, arr) -> Optional[int]:
        """The byte offset of a C-contiguous numpy array lying wholly inside the region, else
        None."""
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            return None
        off = arr.ctypes.data - self._base
        if off < 0 or off + arr.nbytes > self.region.size:
            return None
        return off

    def close(self) -> None:
        if self.region is None:
            return
        if self._on_close is not None:
            self._on_close(self)
        del self.q, self.k, self.v, self.o, self.lse, self._bytes
        self.region.close()
        self.region = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ShmPool:
    """Registered regions reused across calls; acquire() hands one out exclusively."""

    def __init__(self, max_free: int = 4):
        self._free: list[ShmRegion] = []
        self._all: list[ShmRegion] = []
        self._lock = threading.Lock()
        self._max_free = max_free

    def acquire(self, size: int) -> ShmRegion:
        """A free region of at least `size` bytes, or a new unregistered one (the caller
        registers it: region.registered False)."""
        with self._lock:
            fits = [r for r in self._free if r.size >= size]
            if fits:
                r = min(fits, key=lambda r: r.size)
                self._free.remove(r)
                return r
        r = ShmRegion(max(size, 1 << 20))
        with self._lock:
            self._all.append(r)
        return r

    def release(self, region: ShmRegion) -> Optional[ShmRegion]:
        """Returns a region to the pool; returns a region the caller should unregister and close
        when the pool is over its size (the smallest), else None."""
        with self._lock:
            self._free.append(region)
            if len(self._free) <= self._max_free:
                return None
            victim = min(self._free, key=lambda r: r.size)
            self._free.remove(victim)
            self._all.remove(victim)
            return victim

    def discard(self, region: ShmRegion) -> None:
        with self._lock:
            if region in self._all:
                self._all.remove(region)
        region.close()

    def drain(self) -> list[ShmRegion]:
        """Every region (the caller unregisters and closes them)."""
        with self._lock:
            out, self._all, self._free = self._all, [], []
        return out
