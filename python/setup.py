"""setuptools entry point: generates the gRPC stubs from ../proto before anything is built.

Every build hook (metadata, wheel, editable install) runs this file, so the stubs exist before
setuptools looks for the attnserve.v1 package. An sdist carries a copy of the proto (see
build_proto.py), so a wheel can also be built from one.
"""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_proto  # noqa: E402

build_proto.generate()
grpc_floor, protobuf_floor = build_proto.runtime_floors()
setup(install_requires=[f"grpcio>={grpc_floor}", f"protobuf>={protobuf_floor}", "numpy>=1.22"])
