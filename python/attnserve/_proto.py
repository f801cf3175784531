"""The generated modules (attnserve/v1/, made by build_proto.py when the package is built)."""

try:
    from .v1 import attnserve_pb2 as pb
    from .v1 import attnserve_pb2_grpc as pb_grpc
except ImportError as e:  # a source checkout that was never built
    raise ImportError(
        "attnserve: the generated stubs (attnserve/v1/attnserve_pb2.py) are missing; install the "
        "package (pip install ./python) or run python/build_proto.py first"
    ) from e

__all__ = ["pb", "pb_grpc"]
