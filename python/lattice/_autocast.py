"""``torch.autocast`` for lattice's own kernels (convolutions and packed-weight ops).

torch's autocast only rewrites torch's own ops; lattice's convolutions run through a
``torch.autograd.Function`` whose kernels live in the C++ core, so without this module they would
stay in float32 inside an autocast region. The rule copies torch's rule for ``conv3d`` (an op of
autocast's "lower precision" list):

* inside ``torch.autocast(device_type, dtype)`` for the device the features live on, every
  floating-point argument that is not float64 (features, weight, bias) is cast to the autocast
  dtype before the op runs; the output has that dtype; the kernels accumulate in float32 as for any
  float16 / bfloat16 call;
* float64 arguments are left alone (torch does the same), and so is everything outside an
  autocast region;
* the casts are ordinary differentiable torch ops, so gradients flow back to float32 parameters
  in float32 (what ``torch.cuda.amp.GradScaler`` expects).

Pooling, sparse algebra and point/voxel ops follow the dtype of their inputs (torch's rule for
ops outside autocast's lists).
"""
from __future__ import annotations

from typing import Optional

import torch


def _keyed_api() -> bool:
    """True when torch has the autocast API keyed by device type (torch >= 2.4)."""
    if not hasattr(torch, "get_autocast_dtype"):
        return False
    try:
        torch.is_autocast_enabled("cpu")  # type: ignore[call-arg]
    except TypeError:
        return False
    return True


# Decided once at import (the API of the torch in use does not change): asking torch 1.13's
# ``is_autocast_enabled`` for a device type raised and caught a TypeError on every call.
_KEYED = _keyed_api()


def autocast_dtype(device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype in force for ``device``'s type, or None outside an autocast region."""
    kind = device.type
    if _KEYED:
        if (kind == "cpu" or kind == "cuda") and torch.is_autocast_enabled(kind):  # type: ignore[call-arg]
            return torch.get_autocast_dtype(kind)  # type: ignore[attr-defined]
        return None
    if kind == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if kind == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return None


def _eligible(t: Optional[torch.Tensor], dtype: torch.dtype) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.dtype != dtype)


def cast(t: Optional[torch.Tensor], dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
    """``t`` in the autocast ``dtype`` (None: unchanged), by torch's eligibility rule."""
    if dtype is None or not _eligible(t, dtype):
        return t
    return t.to(dtype)  # type: ignore[union-attr]
