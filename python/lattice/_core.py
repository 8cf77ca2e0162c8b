"""Loads the compiled core and moves tensors across the DLPack boundary.

The extension (``_lattice``) does not link libtorch: torch tensors cross as DLPack capsules,
so one build works with any torch that speaks DLPack (Debian's 1.13 and torch 2.x).
"""
from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import os
import sys
import threading
from typing import Any, Optional

import numpy as np
import torch
import torch.utils.data
import torch.utils.dlpack

def _load_extension() -> Any:
    """The compiled core: from LATTICE_EXTENSION_DIR when set (a build tree of its own, e.g. for
    several builds side by side), else the `_lattice` module inside this package."""
    ext_dir = os.environ.get("LATTICE_EXTENSION_DIR")
    if ext_dir:
        found = sorted(glob.glob(os.path.join(ext_dir, "_lattice*" + importlib.machinery.EXTENSION_SUFFIXES[0])))
        if not found:
            raise ImportError(f"lattice: LATTICE_EXTENSION_DIR={ext_dir!r} holds no _lattice extension")
        spec = importlib.util.spec_from_file_location("lattice._lattice", found[0])
        module = importlib.util.module_from_spec(spec)
        sys.modules["lattice._lattice"] = module
        spec.loader.exec_module(module)
        return module
    try:
        from . import _lattice
    except ImportError as exc:  # pragma: no cover - exercised only on a broken install
        raise ImportError(
            "lattice: the compiled extension `_lattice` is missing or was built for another Python. "
            "Build it with `make build` (or see README.md)."
        ) from exc
    return _lattice


core = _load_extension()

UnsupportedError = core.UnsupportedError


# The process whose CPU thread count lattice has settled (see _settle_threads); None: not yet.
_threads_pid: Optional[int] = None


def _settle_threads() -> None:
    """Once per process, before its first CPU op: inside a torch DataLoader worker lattice's own
    kernels run on one thread, as torch's do there (``torch.set_num_threads(1)`` in every worker),
    unless LATTICE_NUM_THREADS is set or the worker called :func:`lattice.set_num_threads`.
    Workers that voxelize or convolve would otherwise each start a thread per CPU next to the
    training process, and every OpenMP barrier would then wait on a descheduled thread
    (docs/performance.md, "Known problem: OpenMP barriers on a busy machine"). Results do not
    depend on the thread count."""
    global _threads_pid
    pid = os.getpid()
    if pid == _threads_pid:
        return
    _threads_pid = pid
    if "LATTICE_NUM_THREADS" not in os.environ and torch.utils.data.get_worker_info() is not None:
        core.set_num_threads(1)


def threads_settled_by_user() -> None:
    """Marks this process's thread count as the user's choice (lattice.set_num_threads)."""
    global _threads_pid
    _threads_pid = os.getpid()


# The process id, kept current across os.fork (a DataLoader worker is a fork): to_core compares it
# with _threads_pid instead of asking the kernel (os.getpid) on every conversion.
_pid: int = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()
    _streams_set.by_device = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _StreamsSet(threading.local):
    """Per host thread (the core's current stream is thread-local, as torch's is; the autograd
    engine runs CUDA backwards on a thread of its own): CUDA device index -> the raw torch stream
    this thread last handed to ``core.set_current_stream``."""

    def __init__(self) -> None:
        self.by_device: dict[int, int] = {}


_streams_set = _StreamsSet()


def _hand_over_stream(t: torch.Tensor) -> None:
    """Before the core sees a CUDA tensor: the core's current stream of its device is torch's
    current stream. Set only when it changed since this thread last set it (``torch.cuda.stream``
    contexts, a DDP / side stream), which saves a call into the core per conversion."""
    index = t.device.index
    if index is None:  # pragma: no cover - a CUDA tensor's device always has an index
        index = torch.cuda.current_device()
    stream = _raw_stream(index)
    seen = _streams_set.by_device
    if seen.get(index) != stream:
        core.set_current_stream(index, stream)
        seen[index] = stream


def forget_streams() -> None:
    """Forgets which streams this thread handed to the core, so the next conversion sets them
    again (for code that called ``core.set_current_stream`` itself)."""
    _streams_set.by_device.clear()


