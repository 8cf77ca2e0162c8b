"""Reference point <-> voxel conversion (SEMANTICS.md, "Point <-> voxel"), float64 numpy.

* ``voxelize`` / ``voxelize_backward``: per-voxel sum | mean | max of point features over the
  voxels of :func:`oracle.quantize.sparse_quantize`; max takes the first point holding the
  maximum (lowest point index; a NaN counts as the maximum) and its gradient goes to that point.
* ``point_voxel_map``: ``nearest`` = the voxel containing the point (the quantize floor rule,
  at stride ``s`` the coordinates ``floor_div(v, s)``), ``trilinear`` = the 8 voxel centres
  around the point with trilinear weights, missing voxels weight 0, the rest renormalised to
  sum 1 (``normalize=False`` keeps raw weights); a point with no present corner gets zeros.
  Corner ``k = dx*4 + dy*2 + dz``; physical voxel size ``voxel_size * stride``.
* ``devoxelize`` / ``devoxelize_backward``: the weighted gather and its transpose.

Written independently of lattice: plain loops and dictionaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .quantize import _per_axis, sparse_quantize

__all__ = [
    "devoxelize",
    "devoxelize_backward",
    "point_voxel_map",
    "voxelize",
    "voxelize_backward",
]


def _is_max(candidate: float, best: float) -> bool:
    """True when ``candidate`` replaces ``best`` as the running maximum (NaN wins, first NaN kept)."""
    if np.isnan(best):
        return False
    return bool(np.isnan(candidate) or candidate > best)


def voxelize(
    points: Any,
    feats: Any,
    voxel_size: float | Sequence[float],
    reduction: str = "mean",
    batch_indices: Any = None,
    origin: float | Sequence[float] = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Voxel coordinates, reduced features and the max argmax.

    Returns:
        ``coords`` (M, 4) int64 as :func:`sparse_quantize`; ``out`` (M, C) float64;
        ``argmax`` (M, C) int64 (the point that holds each maximum; -1 unless ``max``).
    """
    coords, inverse, counts = sparse_quantize(points, voxel_size, batch_indices, origin)
    f = np.asarray(feats, dtype=np.float64)
    n = inverse.shape[0]
    if f.ndim != 2 or f.shape[0] != n:
        raise ValueError(f"feats must have shape ({n}, C), got {f.shape}")
    m, c = coords.shape[0], f.shape[1]
    out = np.zeros((m, c))
    argmax = np.full((m, c), -1, dtype=np.int64)
    if reduction not in ("sum", "mean", "max"):
        raise ValueError(f"unknown reduction {reduction!r}")
    for p in range(n):
        v = inverse[p]
        for j in range(c):
            if reduction == "max":
                if argmax[v, j] < 0 or _is_max(f[p, j], out[v, j]):
                    out[v, j] = f[p, j]
                    argmax[v, j] = p
            else:
                out[v, j] += f[p, j]
    if reduction == "mean":
        out /= counts[:, None]
    return coords, out, argmax


def voxelize_backward(
    grad_out: Any, inverse: Any, counts: Any, reduction: str, argmax: Any = None
) -> np.ndarray:
    """Gradient of :func:`voxelize` w.r.t. the point features: (P, C) float64."""
    dy = np.asarray(grad_out, dtype=np.float64)
    inv = np.asarray(inverse, dtype=np.int64)
    cnt = np.asarray(counts, dtype=np.float64)
    dx = np.zeros((inv.shape[0], dy.shape[1]))
    for p in range(inv.shape[0]):
        v = inv[p]
        if reduction == "sum":
            dx[p] = dy[v]
        elif reduction == "mean":
            dx[p] = dy[v] / cnt[v]
        elif reduction == "max":
            for j in range(dy.shape[1]):
                dx[p, j] = dy[v, j] if argmax[v, j] == p else 0.0
        else:
            raise ValueError(f"unknown reduction {reduction!r}")
    return dx


def _floor_div(a: int, b: int) -> int:
    return a // b  # Python's // rounds toward -inf


