"""Point -> voxel quantization (SEMANTICS.md "Point <-> voxel")."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .._core import as_tensor, core, from_core, to_core
from .._device import check_device

FloatOr3 = Union[float, Sequence[float]]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_))


def _triple_float(v: Any, what: str, op: str = "sparse_quantize") -> tuple[float, float, float]:
    """A number or 3 numbers -> (x, y, z) floats; raises ``[op] what: ...`` otherwise."""
    if _is_number(v):
        return (float(v), float(v), float(v))
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, (str, bytes)) or not isinstance(v, (Sequence, np.ndarray)):
        raise TypeError(f"[{op}] {what}: expected a number or 3 numbers, got {type(v).__name__}")
    items = list(v)
    if len(items) != 3:
        raise ValueError(f"[{op}] {what}: expected a number or 3 numbers, got {len(items)} values")
    if not all(_is_number(i) for i in items):
        raise TypeError(f"[{op}] {what}: expected a number or 3 numbers, got {items!r}")
    return (float(items[0]), float(items[1]), float(items[2]))


def _points(points: Any, op: str) -> torch.Tensor:
    p = as_tensor(points, "points", op)
    if p.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"[{op}] points: expected float32 or float64, got {p.dtype}")
    return p


def _batch(batch_indices: Any, op: str, points: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """The batch ids as a tensor (None stays None), on the device of ``points`` when given."""
    if batch_indices is None:
        return None
    b = as_tensor(batch_indices, "batch_indices", op)
    if points is not None:
        check_device(op, "batch_indices", b, points.device)
    return b


def sparse_quantize(
    points: Any,
    voxel_size: FloatOr3,
    batch_indices: Optional[Any] = None,
    *,
    origin: FloatOr3 = 0.0,
    drop_invalid: bool = False,
    route: Optional[str] = None,
) -> Union[tuple[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Voxelizes points: ``v = floor((p - origin) / voxel_size)`` per axis, batch id in the key.

    Args:
        points: (P, 3) float32/float64 tensor or numpy array (x, y, z).
        voxel_size: positive number or 3 numbers (per axis).
        batch_indices: optional (P,) integer batch id per point (>= 0); default all 0.
        origin: number or 3 numbers subtracted before division.
        drop_invalid: drop points with a NaN/inf coordinate instead of raising.

    Returns:
        ``(coords, inverse, counts)``: unique voxel coords (M, 4) int32 ``(batch, x, y, z)`` in
        first-occurrence order, ``inverse`` (P,) int64 point -> voxel row, ``counts`` (M,) int64.

        With ``drop_invalid=True``: ``(coords, inverse, counts, kept)`` where ``kept`` (P,) bool is
        False for the dropped points and the other three are exactly the result for
        ``points[kept]`` (and ``batch_indices[kept]``): ``inverse`` has ``kept.sum()`` entries,
        one per kept point in order.

    Raises:
        ValueError: NaN/inf points without ``drop_invalid`` (the first bad row is named), a voxel
            index outside int32 (also with ``drop_invalid``), non-positive voxel size, bad
            shapes or batch ids.
        TypeError: non-float points, non-integer batch ids, a voxel_size/origin that is not a
            number or 3 numbers.
    """
    op = "sparse_quantize"
    p = _points(points, op)
    b = _batch(batch_indices, op, p)
    if not isinstance(drop_invalid, (bool, np.bool_)):
        raise TypeError(f"[{op}] drop_invalid: expected a bool, got {type(drop_invalid).__name__}")
    out = core.sparse_quantize(
        to_core(p), _triple_float(voxel_size, "voxel_size"), _triple_float(origin, "origin"),
        None if b is None else to_core(b), route, bool(drop_invalid),
    )
    coords, inverse, counts = (from_core(t) for t in out[:3])
    if not drop_invalid:
        return coords, inverse, counts
    return coords, inverse, counts, from_core(out[3]).to(torch.bool)
