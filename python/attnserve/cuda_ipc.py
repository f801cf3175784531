"""CUDA IPC regions for torch CUDA tensors (RegisterRegion with a CudaIpcRegion).

A torch tensor lives in a block of torch's caching allocator, inside one cudaMalloc allocation;
`untyped_storage()._share_cuda_()` exports that allocation with cudaIpcGetMemHandle and says
where the storage starts in it. The region is the allocation from its start up to the end of the
storage (the server checks it fits the allocation), and the tensor's ref is its byte offset from
the allocation's start, which must be a multiple of 64. Tensors in one allocation share one region
(a handle is opened once). The server reads the inputs and writes O and LSE in place; the caller's
writes must be complete before Attend is sent (we synchronise the device), and the outputs are
complete when the response arrives.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from ._proto import pb
from .errors import InvalidArgument

_counter = itertools.count()
HANDLE_BYTES = 64


# torch's CUDA caching allocator exports a block as a version byte, a type byte and the handle:
# 'c' for a plain cudaMalloc segment (a cudaIpcMemHandle_t follows), 'e' for an expandable
# segment (driver-API memory that cudaIpcOpenMemHandle cannot open). Older torch sent the bare
# 64-byte cudaIpcMemHandle_t.
_TORCH_HANDLE_CUDA_MALLOC = ord("c")
_TORCH_HANDLE_EXPANDABLE = ord("e")


def ipc_mem_handle(exported: bytes, header_field: str) -> bytes:
    """The cudaIpcMemHandle_t inside what torch's _share_cuda_() returned."""
    if len(exported) == HANDLE_BYTES:
        return exported
    if len(exported) == HANDLE_BYTES + 2 and exported[1] == _TORCH_HANDLE_CUDA_MALLOC:
        return exported[2:]
    if len(exported) >= 2 and exported[1] == _TORCH_HANDLE_EXPANDABLE:
        raise InvalidArgument(
            f"{header_field}: the tensor lives in an expandable segment, which CUDA IPC cannot "
            "share (set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False, or use "
            "transport='grpc')"
        )
    raise InvalidArgument(
        f"{header_field}: torch exported a {len(exported)}-byte IPC handle of an unknown kind "
        "(use transport='grpc')"
    )


@dataclass
class IpcRegion:
    name: str
    handle: bytes
    device: int
    bytes: int = 0


@dataclass
class IpcPlan:
    """Regions to register for one call and each tensor's ref."""

    regions: dict = field(default_factory=dict)  # handle -> IpcRegion
    refs: dict = field(default_factory=dict)  # header field -> pb.RegionRef

    def add(self, header_field: str, tensor, server_device: int) -> None:
        import torch

        if not tensor.is_cuda or not tensor.is_contiguous():
            raise InvalidArgument(f"{header_field}: CUDA IPC needs a contiguous CUDA tensor")
        storage = tensor.untyped_storage()
        shared = storage._share_cuda_()
        handle, storage_offset = ipc_mem_handle(bytes(shared[1]), header_field), int(shared[3])
        offset = storage_offset + tensor.storage_offset() * tensor.element_size()
        nbytes = tensor.numel() * tensor.element_size()
        if offset % 64:
            raise InvalidArgument(
                f"{header_field}: tensor starts at byte {offset} of its CUDA "
                "allocation, not a multiple of 64 (clone() it)"
            )
        region = self.regions.get(handle)
        if region is None:
            region = IpcRegion(f"pyipc_{os.getpid()}_{next(_counter)}", handle, server_device)
            self.regions[handle] = region
        region.bytes = max(region.bytes, storage_offset + storage.nbytes(), offset + nbytes)
        self.refs[header_field] = pb.RegionRef(region=region.name, offset=offset, bytes=nbytes)
        del torch

    def register_requests(self) -> list:
        return [
            pb.RegisterRegionRequest(
                name=r.name,
                cuda_ipc=pb.CudaIpcRegion(handle=r.handle, device=r.device, bytes=r.bytes),
            )
            for r in self.regions.values()
        ]

    def names(self) -> list:
        return [r.name for r in self.regions.values()]


def server_device_for(tensor, devices) -> int:
    """The server's CUDA ordinal of the tensor's GPU: matched by UUID when Describe lists UUIDs
    the local torch can read, else the local ordinal (same CUDA_VISIBLE_DEVICES)."""
    import torch

    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid).lower()
    except Exception:
        uuid = ""
    for d in devices or []:
        if uuid and d.uuid and uuid.replace("gpu-", "") in d.uuid.lower().replace("gpu-", ""):
            if d.name.startswith("cuda:"):
                return int(d.name.split(":", 1)[1])
    return index