def to_core(t: torch.Tensor) -> Any:
    """A DLPack capsule viewing ``t`` (no copy). Autograd history is dropped, data is shared.

    CUDA tensors: lattice's work runs on torch's current stream of the tensor's device (handed to
    the core here, before it sees the tensor, when it changed: _hand_over_stream), and CUDA kernels
    take contiguous rows, so a strided CUDA tensor is made contiguous on that stream first. CPU
    tensors: the first one of a process settles its thread count (_settle_threads).

    The capsule always wraps a detached alias of ``t`` (not ``t`` itself), so the core's array
    keeps ``t``'s storage alive even if ``t`` is later given another storage (``p.data = ...``,
    ``set_``); :func:`borrow` skips that alias for arguments the core reads only during one call."""
    return _export(t.detach())


def _export(t: torch.Tensor) -> Any:
    """The capsule of ``t`` as it is (to_core / borrow have chosen whether to detach)."""
    if t.is_cuda:
        _hand_over_stream(t)
        if not t.is_contiguous():
            t = t.contiguous()
    elif _threads_pid != _pid:
        _settle_threads()
    return _to_dlpack(t)


def borrow(t: torch.Tensor) -> Any:
    """:func:`to_core` for an argument the core reads only during the call it is passed to and
    does not keep (the features, weight, bias and output gradient of a conv call): a tensor that
    needs no gradient crosses without the detached alias (one torch op less per argument). The
    capsule then holds ``t`` itself, which is alive for the whole call anyway."""
    return _export(t.detach() if t.requires_grad else t)


def _raw_stream_slow(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# torch's current stream as an integer handle, without building a torch.cuda.Stream object (the
# accessor torch's own compiler uses; older torch falls back to the public API).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_slow

_to_dlpack = torch.utils.dlpack.to_dlpack
# torch.utils.dlpack.from_dlpack is a Python wrapper that, for a capsule (all the core returns),
# calls torch._C._from_dlpack; calling it directly saves the wrapper's checks on every output.
_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack


def from_core(capsule: Any) -> torch.Tensor:
    """A torch tensor owning the core array behind ``capsule`` (no copy)."""
    return _from_dlpack(capsule)


def as_tensor(value: Any, what: str, op: str) -> torch.Tensor:
    """Accepts torch tensors and numpy arrays (wrapped without a copy where possible)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise TypeError(f"[{op}] {what}: expected a torch.Tensor or numpy.ndarray, got {type(value).__name__}")


def as_triple(value: Any, what: str, op: str) -> tuple[int, int, int]:
    """An int or a 3-sequence of ints -> (x, y, z)."""
    # Fast paths for what layers pass on every call (a plain int or a tuple of 3 plain ints);
    # anything else takes the general checks below.
    t = type(value)
    if t is int:
        if -2147483648 <= value <= 2147483647:
            return (value, value, value)
    elif t is tuple and len(value) == 3:
        a, b, c = value
        if type(a) is int and type(b) is int and type(c) is int and -2147483648 <= a <= 2147483647 and \
                -2147483648 <= b <= 2147483647 and -2147483648 <= c <= 2147483647:
            return value
    if isinstance(value, bool):
        raise TypeError(f"[{op}] {what}: expected an int or 3 ints, got bool")
    if isinstance(value, (int, np.integer)):
        v = int(value)
        items = [v, v, v]
    else:
        try:
            items = list(value)
        except TypeError:
            raise TypeError(f"[{op}] {what}: expected an int or 3 ints, got {type(value).__name__}") from None
        if len(items) != 3 or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in items):
            raise ValueError(f"[{op}] {what}: expected an int or 3 ints, got {tuple(items)!r}")
    out = (int(items[0]), int(items[1]), int(items[2]))
    for v in out:
        if v < -(2**31) or v > 2**31 - 1:
            raise ValueError(f"[{op}] {what}: expected values within int32, got {value!r}")
    return out


def optional_core(t: Optional[torch.Tensor]) -> Any:
    return None if t is None else to_core(t)


def optional_borrow(t: Optional[torch.Tensor]) -> Any:
    return None if t is None else borrow(t)
