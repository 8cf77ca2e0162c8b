"""lattice's CUDA memory: counters and the cache of its stream-ordered allocator.

lattice allocates its own device memory (relations, outputs, temporaries) from a caching pool with
the semantics of torch's caching allocator: a freed block is reused by later allocations on the
stream it was allocated on, misses go to ``cudaMallocAsync`` on the device's memory pool, and
allocations made while a stream is captured into a CUDA graph belong to the graph. This module
reports what that allocator did, so that tests and users can check a warm network forward makes
no allocator driver calls and no host synchronisations.
"""
from __future__ import annotations

from ._core import core

__all__ = ["memory_stats", "empty_cache", "host_syncs"]


def memory_stats() -> dict:
    """Counters since the process started (all zero when lattice was built without CUDA).

    Keys: ``driver_allocs`` / ``driver_frees`` (``cudaMallocAsync`` / ``cudaFreeAsync`` calls the
    cache could not avoid), ``cache_hits``, ``live_bytes`` (held by live arrays), ``cached_bytes``
    (free blocks kept for reuse), ``host_syncs`` (copies that touch host memory and therefore wait
    for the stream: each is a device-to-host read-back or a host upload), ``graph_allocs``
    (allocations made during CUDA-graph capture).
    """
    return dict(core.cuda_memory_stats())


def host_syncs() -> int:
    """How many times lattice has waited for a CUDA stream (see :func:`memory_stats`)."""
    return int(core.cuda_memory_stats()["host_syncs"])


def empty_cache() -> None:
    """Returns every cached free block to the device and trims the device memory pool.

    Like ``torch.cuda.empty_cache()``, which does not see lattice's cache: call both to give the
    memory of both libraries back to other processes.
    """
    core.cuda_empty_cache()
