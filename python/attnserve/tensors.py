"""Tensors in and out: numpy arrays (f32, f16; bf16 as uint16 bits or ml_dtypes.bfloat16) and
torch tensors (f32, f16, bf16; CPU or CUDA), as raw little-endian bytes without Python loops.

An input becomes a `Raw`: a C-contiguous numpy array in a wire dtype (float32, float16, or uint16
holding bf16 bits) that shares memory with the caller's tensor where it can, plus a `Kind` that
says how to hand outputs back (numpy, ml_dtypes or torch on the same device).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ._proto import pb
from .errors import InvalidArgument

F32, F16, BF16 = pb.DTYPE_F32, pb.DTYPE_F16, pb.DTYPE_BF16
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16"}
_NAME_TO_DTYPE = {
    "f32": F32,
    "float32": F32,
    "f16": F16,
    "float16": F16,
    "half": F16,
    "bf16": BF16,
    "bfloat16": BF16,
}
# The numpy dtype that carries each wire dtype's bytes.
NP_CARRIER = {F32: np.dtype("<f4"), F16: np.dtype("<f2"), BF16: np.dtype("<u2")}
ITEMSIZE = {F32: 4, F16: 2, BF16: 2}


def dtype_from_name(name: Any) -> int:
    """'f32' | 'f16' | 'bf16' (or a proto DType value) -> proto DType."""
    if isinstance(name, int) and name in DTYPE_NAMES:
        return name
    d = _NAME_TO_DTYPE.get(str(name).lower().replace("torch.", ""))
    if d is None:
        raise InvalidArgument(f"dtype: expected f32, f16 or bf16, got {name!r}")
    return d


def _torch():
    return sys.modules.get("torch")


def _ml_dtypes():
    try:
        import ml_dtypes

        return ml_dtypes
    except ImportError:
        return None


def is_torch(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def is_cuda_tensor(x: Any) -> bool:
    return is_torch(x) and x.is_cuda


@dataclass(frozen=True)
class Kind:
    """How outputs go back: 'numpy', 'ml_dtypes' (numpy of ml_dtypes.bfloat16) or 'torch'."""

    lib: str = "numpy"
    device: Any = None  # torch device for 'torch'


@dataclass
class Raw:
    array: np.ndarray  # C-contiguous, wire carrier dtype
    dtype: int  # proto DType
    kind: Kind

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def bytes_view(self) -> memoryview:
        """The tensor's bytes as a flat memoryview (no copy)."""
        return memoryview(self.array.reshape(-1).view(np.uint8))


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 (or anything castable) -> uint16 bf16 bits, round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float32 (exact)."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_raw(x: Any, name: str, dtype: Optional[Any] = None) -> Raw:
    """Any accepted input -> Raw. `dtype` is needed only for bf16 given as uint16 bits, or to
    convert float inputs (e.g. float64 numpy) into the named wire dtype."""
    want = dtype_from_name(dtype) if dtype is not None else None
    if is_torch(x):
        return _torch_to_raw(x, name, want)
    a = np.asarray(x)
    ml = _ml_dtypes()
    if ml is not None and a.dtype == np.dtype(ml.bfloat16):
        if want not in (None, BF16):
            raise InvalidArgument(f"{name}: ml_dtypes.bfloat16 array but dtype={dtype!r}")
        return Raw(_contig(a.view(np.uint16)), BF16, Kind("ml_dtypes"))
    if a.dtype in (np.uint16, np.int16):
        if want != BF16:
            raise InvalidArgument(
                f"{name}: {a.dtype} array: pass dtype='bf16' if it holds bfloat16 "
                "bits (numpy has no bfloat16)"
            )
        return Raw(_contig(a.view(np.uint16)), BF16, Kind("numpy"))
    if a.dtype == np.float32 and want in (None, F32):
        return Raw(_contig(a, "<f4"), F32, Kind("numpy"))
    if a.dtype == np.float16 and want in (None, F16):
        return Raw(_contig(a, "<f2"), F16, Kind("numpy"))
    if a.dtype.kind == "f" and want is not None:
        if want == BF16:
            return Raw(f32_to_bf16_bits(a), BF16, Kind("numpy"))
        return Raw(np.ascontiguousarray(a, dtype=NP_CARRIER[want]), want, Kind("numpy"))
    raise InvalidArgument(
        f"{name}: dtype {a.dtype} is not f32, f16 or bf16 (pass dtype= to convert "
        "floats, or dtype='bf16' for uint16 bits)"
    )


def _contig(a: np.ndarray, carrier: str | None = None) -> np.ndarray:
    if carrier is not None and a.dtype.byteorder == ">":
        a = a.astype(carrier)
    return np.ascontiguousarray(a)


def _torch_to_raw(x, name: str, want: Optional[int]) -> Raw:
    torch = _torch()
    kinds = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}
    got = kinds.get(x.dtype)
    if got is None or (want is not None and want != got):
        if want is None or not x.dtype.is_floating_point:
            raise InvalidArgument(
                f"{name}: torch dtype {x.dtype} is not float32, float16 or bfloat16"
            )
        x = x.to({F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[want])
        got = want
    kind = Kind("torch", x.device)
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if got == BF16:
        arr = t.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = t.numpy()
    return Raw(arr, got, kind)


def empty(dtype: int, shape: tuple) -> np.ndarray:
    """An uninitialised carrier array for an output."""
    return np.empty(shape, dtype=NP_CARRIER[dtype])


def from_raw(arr: np.ndarray, dtype: int, kind: Kind) -> Any:
    """Output carrier array -> the caller's kind (numpy, ml_dtypes, torch on its device)."""
    if kind.lib == "ml_dtypes" and dtype == BF16:
        return arr.view(_ml_dtypes().bfloat16)
    if kind.lib == "torch":
        torch = _torch()
        if dtype == BF16:
            t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(arr)
        if kind.device is not None and torch.device(kind.device).type != "cpu":
            t = t.to(kind.device)
        return t
    return arr


def lse_from_raw(arr: np.ndarray, kind: Kind) -> Any:
    return from_raw(arr, F32, Kind("torch", kind.device) if kind.lib == "torch" else Kind())
