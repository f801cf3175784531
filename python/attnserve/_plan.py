"""One Attend call's plan, shared by the sync and asyncio clients: inputs checked and turned into
raw bytes, the header, the upload stream, region refs (shm or CUDA IPC) and how outputs go back.
The clients only add the RPCs (register, attend, unregister), retries and deadlines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np

from . import tensors, wire
from ._proto import pb
from .cuda_ipc import IpcPlan, server_device_for
from .errors import InvalidArgument
from .shm import ShmRegion, layout

PLACEMENTS = {
    "auto": pb.PLACEMENT_AUTO,
    "single": pb.PLACEMENT_SINGLE,
    "data": pb.PLACEMENT_DATA_PARALLEL,
    "data_parallel": pb.PLACEMENT_DATA_PARALLEL,
    "ring": pb.PLACEMENT_RING,
    "context_parallel": pb.PLACEMENT_CONTEXT_PARALLEL,
}
TRANSPORTS = ("auto", "grpc", "shm", "cuda_ipc")


def placement_value(p: Any) -> int:
    if p is None:
        return pb.PLACEMENT_AUTO
    if isinstance(p, int):
        return p
    v = PLACEMENTS.get(str(p).lower())
    if v is None:
        raise InvalidArgument(f"placement: expected one of {sorted(PLACEMENTS)}, got {p!r}")
    return v


@dataclass
class AttendResult:
    """O ([B, N, Hq, D], the caller's kind and dtype), LSE ([B, Hq, N] float32, or None) and the
    server's response header (backend, devices, placement, timings, sparsity, flops)."""

    o: Any
    lse: Any
    header: pb.AttendResponseHeader
    seconds: float = 0.0  # client side, the whole call
    attempts: int = 1

    @property
    def request_id(self) -> str:
        return self.header.request_id

    @property
    def backend(self) -> str:
        return self.header.backend

    def __iter__(self):  # o, lse = client.attend(...)
        return iter((self.o, self.lse))


@dataclass
class ContextInfo:
    dtype: int
    kv_heads: int
    head_dim: int


def _shape4(x, name: str) -> tuple:
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != 4:
        raise InvalidArgument(f"{name}: expected [B, N, H, D], got shape {list(shape)}")
    return shape


@dataclass
class AttendPlan:
    header: pb.AttendRequest
    dtype: int
    o_shape: tuple
    return_lse: bool
    kind: tensors.Kind
    chunk_bytes: int
    uploads: list = field(default_factory=list)  # (TensorKind, Raw)
    ipc: Optional[IpcPlan] = None
    shm: Optional[ShmRegion] = None
    shared: Any = None  # SharedArrays the inputs live in (zero copy)
    _keep: list = field(default_factory=list)  # tensors the refs point into
    _ipc_out: tuple = ()
    _shm_out: tuple = ()
    started: float = field(default_factory=time.monotonic)

    def requests(self) -> Iterator:
        """The request stream: the header, then Q, K, V chunks (none for region inputs)."""
        yield self.header
        for kind, raw in self.uploads:
            yield from wire.iter_chunks(kind, raw.bytes_view(), self.chunk_bytes)

    def assembler(self) -> wire.ResponseAssembler:
        return wire.ResponseAssembler(self.dtype, self.o_shape, self.return_lse)

    # ---- shared memory ----
    def shm_bytes(self) -> int:
        return layout(self._shm_sizes())[1]

    def _shm_sizes(self) -> list:
        b, n, h, _ = self.o_shape
        o_bytes = int(np.prod(self.o_shape)) * tensors.ITEMSIZE[self.dtype]
        return [raw.nbytes for _, raw in self.uploads] + [o_bytes, b * h * n * 4]

    def use_shm(self, region: ShmRegion) -> None:
        """Copies the inputs into the region and points the header's refs at it."""
        offsets, _ = layout(self._shm_sizes())
        sizes = self._shm_sizes()
        fields = {pb.TENSOR_Q: "q_region", pb.TENSOR_K: "k_region", pb.TENSOR_V: "v_region"}
        h = self.header.header
        for (kind, raw), off in zip(self.uploads, offsets):
            dst = region.ndarray(off, raw.array.shape, raw.array.dtype)
            np.copyto(dst, raw.array)
            del dst
            getattr(h, fields[kind]).CopyFrom(region.ref(off, raw.nbytes))
        o_off, lse_off = offsets[-2], offsets[-1]
        h.o_region.CopyFrom(region.ref(o_off, sizes[-2]))
        if self.return_lse:
            h.lse_region.CopyFrom(region.ref(lse_off, sizes[-1]))
        self._shm_out = (o_off, lse_off)
        self.uploads = []
        self.shm = region

    def use_shared(self, shared) -> None:
        """Points the header's refs at inputs already inside `shared`'s region, and O/LSE at its
        o and lse: nothing is copied."""
        fields = {pb.TENSOR_Q: "q_region", pb.TENSOR_K: "k_region", pb.TENSOR_V: "v_region"}
        h = self.header.header
        for kind, raw in self.uploads:
            off = shared.locate(raw.array)
            if off is None:
                raise InvalidArgument(
                    f"{fields[kind]}: the tensor is not inside the shared arrays' region (fill "
                    "their q, k and v in place, in the dtype they were made with)"
                )
            getattr(h, fields[kind]).CopyFrom(shared.region.ref(off, raw.nbytes))
        if tuple(shared.o.shape) != tuple(self.o_shape) or shared.dtype != self.dtype:
            raise InvalidArgument(
                f"o_region: the shared arrays hold O {list(shared.o.shape)}, this call needs "
                f"{list(self.o_shape)} of the inputs' dtype"
            )
        h.o_region.CopyFrom(shared.region.ref(shared.o_offset, shared.o.nbytes))
        if self.return_lse:
            h.lse_region.CopyFrom(shared.region.ref(shared.lse_offset, shared.lse.nbytes))
        self.uploads = []
        self.shared = shared

    # ---- outputs ----
    def result(self, asm: wire.ResponseAssembler, attempts: int) -> AttendResult:
        header = asm.header
        if self._ipc_out:
            o, lse = self._ipc_out
            return AttendResult(
                o,
                lse if self.return_lse else None,
                header,
                time.monotonic() - self.started,
                attempts,
            )
        if self.shared is not None:
            if not header.outputs_in_regions:
                raise wire.DataLoss("response: outputs_in_regions is false for shared arrays")
            return AttendResult(
                tensors.from_raw(self.shared.o, self.dtype, self.kind),
                self.shared.lse if self.return_lse else None,
                header,
                time.monotonic() - self.started,
                attempts,
            )
        if self.shm is not None:
            if not header.outputs_in_regions:
                raise wire.DataLoss(
                    "response: outputs_in_regions is false for a request " "with o_region set"
                )
            b, n, h, _ = self.o_shape
            o_off, lse_off = self._shm_out
            view = self.shm.ndarray(o_off, self.o_shape, tensors.NP_CARRIER[self.dtype])
            o_raw = view.copy()
            del view
            lse_raw = None
            if self.return_lse:
                view = self.shm.ndarray(lse_off, (b, h, n), np.dtype("<f4"))
                lse_raw = view.copy()
                del view
        else:
            o_raw, lse_raw = asm.o, asm.lse
        o = tensors.from_raw(o_raw, self.dtype, self.kind)
        lse = tensors.lse_from_raw(lse_raw, self.kind) if lse_raw is not None else None
        return AttendResult(o, lse, header, time.monotonic() - self.started, attempts)


def prepare_attend(
    q,
    k,
    v,
    spec: pb.AttentionSpec,
    *,
    transport: str,
    return_lse: bool = False,
    q_offset: Optional[int] = None,
    context: str = "",
    context_info: Optional[ContextInfo] = None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    placement=None,
    dtype=None,
    request_id: str = "",
    response_chunk_bytes: int = 0,
    chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
    server_devices=None,
) -> AttendPlan:
    if q is None:
        raise InvalidArgument("q: required")
    if context:
        if k is not None or v is not None:
            raise InvalidArgument("k, v: an attend against a context sends Q only")
    elif k is None or v is None:
        raise InvalidArgument("k, v: required (or name a context)")
    names = ("q", "k", "v") if not context else ("q",)
    given = (q, k, v) if not context else (q,)
    shapes = [_shape4(x, n) for x, n in zip(given, names)]
    B, Nq, Hq, D = shapes[0]
    if context:
        if context_info is None:
            raise InvalidArgument("context: its kv_heads are unknown")
        Nkv, Hkv = 0, context_info.kv_heads
        if B != 1:
            raise InvalidArgument(f"q: an attend against a context has batch 1, got {B}")
    else:
        if shapes[1] != shapes[2]:
            raise InvalidArgument(f"k, v: shapes differ: {list(shapes[1])} and {list(shapes[2])}")
        kb, Nkv, Hkv, kd = shapes[1]
        if kb != B or kd != D:
            raise InvalidArgument(
                f"k: [B, Nkv, Hkv, D] = {list(shapes[1])} does not fit q's "
                f"{list(shapes[0])} (B and D must match)"
            )
        if Hkv < 1 or Hq % Hkv:
            raise InvalidArgument(f"q_heads {Hq} is not a multiple of kv_heads {Hkv}")
    if transport == "cuda_ipc":
        plan = _ipc_plan(given, names, dtype, server_devices, return_lse)
        wire_dtype, kind = plan.dtype, plan.kind
    else:
        raws = [tensors.to_raw(x, n, dtype) for x, n in zip(given, names)]
        wire_dtype, kind = raws[0].dtype, raws[0].kind
        for r, n in zip(raws[1:], names[1:]):
            if r.dtype != wire_dtype:
                raise InvalidArgument(
                    f"{n}: dtype {tensors.DTYPE_NAMES[r.dtype]} differs from "
                    f"q's {tensors.DTYPE_NAMES[wire_dtype]}"
                )
        plan = None
    if context and context_info.dtype != wire_dtype:
        raise InvalidArgument(
            f"q: dtype {tensors.DTYPE_NAMES[wire_dtype]} differs from the "
            f"context's {tensors.DTYPE_NAMES.get(context_info.dtype)}"
        )
    header = wire.build_header(
        dtype=wire_dtype,
        batch=B,
        tokens=Nq,
        q_heads=Hq,
        kv_heads=Hkv,
        head_dim=D,
        spec=spec,
        kv_tokens=Nkv if Nkv != Nq else 0,
        q_offset=q_offset,
        return_lse=return_lse,
        context=context,
        placement=placement_value(placement),
        request_id=request_id,
        response_chunk_bytes=response_chunk_bytes,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        regions=plan.ipc.refs if plan else None,
    )
    if plan is not None:
        plan.header, plan.return_lse, plan.chunk_bytes = header, return_lse, chunk_bytes
        return plan
    kinds = (pb.TENSOR_Q, pb.TENSOR_K, pb.TENSOR_V)
    return AttendPlan(
        header=header,
        dtype=wire_dtype,
        o_shape=(B, Nq, Hq, D),
        return_lse=return_lse,
        kind=kind,
        chunk_bytes=chunk_bytes,
        uploads=list(zip(kinds, raws)),
    )


def _ipc_plan(given, names, dtype, server_devices, return_lse) -> AttendPlan:
    import torch

    want = tensors.dtype_from_name(dtype) if dtype is not None else None
    to_torch = {
        tensors.F32: torch.float32,
        tensors.F16: torch.float16,
        tensors.BF16: torch.bfloat16,
    }
    from_torch = {v: k for k, v in to_torch.items()}
    ts = []
    for x, n in zip(given, names):
        if not tensors.is_cuda_tensor(x):
            raise InvalidArgument(f"{n}: transport='cuda_ipc' needs torch CUDA tensors")
        if want is not None and from_torch.get(x.dtype) != want:
            x = x.to(to_torch[want])
        if x.dtype not in from_torch:
            raise InvalidArgument(
                f"{n}: torch dtype {x.dtype} is not float32, float16 or " "bfloat16"
            )
        ts.append(x.detach().contiguous())
    wire_dtype = from_torch[ts[0].dtype]
    if any(from_torch[t.dtype] != wire_dtype for t in ts):
        raise InvalidArgument("q, k, v: dtypes differ")
    q = ts[0]
    B, N, H, _ = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    device = server_device_for(q, server_devices)
    ipc = IpcPlan()
    keep = []
    for field_name, t in zip(("q_region", "k_region", "v_region"), ts):
        if t.device != q.device:
            raise InvalidArgument(f"{field_name[0]}: on {t.device}, q on {q.device}")
        try:
            ipc.add(field_name, t, device)
        except InvalidArgument:
            t = t.clone()  # a fresh block starts at an aligned offset
            ipc.add(field_name, t, device)
        keep.append(t)
    ipc.add("o_region", o, device)
    if return_lse:
        ipc.add("lse_region", lse, device)
    torch.cuda.synchronize(q.device)  # the server reads the inputs as soon as Attend arrives
    plan = AttendPlan(
        header=None,
        dtype=wire_dtype,
        o_shape=tuple(q.shape),
        return_lse=False,
        kind=tensors.Kind("torch", q.device),
        chunk_bytes=0,
        ipc=ipc,
        _keep=keep,
        _ipc_out=(o, lse),
    )
    return plan
