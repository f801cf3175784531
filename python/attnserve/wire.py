"""The Attend/AppendContext byte streams, shared by the sync and asyncio clients.

Tensor chunks are encoded by hand: a chunk message is a few bytes of protobuf framing followed by
a slice of the tensor's buffer, joined into one bytes object (one copy of the payload, no
intermediate protobuf object). Response chunks are decoded the same way into memoryview slices
of the received message and copied once into the output array. Headers go through protobuf.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

from . import tensors
from ._proto import pb
from .errors import DataLoss

DEFAULT_CHUNK_BYTES = 4 << 20
TENSOR_NAMES = {
    pb.TENSOR_Q: "q",
    pb.TENSOR_K: "k",
    pb.TENSOR_V: "v",
    pb.TENSOR_O: "o",
    pb.TENSOR_LSE: "lse",
}


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_chunk(tensor: int, offset: int, data: memoryview) -> bytes:
    """AttendRequest{chunk: TensorChunk{tensor, offset, data}} (AppendContextRequest's chunk has
    the same field number), serialized; equal to protobuf's own encoding."""
    n = len(data)
    inner_head = b"\x08" + _varint(tensor)
    if offset:
        inner_head += b"\x10" + _varint(offset)
    if n:
        inner_head += b"\x1a" + _varint(n)
    return b"".join((b"\x12", _varint(len(inner_head) + n), inner_head, data))


def iter_chunks(tensor: int, view: memoryview, chunk_bytes: int) -> Iterator[bytes]:
    """Encoded chunks of one tensor's bytes (a loop over chunks, never over bytes)."""
    total = len(view)
    for off in range(0, total, chunk_bytes):
        yield encode_chunk(tensor, off, view[off : off + chunk_bytes])


def serialize(message) -> bytes:
    """Request serializer: pre-encoded chunks pass through, protobuf messages are serialized."""
    if isinstance(message, (bytes, bytearray)):
        return bytes(message)
    return message.SerializeToString()


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


class Chunk:
    __slots__ = ("tensor", "offset", "data")

    def __init__(self, tensor: int, offset: int, data: memoryview):
        self.tensor, self.offset, self.data = tensor, offset, data


def deserialize_response(raw: bytes):
    """AttendResponse bytes -> pb.AttendResponse (a header) or a Chunk whose data is a view."""
    buf = memoryview(raw)
    if not buf or buf[0] != 0x12:
        return pb.AttendResponse.FromString(raw)
    try:
        length, pos = _read_varint(buf, 1)
        end = pos + length
        if end != len(buf):
            return pb.AttendResponse.FromString(raw)
        tensor = offset = 0
        data = buf[0:0]
        while pos < end:
            tag, pos = _read_varint(buf, pos)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                value, pos = _read_varint(buf, pos)
                if field == 1:
                    tensor = value
                elif field == 2:
                    offset = value - (1 << 64) if value >= 1 << 63 else value
            elif wire == 2:
                n, pos = _read_varint(buf, pos)
                if field == 3:
                    data = buf[pos : pos + n]
                pos += n
            else:  # not a field TensorChunk has: let protobuf handle it
                return pb.AttendResponse.FromString(raw)
        if pos != end:
            raise DataLoss("malformed response chunk")
        return Chunk(tensor, offset, data)
    except IndexError:
        raise DataLoss("truncated response chunk") from None


def build_header(
    *,
    dtype: int,
    batch: int,
    tokens: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    spec,
    kv_tokens: int = 0,
    q_offset: Optional[int] = None,
    return_lse: bool = False,
    context: str = "",
    placement: int = 0,
    request_id: str = "",
    response_chunk_bytes: int = 0,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    regions: Optional[dict] = None,
) -> pb.AttendRequest:
    h = pb.AttendHeader(
        request_id=request_id,
        dtype=dtype,
        batch=batch,
        tokens=tokens,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        placement=placement,
        return_lse=return_lse,
        kv_tokens=kv_tokens,
        context=context,
        response_chunk_bytes=response_chunk_bytes,
    )
    h.spec.CopyFrom(spec)
    if q_offset is not None:
        h.q_offset = int(q_offset)
    if cu_seqlens_q is not None:
        h.cu_seqlens_q.extend(int(x) for x in cu_seqlens_q)
    if cu_seqlens_k is not None:
        h.cu_seqlens_k.extend(int(x) for x in cu_seqlens_k)
    for field, ref in (regions or {}).items():
        getattr(h, field).CopyFrom(ref)
    return pb.AttendRequest(header=h)


