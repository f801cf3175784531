"""The hand-written chunk framing equals protobuf's; the response checks catch bad streams."""

import numpy as np
import pytest

from attnserve import DataLoss, pb, wire


@pytest.mark.parametrize("offset", [0, 1, 300, 2**33 + 5])
@pytest.mark.parametrize("n", [0, 1, 127, 128, 70000])
def test_encode_chunk_matches_protobuf(offset, n):
    data = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
    ours = wire.encode_chunk(pb.TENSOR_K, offset, memoryview(data))
    theirs = pb.AttendRequest(
        chunk=pb.TensorChunk(tensor=pb.TENSOR_K, offset=offset, data=data.tobytes())
    ).SerializeToString()
    assert ours == theirs
    append = pb.AppendContextRequest.FromString(ours)
    assert append.chunk.offset == offset and append.chunk.data == data.tobytes()


def test_decode_response_chunk_is_a_view():
    data = bytes(range(200))
    raw = pb.AttendResponse(
        chunk=pb.TensorChunk(tensor=pb.TENSOR_O, offset=77, data=data)
    ).SerializeToString()
    c = wire.deserialize_response(raw)
    assert isinstance(c, wire.Chunk) and c.tensor == pb.TENSOR_O and c.offset == 77
    assert bytes(c.data) == data
    h = wire.deserialize_response(
        pb.AttendResponse(header=pb.AttendResponseHeader(request_id="x")).SerializeToString()
    )
    assert h.header.request_id == "x"


def _asm():
    asm = wire.ResponseAssembler(pb.DTYPE_F32, (1, 2, 1, 4), return_lse=False)
    asm.add(
        pb.AttendResponse(
            header=pb.AttendResponseHeader(dtype=pb.DTYPE_F32, o_shape=[1, 2, 1, 4], o_bytes=32)
        )
    )
    return asm


def _chunk(offset, n):
    return wire.Chunk(pb.TENSOR_O, offset, memoryview(bytes(n)))


def test_assembler_accepts_any_order():
    asm = _asm()
    asm.add(_chunk(16, 16))
    asm.add(_chunk(0, 16))
    asm.finish()
    assert asm.o.shape == (1, 2, 1, 4)


@pytest.mark.parametrize(
    "chunks,match",
    [
        ([(0, 16), (8, 24)], "overlap"),
        ([(0, 16)], "missing"),
        ([(0, 16), (24, 16)], "outside"),
    ],
)
def test_assembler_rejects_bad_streams(chunks, match):
    asm = _asm()
    with pytest.raises(DataLoss, match=match):
        for off, n in chunks:
            asm.add(_chunk(off, n))
        asm.finish()


def test_assembler_rejects_wrong_header_and_order():
    asm = wire.ResponseAssembler(pb.DTYPE_F32, (1, 2, 1, 4), return_lse=False)
    with pytest.raises(DataLoss, match="before the header"):
        asm.add(_chunk(0, 4))
    with pytest.raises(DataLoss, match="o_shape"):
        asm.add(
            pb.AttendResponse(
                header=pb.AttendResponseHeader(dtype=pb.DTYPE_F32, o_shape=[1, 3, 1, 4], o_bytes=48)
            )
        )
