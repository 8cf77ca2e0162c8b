"""Keeps freed feature matrices in the process heap instead of handing them back to the kernel.

Why (issue 17, docs/performance.md): on Linux/glibc every allocation above the mmap threshold
(at most 32 MiB, the size of one 94,444 x 96 float32 feature matrix is 36 MiB) is a fresh
``mmap`` that the kernel must zero page by page on first touch, and ``free`` unmaps it again. A
sparse network allocates such a matrix for every conv output, BatchNorm, ReLU, residual add and
concatenation, forward and backward, so on a 2-core machine torch's ReLU of a (94,444, 96) matrix
took 28 ms, 24 of them in page faults (4.4 ms with the heap reused); lattice's own outputs
(``aligned_alloc``) and accumulators paid the same.

What: once, when lattice is imported, ``mallopt(M_MMAP_MAX, 0)`` (large blocks come from the
heap, where a freed block is reused by the next allocation of its size class) and
``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` (up to 1 GiB of free space at the top of the heap is kept
instead of being returned after every step). glibc still maps memory directly where the heap
cannot grow (and for threads' secondary arenas), so no allocation fails because of this. The cost:
the process keeps its peak heap mapped (what a caching allocator does); resident memory after a
peak is not returned to the system until the process exits.

It is process-wide (torch's tensors profit too), applies only to glibc, and is skipped when
``LATTICE_HOST_MALLOC=default`` is set in the environment (or when the user already set glibc's
``MALLOC_MMAP_MAX_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``GLIBC_TUNABLES``, which we then respect).
:func:`host_malloc_tuned` says whether it was applied.
"""
from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_BYTES = 1 << 30

_applied = False


def _user_chose() -> bool:
    env = os.environ
    if env.get("LATTICE_HOST_MALLOC", "").strip().lower() == "default":
        return True
    if any(k in env for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")):
        return True
    return "glibc.malloc" in env.get("GLIBC_TUNABLES", "")


def tune() -> bool:
    """Applies the heap settings above once per process; returns whether they are in effect."""
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or _user_chose():
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_BYTES))
    return _applied


def host_malloc_tuned() -> bool:
    """True when lattice changed glibc's heap settings in this process (see the module doc)."""
    return _applied
