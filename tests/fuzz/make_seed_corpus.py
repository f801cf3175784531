#!/usr/bin/env python3
"""Writes the hand-made seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Standard library only (no numpy, no protobuf): .npy files and AttendRequest protos are encoded
by hand, so the seeds are exactly what the comments say. Rerun after changing it; files the
fuzzers added (named by their SHA-1) are left alone.

  fuzz_npy                 1 byte (the dtype asked for: 0 none, 1 f32, 2 f16, 3 bf16) + a file
  fuzz_spec_json           the JSON text
  fuzz_request_assembler   0x01, then 2-byte little-endian length + serialized AttendRequest, ...
  fuzz_spec                FuzzedDataProvider bytes (no structure to write by hand: a few seeds)
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data)


# ---- .npy ----
def npy(descr, shape, data, fortran=False, major=1, pad_to=64, dict_text=None):
    shape_text = "(" + "".join(f"{d}, " for d in shape)[:-2] + ("," if len(shape) == 1 else "") + ")"
    if dict_text is None:
        dict_text = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    len_bytes = 2 if major == 1 else 4
    prefix = 6 + 2 + len_bytes
    body = dict_text + " " * ((pad_to - (prefix + len(dict_text) + 1) % pad_to) % pad_to) + "\n"
    head = b"\x93NUMPY" + bytes([major, 0])
    head += struct.pack("<H" if major == 1 else "<I", len(body))
    return head + body.encode() + data


f32 = struct.pack("<6f", 0.0, 1.0, -2.5, 3.25, float("inf"), float("nan"))
f16 = struct.pack("<6H", 0x0000, 0x3C00, 0xC100, 0x7C00, 0x7E00, 0x0001)
bf16 = struct.pack("<6H", 0x0000, 0x3F80, 0xC020, 0x7F80, 0x7FC0, 0x0001)
W = "fuzz_npy"
write(W, "f32_any", b"\0" + npy("<f4", (2, 3), f32))
write(W, "f32_want_f32", b"\1" + npy("<f4", (1, 2, 3), f32))
write(W, "f16", b"\2" + npy("<f2", (6,), f16))
write(W, "bf16_u2", b"\3" + npy("<u2", (3, 2), bf16))
write(W, "bf16_v2", b"\3" + npy("|V2", (6,), bf16))
write(W, "bf16_u2_without_hint", b"\0" + npy("<u2", (6,), bf16))
write(W, "f16_asked_f32", b"\1" + npy("<f2", (6,), f16))
write(W, "version2", b"\0" + npy("<f4", (6,), f32, major=2))
write(W, "version3", b"\0" + npy("<f4", (6,), f32, major=3))
write(W, "zero_dim", b"\0" + npy("<f4", (0,), b""))
write(W, "zero_and_huge", b"\0" + npy("<f4", (0, 4611686018427387904), b""))
write(W, "scalar", b"\0" + npy("<f4", (), f32[:4]))
write(W, "rank4", b"\1" + npy("<f4", (1, 1, 2, 3), f32))
write(W, "big_endian", b"\0" + npy(">f4", (6,), f32))
write(W, "fortran", b"\0" + npy("<f4", (2, 3), f32, fortran=True))
write(W, "overflow_shape", b"\0" + npy("<f4", (4294967296, 4294967296), b""))
write(W, "too_long_dim", b"\0" + npy("<f4", (99999999999999999999,), b""))
write(W, "data_short", b"\0" + npy("<f4", (2, 3), f32[:20]))
write(W, "data_long", b"\0" + npy("<f4", (2, 3), f32 + b"\0\0\0\0"))
write(W, "double_quotes", b"\0" + npy("", (), f32, dict_text='{"descr":"<f4","fortran_order":False,"shape":(6,)}'))
write(W, "python2_long", b"\0" + npy("", (), f32, dict_text="{'descr': '<f4', 'fortran_order': False, 'shape': (6L,), }"))
write(W, "duplicate_key", b"\0" + npy("", (), f32, dict_text="{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}"))
write(W, "record_dtype", b"\0" + npy("", (), f32, dict_text="{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,)}"))
write(W, "unknown_key", b"\0" + npy("", (), f32, dict_text="{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}"))
write(W, "header_len_past_end", b"\0" + b"\x93NUMPY\x01\x00\xff\xff{'descr'")
write(W, "tiny_header", b"\0" + b"\x93NUMPY\x01\x00\x01\x00{")
write(W, "no_magic", b"\0" + b"NUMPY\x01\x00")
write(W, "version9", b"\0" + b"\x93NUMPY\x09\x00\x00\x00")
write(W, "empty", b"\0")

# ---- spec JSON ----
J = "fuzz_spec_json"
for name, text in [
    ("dense", '{"dense": {}}'),
    ("dense_causal_scale", '{"dense": {}, "causal": true, "scale": 0.125}'),
    ("window", '{"window": {"size": 256}, "causal": true}'),
    ("window_string_int", '{"window": {"size": "9223372036854775807"}}'),
    ("dilated", '{"dilated": {"segmentLengths": [2048, 4096], "dilationRates": [1, 2]}, "causal": true}'),
    ("dilated_snake", '{"dilated": {"segment_lengths": [64, 128, 256], "dilation_rates": [1, 2, 4]}}'),
    ("dilated_mismatch", '{"dilated": {"segmentLengths": [64], "dilationRates": [1, 2]}}'),
    ("local_window", '{"blockSparse": {"blockSize": 64, "localWindow": {"width": 1}}}'),
    ("dilated_sparse", '{"block_sparse": {"block_size": 128, "dilated_sparse": {"rates": [1, 3, 9]}}}'),
    ("global_local", '{"blockSparse": {"blockSize": 64, "globalLocal": {"globalBlocks": 1, "width": 2}}, "causal": true}'),
    ("strided", '{"blockSparse": {"blockSize": 64, "strided": {"stride": 2, "width": 0}}}'),
    ("random", '{"blockSparse": {"blockSize": 64, "random": {"keep": 0.25, "seed": "18446744073709551615"}}}'),
    ("random_nan", '{"blockSparse": {"blockSize": 64, "random": {"keep": "NaN", "seed": 1}}}'),
    ("csr", '{"blockSparse": {"blockSize": 64, "csr": {"rowPtr": [0, 1, 3, 4, 6], "colIdx": [0, 0, 1, 2, 0, 3]}}}'),
    ("csr_bad", '{"blockSparse": {"blockSize": 64, "csr": {"rowPtr": [0, 5], "colIdx": [7]}}}'),
    ("block_size_bad", '{"blockSparse": {"blockSize": 96, "localWindow": {}}}'),
    ("no_pattern", '{"causal": true}'),
    ("unknown_field", '{"dense": {}, "bogus": 1}'),
    ("two_patterns", '{"dense": {}, "window": {"size": 1}}'),
    ("scale_inf", '{"dense": {}, "scale": "Infinity"}'),
    ("malformed", '{"dense": '),
]:
    write(J, name, text)

# ---- AttendRequest streams (framed: 0x01, then <u16 length, message>...) ----
def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, value):
    if isinstance(value, bytes):
        return varint(num << 3 | 2) + varint(len(value)) + value
    return varint(num << 3 | 0) + varint(value)


def header(dtype=1, b=1, n=4, hq=2, hkv=1, d=2, spec=field(1, b""), extra=b""):
    h = field(2, dtype) + field(3, b) + field(4, n) + field(5, hq) + field(6, hkv) + field(7, d)
    h += field(8, spec) + extra
    return field(1, h)


def chunk(tensor, offset, data):
    return field(2, field(1, tensor) + field(2, offset) + field(3, data))


def stream(*msgs):
    return b"\x01" + b"".join(struct.pack("<H", len(m)) + m for m in msgs)


R = "fuzz_request_assembler"
# f32 [1, 4, 2, 2] q = 64 bytes, k = v = [1, 4, 1, 2] = 32 bytes.
q, kv = bytes(range(64)), bytes(range(100, 132))
write(R, "dense_complete", stream(header(), chunk(1, 0, q), chunk(2, 0, kv), chunk(3, 0, kv)))
write(R, "out_of_order_chunks", stream(header(), chunk(3, 16, kv[16:]), chunk(1, 32, q[32:]),
                                       chunk(2, 0, kv), chunk(1, 0, q[:32]), chunk(3, 0, kv[:16])))
write(R, "overlap", stream(header(), chunk(1, 0, q[:40]), chunk(1, 32, q[32:])))
write(R, "past_end", stream(header(), chunk(2, 16, kv)))
write(R, "chunk_first", stream(chunk(1, 0, q), header()))
write(R, "two_headers", stream(header(), header()))
write(R, "bad_tensor_kind", stream(header(), chunk(4, 0, q)))
write(R, "negative_offset", stream(header(), chunk(1, (1 << 64) - 8, q)))
write(R, "missing_v", stream(header(), chunk(1, 0, q), chunk(2, 0, kv)))
write(R, "huge_tokens", stream(header(n=1 << 40)))
write(R, "no_dtype", stream(header(dtype=0)))
write(R, "heads_not_multiple", stream(header(hq=3, hkv=2)))
window = field(2, field(1, 1))
write(R, "window_causal", stream(header(spec=window + field(5, 1)), chunk(1, 0, q),
                                 chunk(2, 0, kv), chunk(3, 0, kv)))
# decode: 1 query row against 6 keys, q_offset 5 (bf16: q = 1*1*2*2*2 = 8 bytes, kv = 6*1*2*2 = 24)
write(R, "decode_bf16", stream(header(dtype=3, n=1, extra=field(12, 6) + field(13, 5)),
                               chunk(1, 0, q[:8]), chunk(2, 0, kv[:24]), chunk(3, 0, kv[:24])))
# packed: two sequences of 1 + 3 queries against 2 + 4 keys
packed = field(12, 6) + field(14, b"\x00\x01\x04") + field(15, b"\x00\x02\x06")
write(R, "packed", stream(header(extra=packed), chunk(1, 0, q), chunk(2, 0, q[:48]), chunk(3, 0, q[:48])))
bs = field(4, field(1, 64) + field(2, field(1, 1)))
write(R, "block_sparse", stream(header(spec=bs), chunk(1, 0, q), chunk(2, 0, kv), chunk(3, 0, kv)))
write(R, "context_without_store", stream(header(extra=field(16, b"chat"))))
# Region "r" (the fuzzer registers it, 1 MiB): q read from it, o written to it, and mistakes.
ref = lambda off, n: field(1, b"r") + field(2, off) + field(3, n)
write(R, "q_from_region", stream(header(extra=field(20, ref(128, 64))), chunk(2, 0, kv), chunk(3, 0, kv)))
write(R, "o_to_region", stream(header(extra=field(23, ref(0, 64))), chunk(1, 0, q), chunk(2, 0, kv),
                               chunk(3, 0, kv)))
write(R, "o_and_lse_to_region", stream(header(extra=field(10, 1) + field(23, ref(0, 64)) +
                                              field(24, ref(64, 32))), chunk(1, 0, q),
                                       chunk(2, 0, kv), chunk(3, 0, kv)))
write(R, "chunk_for_region_tensor", stream(header(extra=field(20, ref(0, 64))), chunk(1, 0, q)))
write(R, "region_wrong_size", stream(header(extra=field(20, ref(0, 63)))))
write(R, "region_unaligned", stream(header(extra=field(20, ref(32, 64)))))
write(R, "region_past_end", stream(header(extra=field(20, ref(1048576, 64)))))
write(R, "region_unknown", stream(header(extra=field(20, field(1, b"x") + field(3, 64)))))
write(R, "lse_region_alone", stream(header(extra=field(24, field(1, b"l")))))
write(R, "no_message", stream(b""))
# Structured-mode seeds (even first byte): FuzzedDataProvider reads them from the end.
write(R, "structured_zeros", b"\x00" + bytes(64))
write(R, "structured_ones", b"\x00" + b"\x01" * 64)

# ---- spec (FuzzedDataProvider bytes) ----
S = "fuzz_spec"
write(S, "zeros", bytes(64))
write(S, "ones", b"\x01" * 64)
write(S, "ramp", bytes(range(128)))
write(S, "ff", b"\xff" * 64)
