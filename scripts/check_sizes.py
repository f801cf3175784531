#!/usr/bin/env python3
"""Checks that no hand-written source file is over 600 lines and no C++/CUDA function over 150.

Generated files are exempt (wgmma_ops.h is written by gen_wgmma.py; protobuf output lives in the
build tree). Prints each offender and exits 1 when there is one.
Usage: scripts/check_sizes.py [REPO_ROOT]    scripts/check_sizes.py --self-test
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_function_length import funcs  # noqa: E402

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 150
SOURCES = (".cc", ".h", ".cu", ".cuh", ".py")
GENERATED = ("core/cuda/flash_fwd_sm90/wgmma_ops.h",)


def tracked_sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                         check=True).stdout.split()
    return [p for p in out if p.endswith(SOURCES) and p not in GENERATED
            and not p.startswith("bench/results/")]


def offenders(root, paths):
    bad = []
    for p in paths:
        full = os.path.join(root, p)
        if not os.path.exists(full):
            continue
        with open(full, errors="replace") as f:
            n = sum(1 for _ in f)
        if n > MAX_FILE_LINES:
            bad.append(f"{p}: {n} lines (limit {MAX_FILE_LINES})")
        if not p.endswith(".py"):
            for length, line, _ in funcs(full):
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{p}:{line}: function of {length} lines (limit "
                               f"{MAX_FUNCTION_LINES})")
    return bad


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        long_fn = "int f() {\n" + "  int x = 0;\n" * 160 + "  return x;\n}\n"
        with open(os.path.join(root, "a.cc"), "w") as f:
            f.write(long_fn)
        with open(os.path.join(root, "b.cc"), "w") as f:
            f.write("// x\n" * 601)
        with open(os.path.join(root, "c.cc"), "w") as f:
            f.write("int g() {\n  return 1;\n}\n")
        found = offenders(root, ["a.cc", "b.cc", "c.cc"])
        assert len(found) == 2 and found[0].startswith("a.cc:1:") and found[1].startswith("b.cc"), found
    print("check_sizes: self-test OK")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(os.path.dirname(__file__), ".."))
    bad = offenders(root, tracked_sources(root))
    for b in bad:
        print(b)
    if bad:
        print(f"check_sizes: {len(bad)} offender(s)")
        return 1
    print("check_sizes: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
