"""attnserve: Python client of the attnserve long-context attention service.

    import numpy as np, attnserve
    from attnserve import Client, Spec

    with Client("localhost:50051") as client:
        r = client.attend(q, k, v, Spec.dense(causal=True), return_lse=True)
        r.o, r.lse

attnserve.aio.Client is the asyncio variant. Errors are AttnserveError subclasses named after
their gRPC code (InvalidArgument, ResourceExhausted, NotFound, DeadlineExceeded, ...).
"""

from ._common import tls_credentials
from ._plan import AttendResult
from ._proto import pb
from .client import AttendFuture, Client
from .errors import (
    Aborted,
    AlreadyExists,
    AttnserveError,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
    error_for,
)
from .shm import SharedArrays, ShmRegion
from .spec import Spec
from .tensors import bf16_bits_to_f32, f32_to_bf16_bits

__version__ = "0.1.0"

__all__ = [
    "Client",
    "tls_credentials",
    "AttendFuture",
    "AttendResult",
    "Spec",
    "ShmRegion",
    "SharedArrays",
    "pb",
    "f32_to_bf16_bits",
    "bf16_bits_to_f32",
    "AttnserveError",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "error_for",
]
