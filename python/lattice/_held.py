"""Core arrays held across calls, for tensors that many calls pass unchanged.

A module's parameters and running statistics reach the core on every forward. Each DLPack
crossing (:func:`lattice._core.to_core`: ``detach``, the stream hand-off, ``to_dlpack``, the
capsule's import) costs a few microseconds of host time, and a training step is bound by the
host on the GPU (docs/performance.md). :func:`held` converts such a tensor once and keeps the
core's array (``core.HeldArray``, which every op takes where it takes a capsule) for as long as
the tensor object lives and keeps the same memory, shape, strides, dtype and device. The held
array shares the tensor's memory, so in-place updates (an optimizer step, running statistics)
are seen; a new storage (``p.data = ...``, ``.to()``, ``load_state_dict`` into a resized tensor)
gives a new one. The entry dies with the tensor object (a weak reference); while it lives it keeps
the storage alive, so no other tensor can be given the same address in the meantime.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from ._core import core, to_core

# id(tensor) -> (weak reference, data_ptr, shape, strides, dtype, device, held array)
_HELD: dict = {}


def _forget(key: int) -> Any:
    return lambda _ref: _HELD.pop(key, None)


def held(t: torch.Tensor) -> Any:
    """A ``core.HeldArray`` viewing ``t`` (see the module docstring); a plain capsule for a strided
    CUDA tensor (the core needs a contiguous copy, made per call by to_core)."""
    key = id(t)
    e = _HELD.get(key)
    ptr = t.data_ptr()
    if e is not None and e[0]() is t and e[1] == ptr and e[2] == t.shape and e[3] == t.stride() and \
            e[4] == t.dtype and e[5] == t.device:
        return e[6]
    if t.is_cuda and not t.is_contiguous():
        return to_core(t)
    h = core.hold(to_core(t))
    _HELD[key] = (weakref.ref(t, _forget(key)), ptr, t.shape, t.stride(), t.dtype, t.device, h)
    return h


def optional_held(t: Optional[torch.Tensor]) -> Any:
    return None if t is None else held(t)
