"""Point -> voxel quantization (minimal version; the full point/voxel set is its own issue)."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .._core import as_tensor, core, from_core, to_core


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_))


def _triple_float(v: Any, what: str) -> tuple[float, float, float]:
    if _is_number(v):
        return (float(v), float(v), float(v))
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, (str, bytes)) or not isinstance(v, (Sequence, np.ndarray)):
        raise TypeError(f"[sparse_quantize] {what}: expected a number or 3 numbers, got {type(v).__name__}")
    items = list(v)
    if len(items) != 3:
        raise ValueError(f"[sparse_quantize] {what}: expected a number or 3 numbers, got {len(items)} values")
    if not all(_is_number(i) for i in items):
        raise TypeError(f"[sparse_quantize] {what}: expected a number or 3 numbers, got {items!r}")
    return (float(items[0]), float(items[1]), float(items[2]))


def sparse_quantize(
    points: Any,
    voxel_size: Union[float, Sequence[float]],
    batch_indices: Optional[Any] = None,
    *,
    origin: Union[float, Sequence[float]] = 0.0,
    route: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Voxelizes points: ``v = floor((p - origin) / voxel_size)`` per axis, batch id in the key.

    Args:
        points: (P, 3) float32/float64 tensor or numpy array (x, y, z).
        voxel_size: positive number or 3 numbers.
        batch_indices: optional (P,) integer batch id per point (>= 0).
        origin: number or 3 numbers subtracted before division.

    Returns:
        ``(coords, inverse, counts)``: unique voxel coords (M, 4) int32 ``(batch, x, y, z)`` in
        first-occurrence order, ``inverse`` (P,) int64 point -> voxel row, ``counts`` (M,) int64.

    Raises:
        ValueError: NaN/inf points (the first bad row is named), non-positive voxel size.
    """
    op = "sparse_quantize"
    p = as_tensor(points, "points", op)
    if p.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"[{op}] points: expected float32 or float64, got {p.dtype}")
    b = None
    if batch_indices is not None:
        b = as_tensor(batch_indices, "batch_indices", op)
    coords, inverse, counts = core.sparse_quantize(
        to_core(p), _triple_float(voxel_size, "voxel_size"), _triple_float(origin, "origin"),
        None if b is None else to_core(b), route,
    )
    return from_core(coords), from_core(inverse), from_core(counts)
