"""lattice._host_memory: the glibc heap settings applied at import (issue 17).

Each case runs a fresh interpreter, because the settings are process-wide and applied once.
"""
import os
import platform
import subprocess
import sys

import pytest

glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
PROBE = "import lattice; print(lattice._host_memory.host_malloc_tuned())"


def _run(extra_env):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LATTICE_HOST_MALLOC", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                        "GLIBC_TUNABLES")}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not glibc, reason="the heap settings apply to glibc only")
def test_applied_by_default_and_skipped_when_the_user_chose():
    """Importing lattice applies the settings; LATTICE_HOST_MALLOC=default or the user's own glibc
    malloc variables leave glibc's defaults alone (the module reports which happened)."""
    assert _run({}) == "True"
    assert _run({"LATTICE_HOST_MALLOC": "default"}) == "False"
    assert _run({"MALLOC_TRIM_THRESHOLD_": "1000000"}) == "False"


@pytest.mark.skipif(not glibc, reason="the heap settings apply to glibc only")
def test_large_blocks_come_from_the_heap_only_when_tuned():
    """A 64 MiB malloc is served from the heap (chunk header without glibc's IS_MMAPPED bit, 0x2)
    after importing lattice, and by a fresh mmap (bit set) with LATTICE_HOST_MALLOC=default: the
    mallopt calls take effect, checked on glibc's own chunk header rather than by timing."""
    code = ("import ctypes, lattice; libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; "
            "libc.free.argtypes = [ctypes.c_void_p]; a = libc.malloc(64 << 20); "
            "size = ctypes.c_size_t.from_address(a - ctypes.sizeof(ctypes.c_size_t)).value; libc.free(a); "
            "print(bool(size & 2), lattice._host_memory.host_malloc_tuned())")
    for extra, expected in (({}, ["False", "True"]), ({"LATTICE_HOST_MALLOC": "default"}, ["True", "False"])):
        env = {k: v for k, v in os.environ.items() if k != "LATTICE_HOST_MALLOC"}
        env.update(extra)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == expected, extra