def point_voxel_map(
    points: Any,
    voxel_coords: Any,
    voxel_size: float | Sequence[float],
    mode: str = "nearest",
    normalize: bool = True,
    batch_indices: Any = None,
    origin: float | Sequence[float] = 0.0,
    stride: int | Sequence[int] = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """``indices`` (P, 8) int64 (-1 = missing) and ``weights`` (P, 8) float64.

    ``nearest`` fills column 0 only (weight 1 when the voxel is present).
    """
    p = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    if not np.all(np.isfinite(p)):
        bad = int(np.argwhere(~np.all(np.isfinite(p), axis=1))[0, 0])
        raise ValueError(f"points contain NaN or inf (first at row {bad})")
    vs = _per_axis(voxel_size, "voxel_size")
    org = _per_axis(origin, "origin")
    s = np.asarray(stride, dtype=np.int64)
    if s.ndim == 0:
        s = np.full(3, int(s))
    vc = np.asarray(voxel_coords, dtype=np.int64).reshape(-1, 4)
    row_of = {tuple(int(t) for t in r): i for i, r in enumerate(vc)}
    if len(row_of) != vc.shape[0]:
        raise ValueError("voxel coordinates must be unique")
    n = p.shape[0]
    b = np.zeros(n, dtype=np.int64) if batch_indices is None else np.asarray(batch_indices, dtype=np.int64)
    indices = np.full((n, 8), -1, dtype=np.int64)
    weights = np.zeros((n, 8))
    for i in range(n):
        if mode == "nearest":
            v = [_floor_div(int(np.floor((p[i, d] - org[d]) / vs[d])), int(s[d])) for d in range(3)]
            r = row_of.get((int(b[i]), *v), -1)
            if r >= 0:
                indices[i, 0] = r
                weights[i, 0] = 1.0
            continue
        if mode != "trilinear":
            raise ValueError(f"unknown mode {mode!r}")
        u = [(p[i, d] - org[d]) / (vs[d] * float(s[d])) - 0.5 for d in range(3)]
        lower = [int(np.floor(x)) for x in u]
        t = [u[d] - np.floor(u[d]) for d in range(3)]
        for dx in (0, 1):
            for dy in (0, 1):
                for dz in (0, 1):
                    k = dx * 4 + dy * 2 + dz
                    key = (int(b[i]), lower[0] + dx, lower[1] + dy, lower[2] + dz)
                    r = row_of.get(key, -1)
                    if r < 0:
                        continue
                    w = 1.0
                    for d, o in enumerate((dx, dy, dz)):
                        w *= t[d] if o else 1.0 - t[d]
                    indices[i, k] = r
                    weights[i, k] = w
        if normalize:
            total = weights[i].sum()
            weights[i] = weights[i] / total if total > 0 else 0.0
    return indices, weights


def devoxelize(voxel_feats: Any, indices: Any, weights: Any) -> np.ndarray:
    """``out[p] = sum over k with indices[p, k] >= 0 of weights[p, k] * voxel_feats[indices[p, k]]``."""
    vf = np.asarray(voxel_feats, dtype=np.float64)
    idx = np.asarray(indices, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    out = np.zeros((idx.shape[0], vf.shape[1]))
    for p in range(idx.shape[0]):
        for k in range(idx.shape[1]):
            if idx[p, k] >= 0:
                out[p] += w[p, k] * vf[idx[p, k]]
    return out


def devoxelize_backward(grad_out: Any, indices: Any, weights: Any, n_voxels: int) -> np.ndarray:
    """Gradient of :func:`devoxelize` w.r.t. the voxel features: (M, C) float64."""
    dy = np.asarray(grad_out, dtype=np.float64)
    idx = np.asarray(indices, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    dv = np.zeros((n_voxels, dy.shape[1]))
    for p in range(idx.shape[0]):
        for k in range(idx.shape[1]):
            if idx[p, k] >= 0:
                dv[idx[p, k]] += w[p, k] * dy[p]
    return dv
