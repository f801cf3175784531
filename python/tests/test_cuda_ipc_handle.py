"""The cudaIpcMemHandle_t inside what torch's _share_cuda_() exports (no GPU needed)."""

import pytest

from attnserve.cuda_ipc import HANDLE_BYTES, ipc_mem_handle
from attnserve.errors import InvalidArgument


def test_bare_handle_of_older_torch():
    raw = bytes(range(HANDLE_BYTES))
    assert ipc_mem_handle(raw, "q_region") == raw


@pytest.mark.parametrize("version", [2, 3])
def test_versioned_cuda_malloc_handle(version):
    raw = bytes(range(7, 7 + HANDLE_BYTES))
    assert ipc_mem_handle(bytes([version, ord("c")]) + raw, "q_region") == raw


def test_expandable_segment_is_refused_with_the_fix():
    with pytest.raises(InvalidArgument, match="expandable_segments:False"):
        ipc_mem_handle(bytes([2, ord("e")]) + bytes(40), "k_region")


def test_unknown_kind_names_the_field():
    with pytest.raises(InvalidArgument, match="v_region"):
        ipc_mem_handle(bytes(10), "v_region")
