#!/usr/bin/env python3
"""Checks the layering of attnserve's sources from their #include lines (docs/DESIGN.md, "Layers").

Each rule names the files it covers and the include prefixes they must not use. Prints every
violation as FILE:LINE: include "X" (rule) and exits 1 when there is one.
Usage: scripts/check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

GENERATED_PROTO = ("attnserve/v1/",)
GRPC = ("grpcpp/", "grpc/", "google/protobuf/") + GENERATED_PROTO
BACKENDS = ("core/cpu/", "core/cuda/", "core/parallel/")

# (name, files the rule covers (path prefixes), allowed exceptions (path prefixes), forbidden
# include prefixes)
RULES = [
    ("core knows no gRPC, protobuf, server, client or wire", ("core/",), (),
     GRPC + ("server/", "client/", "wire/", "bench/")),
    ("the engine names no backend", ("core/engine/",), (), BACKENDS),
    ("spec, tensor, reference and util are below the engine and the backends",
     ("core/spec/", "core/tensor/", "core/reference/", "core/util/"), (),
     ("core/engine/",) + BACKENDS),
    ("the CPU backend does not use the CUDA backend or core/parallel", ("core/cpu/",), (),
     ("core/cuda/", "core/parallel/")),
    # cuda_options.h is the one CUDA header without CUDA in it: the server parses its flags.
    ("the CUDA backend does not use the CPU backend or core/parallel", ("core/cuda/",), (),
     ("core/cpu/", "core/parallel/")),
    ("wire/ converts between proto and core types only", ("wire/",), (),
     ("server/", "client/", "bench/") + BACKENDS),
    ("the client talks to the server through proto and wire/ only", ("client/",), (),
     ("server/", "core/engine/") + BACKENDS),
    ("the scheduler speaks core types only", ("server/scheduler",), (),
     GENERATED_PROTO + ("grpcpp/", "google/protobuf/", "server/grpc/", "wire/")),
    ("the server reaches backends only through the device pool and its options",
     ("server/",), ("server/device_pool.cc",),
     ("core/cuda/cuda_device.h", "core/cuda/cuda_attention.h", "core/cuda/flash_fwd",
      "core/cuda/cudnn_sdpa", "core/cpu/cpu_backend.h", "client/", "bench/")),
]

SOURCE = re.compile(r"\.(cc|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# The scheduler must not switch on build configuration either: strategies are chosen by CMake.
NO_IF = (("server/scheduler.h", "server/scheduler.cc"), re.compile(r"^\s*#\s*(if|ifdef|elif)\b"))


def violations(root):
    bad = []
    for top in ("core", "server", "client", "wire", "bench"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not SOURCE.search(f):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                with open(os.path.join(root, path), errors="replace") as src:
                    lines = src.readlines()
                for n, line in enumerate(lines, 1):
                    if path in NO_IF[0] and NO_IF[1].match(line):
                        bad.append(f"{path}:{n}: #if in the scheduler (choose strategies in CMake)")
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    for name, covers, allowed, forbidden in RULES:
                        if not path.startswith(covers) or path.startswith(allowed):
                            continue
                        if inc.startswith(forbidden):
                            bad.append(f'{path}:{n}: include "{inc}" ({name})')
    return bad


def self_test():
    """The check must fail on a tree that breaks a rule, and pass on one that does not."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "core/engine"))
        os.makedirs(os.path.join(root, "server"))
        with open(os.path.join(root, "core/engine/device.h"), "w") as f:
            f.write('#include "core/spec/attention_spec.h"\n')
        with open(os.path.join(root, "server/scheduler.h"), "w") as f:
            f.write('#ifndef GUARD_H_\n#include "core/engine/device.h"\n#endif\n')
        assert not violations(root), violations(root)
        with open(os.path.join(root, "core/engine/device.h"), "a") as f:
            f.write('#include "core/cuda/cuda_device.h"\n')
        with open(os.path.join(root, "server/scheduler.h"), "a") as f:
            f.write('#include "attnserve/v1/attnserve.pb.h"\n#if defined(X)\n#endif\n')
        found = violations(root)
        assert len(found) == 3, found
    print("check_layers: self-test OK")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = violations(os.path.abspath(root))
    for b in bad:
        print(b)
    if bad:
        print(f"check_layers: {len(bad)} violation(s)")
        return 1
    print("check_layers: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