class ResponseAssembler:
    """Checks an Attend response stream and assembles O and LSE into numpy carrier arrays: the
    header first and matching the request, every byte of O and LSE exactly once."""

    def __init__(self, dtype: int, o_shape: tuple, return_lse: bool):
        self.dtype, self.o_shape, self.return_lse = dtype, tuple(o_shape), return_lse
        b, n, h, _ = self.o_shape
        self.lse_shape = (b, h, n) if return_lse else ()
        self.header: Optional[pb.AttendResponseHeader] = None
        self.o = self.lse = None
        self._views = {}
        self._ranges = {pb.TENSOR_O: [], pb.TENSOR_LSE: []}
        self.messages = 0

    def add(self, message) -> None:
        self.messages += 1
        if isinstance(message, Chunk):
            return self._chunk(message)
        which = message.WhichOneof("message")
        if which == "header":
            return self._header(message.header)
        if which == "chunk":
            c = message.chunk
            return self._chunk(Chunk(c.tensor, c.offset, memoryview(c.data)))
        raise DataLoss("response message with neither header nor chunk")

    def _header(self, h) -> None:
        if self.header is not None:
            raise DataLoss("second response header")
        if tuple(h.o_shape) != self.o_shape or h.dtype != self.dtype:
            raise DataLoss(
                f"response header: o_shape {list(h.o_shape)} "
                f"{tensors.DTYPE_NAMES.get(h.dtype, h.dtype)}, expected "
                f"{list(self.o_shape)} {tensors.DTYPE_NAMES[self.dtype]}"
            )
        o_bytes = int(np.prod(self.o_shape)) * tensors.ITEMSIZE[self.dtype]
        lse_bytes = int(np.prod(self.lse_shape)) * 4 if self.return_lse else 0
        if h.o_bytes != o_bytes or h.lse_bytes != lse_bytes:
            raise DataLoss(
                f"response header: o_bytes {h.o_bytes} lse_bytes {h.lse_bytes}, "
                f"expected {o_bytes} and {lse_bytes}"
            )
        if self.return_lse and tuple(h.lse_shape) != self.lse_shape:
            raise DataLoss(
                f"response header: lse_shape {list(h.lse_shape)}, expected "
                f"{list(self.lse_shape)}"
            )
        self.header = h
        if not h.outputs_in_regions:
            self.o = tensors.empty(self.dtype, self.o_shape)
            self._views[pb.TENSOR_O] = memoryview(self.o.reshape(-1).view(np.uint8))
            if self.return_lse:
                self.lse = np.empty(self.lse_shape, dtype="<f4")
                self._views[pb.TENSOR_LSE] = memoryview(self.lse.reshape(-1).view(np.uint8))

    def _chunk(self, c: Chunk) -> None:
        if self.header is None:
            raise DataLoss("response chunk before the header")
        view = self._views.get(c.tensor)
        name = TENSOR_NAMES.get(c.tensor, str(c.tensor))
        if view is None:
            raise DataLoss(f"unexpected response chunk for tensor {name}")
        n = len(c.data)
        if c.offset < 0 or c.offset + n > len(view):
            raise DataLoss(
                f"response chunk for {name}: bytes [{c.offset}, {c.offset + n}) "
                f"outside [0, {len(view)})"
            )
        view[c.offset : c.offset + n] = c.data
        self._ranges[c.tensor].append((c.offset, c.offset + n))

    def finish(self) -> None:
        """Raises DataLoss unless the header came and every output byte arrived exactly once."""
        if self.header is None:
            raise DataLoss("the response ended without a header")
        for tensor, view in self._views.items():
            pos = 0
            for begin, end in sorted(self._ranges[tensor]):
                if begin != pos:
                    what = "overlap" if begin < pos else "missing bytes"
                    raise DataLoss(
                        f"response {TENSOR_NAMES[tensor]}: {what} at byte " f"{min(begin, pos)}"
                    )
                pos = end
            if pos != len(view):
                raise DataLoss(
                    f"response {TENSOR_NAMES[tensor]}: {len(view) - pos} bytes "
                    f"missing at the end"
                )
        self._views.clear()
