"""Reference point -> voxel quantization (SEMANTICS.md, "Point <-> voxel").

``v = floor((p - origin) / voxel_size)`` per axis, computed in float64; the
batch id is part of the key; unique ``(batch, v)`` rows in first-occurrence
order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["sparse_quantize"]


def _per_axis(v: float | Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """A scalar or 3-vector as a float64 array of shape (3,)."""
    arr = np.asarray(v, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(3, float(arr))
    if arr.shape != (3,):
        raise ValueError(f"{name} must be a float or 3 floats, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr}")
    return arr


def sparse_quantize(
    points: Any,
    voxel_size: float | Sequence[float],
    batch_indices: Any = None,
    origin: float | Sequence[float] = 0.0,
    drop_invalid: bool = False,
) -> tuple[np.ndarray, ...]:
    """Quantize points to voxels.

    Args:
        points: ``(P, 3)`` float coordinates.
        voxel_size: positive float or 3 floats.
        batch_indices: optional ``(P,)`` ints (default all 0).
        origin: float or 3 floats subtracted before dividing.
        drop_invalid: drop rows with NaN / inf instead of raising.

    Returns:
        ``coords`` ``(M, 4)`` int64 ``(batch, vx, vy, vz)`` unique, in
        first-occurrence order; ``inverse`` ``(P,)`` int64 (point -> row of
        ``coords``); ``counts`` ``(M,)`` int64 (points per voxel). With
        ``drop_invalid`` a fourth array ``kept`` ``(P,)`` bool, and the first
        three are the result for ``points[kept]`` alone.

    Raises:
        ValueError: on NaN / inf points, non-positive voxel size, or shapes.
    """
    p = np.asarray(points, dtype=np.float64)
    if p.size == 0:
        p = p.reshape(0, 3)
    if p.ndim != 2 or p.shape[1] != 3:
        raise ValueError(f"points must have shape (P, 3), got {p.shape}")
    if drop_invalid:
        kept = np.all(np.isfinite(p), axis=1)
        b_kept = None if batch_indices is None else np.asarray(batch_indices)[kept]
        return (*sparse_quantize(p[kept], voxel_size, b_kept, origin), kept)
    if not np.all(np.isfinite(p)):
        bad = int(np.argwhere(~np.all(np.isfinite(p), axis=1))[0, 0])
        raise ValueError(f"points contain NaN or inf (first at row {bad}: {p[bad]})")
    vs = _per_axis(voxel_size, "voxel_size")
    if np.any(vs <= 0):
        raise ValueError(f"voxel_size must be positive, got {vs}")
    org = _per_axis(origin, "origin")
    n = p.shape[0]
    if batch_indices is None:
        b = np.zeros(n, dtype=np.int64)
    else:
        b_raw = np.asarray(batch_indices)
        if b_raw.shape != (n,):
            raise ValueError(f"batch_indices must have shape ({n},), got {b_raw.shape}")
        if n > 0 and not np.issubdtype(b_raw.dtype, np.integer):
            raise ValueError(f"batch_indices must be integers, got dtype {b_raw.dtype}")
        b = b_raw.astype(np.int64)

    v = np.floor((p - org) / vs)
    if np.any(np.abs(v) >= 2.0**62):
        raise ValueError("voxel index out of int64-safe range")

    row_of: dict[tuple[int, int, int, int], int] = {}
    rows: list[tuple[int, int, int, int]] = []
    counts: list[int] = []
    inverse = np.empty(n, dtype=np.int64)
    for j in range(n):
        key = (int(b[j]), int(v[j, 0]), int(v[j, 1]), int(v[j, 2]))
        r = row_of.get(key)
        if r is None:
            r = len(rows)
            row_of[key] = r
            rows.append(key)
            counts.append(0)
        counts[r] += 1
        inverse[j] = r
    coords = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return coords, inverse, np.array(counts, dtype=np.int64)
