#!/usr/bin/env python3
"""Generates attnserve/v1/attnserve_pb2{,_grpc}.py (and .pyi) from the repository's proto.

Usage: python build_proto.py            (also run by setup.py on every build)

The proto is read from $ATTNSERVE_PROTO_DIR, else ../proto (a checkout of the repository), else
proto/ beside this file (the copy an sdist carries). The output goes into attnserve/v1/, which is
git-ignored: the contract has exactly one source, proto/attnserve/v1/attnserve.proto.
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_REL = os.path.join("attnserve", "v1", "attnserve.proto")


def proto_root():
    candidates = [
        os.environ.get("ATTNSERVE_PROTO_DIR", ""),
        os.path.join(HERE, "..", "proto"),
        os.path.join(HERE, "proto"),
    ]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, PROTO_REL)):
            return os.path.abspath(c)
    raise SystemExit(
        "build_proto: attnserve/v1/attnserve.proto not found under "
        + ", ".join(c for c in candidates if c)
    )


def generate():
    root = proto_root()
    out_pkg = os.path.join(HERE, "attnserve", "v1")
    src = os.path.join(root, PROTO_REL)
    stamp = os.path.join(out_pkg, "attnserve_pb2_grpc.py")
    if os.path.isfile(stamp) and os.path.getmtime(stamp) >= os.path.getmtime(src):
        return
    try:
        from grpc_tools import protoc
        import grpc_tools
    except ImportError:
        raise SystemExit("build_proto: needs grpcio-tools (pip install grpcio-tools)")
    os.makedirs(out_pkg, exist_ok=True)
    # Keep a copy beside the package so an sdist built from here is self-contained.
    local = os.path.join(HERE, "proto", PROTO_REL)
    if os.path.abspath(src) != os.path.abspath(local):
        os.makedirs(os.path.dirname(local), exist_ok=True)
        shutil.copyfile(src, local)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={HERE}",
        f"--pyi_out={HERE}",
        f"--grpc_python_out={HERE}",
        src,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("build_proto: protoc failed on " + src)
    init = os.path.join(out_pkg, "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated from proto/attnserve/v1/attnserve.proto by build_proto.py."""\n')


def runtime_floors():
    """(grpcio, protobuf) versions the generated modules need at run time, read from them."""
    import re

    out_pkg = os.path.join(HERE, "attnserve", "v1")
    with open(os.path.join(out_pkg, "attnserve_pb2_grpc.py")) as f:
        grpc_v = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", f.read())
    with open(os.path.join(out_pkg, "attnserve_pb2.py")) as f:
        pb = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", f.read()
        )
    grpc_floor = grpc_v.group(1) if grpc_v else "1.60"
    protobuf_floor = ".".join(pb.groups()) if pb else "4.25"
    return grpc_floor, protobuf_floor


if __name__ == "__main__":
    generate()
    print("build_proto: attnserve/v1 generated", file=sys.stderr)
