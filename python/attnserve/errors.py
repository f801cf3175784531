"""Typed errors: one exception class per gRPC status code, all under AttnserveError.

The server names the field and the rule it breaks in its message ("spec.window.size: must be
>= 0, got -1"); the exception keeps it verbatim in `details`, with the code in `code`.
"""

from __future__ import annotations

import grpc


class AttnserveError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's (or client's) text."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None, method: str = ""):
        if code is not None:
            self.code = code
        self.details = details
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{self.code.name}: {details}")


class Cancelled(AttnserveError):
    code = grpc.StatusCode.CANCELLED


class Unknown(AttnserveError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(AttnserveError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(AttnserveError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(AttnserveError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AttnserveError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AttnserveError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AttnserveError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(AttnserveError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(AttnserveError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(AttnserveError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(AttnserveError, NotImplementedError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(AttnserveError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(AttnserveError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(AttnserveError):
    """A malformed response (overlapping, missing or out-of-range chunks, wrong shapes)."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(AttnserveError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def error_for(code: grpc.StatusCode, details: str, method: str = "") -> AttnserveError:
    """The typed exception for a status code."""
    cls = _BY_CODE.get(code, AttnserveError)
    return cls(details, code=code, method=method)


def from_rpc_error(e: grpc.RpcError, method: str = "") -> AttnserveError:
    """Converts a grpc.RpcError (sync or aio) into its typed AttnserveError."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return error_for(code or grpc.StatusCode.UNKNOWN, details or "", method)
