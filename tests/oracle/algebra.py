"""Float64 oracle of the sparse algebra and coordinate utilities (SEMANTICS.md "Sparse algebra and
coordinate utilities").

Coordinates are ``(N, 4)`` int rows ``(batch, x, y, z)``; sets are matched through Python dicts of
row tuples. Feature math is float64 numpy; callers round inputs to the storage dtype first
(:func:`oracle.round_to_dtype`). This module imports only numpy and is written for obvious
correctness, not speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .geometry import as_triple, floor_div

__all__ = [
    "JOINS",
    "DEFAULT_JOIN",
    "align",
    "combine",
    "combine_backward",
    "sparse_binary",
    "union_coords",
    "intersection_coords",
    "lookup_coords",
    "downsample_coords",
    "morton_code",
    "morton_codes",
    "morton_order",
    "crop_mask",
    "collate",
    "from_coordinates",
    "to_dense",
    "from_dense",
]

JOINS = ("inner", "left", "right", "outer")
DEFAULT_JOIN = {"add": "outer", "sub": "outer", "mul": "inner", "maximum": "inner", "minimum": "inner", "cat": "inner"}
MORTON_OFFSET = 1 << 20


def _rows(coords: Any) -> list[tuple[int, ...]]:
    c = np.asarray(coords, dtype=np.int64).reshape(-1, 4)
    return [tuple(int(v) for v in r) for r in c]


def _index(coords: Any) -> dict[tuple[int, ...], int]:
    rows = _rows(coords)
    index: dict[tuple[int, ...], int] = {}
    for i, r in enumerate(rows):
        if r in index:
            raise ValueError(f"row {i} {r} repeats row {index[r]}")
        index[r] = i
    return index


def align(lhs: Any, rhs: Any, join: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(coords (M, 4) int32, lhs_rows (M,) int64, rhs_rows (M,) int64)``; -1 marks a missing side.

    inner: lhs rows found in rhs (lhs order); left: lhs rows; right: rhs rows; outer: lhs rows then
    the rhs rows absent from lhs (rhs order).
    """
    if join not in JOINS:
        raise ValueError(f"unknown join {join!r}")
    lrows, rrows = _rows(lhs), _rows(rhs)
    li, ri = _index(lhs), _index(rhs)
    pairs: list[tuple[int, int]] = []
    if join in ("inner", "left", "outer"):
        for i, r in enumerate(lrows):
            j = ri.get(r, -1)
            if join == "inner" and j < 0:
                continue
            pairs.append((i, j))
        if join == "outer":
            pairs += [(-1, j) for j, r in enumerate(rrows) if r not in li]
    else:  # right
        pairs = [(li.get(r, -1), j) for j, r in enumerate(rrows)]
    out = [lrows[i] if i >= 0 else rrows[j] for i, j in pairs]
    coords = np.array(out, dtype=np.int32).reshape(-1, 4)
    l = np.array([p[0] for p in pairs], dtype=np.int64)
    r = np.array([p[1] for p in pairs], dtype=np.int64)
    return coords, l, r


def _side(feats: np.ndarray, rows: np.ndarray, fill: float) -> np.ndarray:
    """feats[rows] with the fill where rows == -1."""
    out = np.full((rows.shape[0], feats.shape[1]), float(fill), dtype=np.float64)
    ok = rows >= 0
    out[ok] = feats[rows[ok]]
    return out


def combine(op: str, lhs: Any, rhs: Any, lhs_rows: Any, rhs_rows: Any, fill: float = 0.0) -> np.ndarray:
    """Forward of an aligned combine in float64: add, sub, mul, maximum, minimum (ties -> lhs), cat."""
    x = np.asarray(lhs, dtype=np.float64)
    y = np.asarray(rhs, dtype=np.float64)
    a = _side(x, np.asarray(lhs_rows), fill)
    b = _side(y, np.asarray(rhs_rows), fill)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "maximum":
        return np.where((a >= b) | np.isnan(a), a, b)
    if op == "minimum":
        return np.where((a <= b) | np.isnan(a), a, b)
    if op == "cat":
        return np.concatenate([a, b], axis=1)
    raise ValueError(f"unknown op {op!r}")


def combine_backward(op: str, lhs: Any, rhs: Any, lhs_rows: Any, rhs_rows: Any, grad: Any,
                     fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Gradients ``(d lhs, d rhs)`` of :func:`combine` for the output gradient ``grad``.

    A missing side (the fill) gets nothing; maximum/minimum send each element's gradient to the
    side they chose (lhs on ties); input rows absent from the output get 0.
    """
    x = np.asarray(lhs, dtype=np.float64)
    y = np.asarray(rhs, dtype=np.float64)
    g = np.asarray(grad, dtype=np.float64)
    lr, rr = np.asarray(lhs_rows), np.asarray(rhs_rows)
    a, b = _side(x, lr, fill), _side(y, rr, fill)
    if op == "cat":
        ga, gb = g[:, : x.shape[1]], g[:, x.shape[1]:]
    elif op == "add":
        ga, gb = g, g
    elif op == "sub":
        ga, gb = g, -g
    elif op == "mul":
        ga, gb = g * b, g * a
    elif op in ("maximum", "minimum"):
        lhs_wins = ((a >= b) if op == "maximum" else (a <= b)) | np.isnan(a)
        ga, gb = np.where(lhs_wins, g, 0.0), np.where(lhs_wins, 0.0, g)
    else:
        raise ValueError(f"unknown op {op!r}")
    dx = np.zeros_like(x)
    dy = np.zeros_like(y)
    for m in range(g.shape[0]):
        if lr[m] >= 0:
            dx[lr[m]] = ga[m]
        if rr[m] >= 0:
            dy[rr[m]] = gb[m]
    return dx, dy


def sparse_binary(op: str, lhs_coords: Any, lhs_feats: Any, rhs_coords: Any, rhs_feats: Any,
                  join: str | None = None, fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(coords, feats)`` of sparse_<op>(lhs, rhs) with the op's default join unless given."""
    coords, l, r = align(lhs_coords, rhs_coords, join or DEFAULT_JOIN[op])
    return coords, combine(op, lhs_feats, rhs_feats, l, r, fill)


def union_coords(a: Any, b: Any) -> np.ndarray:
    return align(a, b, "outer")[0]


def intersection_coords(a: Any, b: Any) -> np.ndarray:
    return align(a, b, "inner")[0]


def lookup_coords(table: Any, queries: Any) -> np.ndarray:
    """(Q,) int64 row of each query in ``table`` or -1 (queries may repeat)."""
    index = _index(table)
    return np.array([index.get(q, -1) for q in _rows(queries)], dtype=np.int64)


def downsample_coords(coords: Any, stride: Any) -> tuple[np.ndarray, np.ndarray]:
    """Unique ``(b, floor_div(x, sx), ...)`` in first-occurrence order, and the input -> output map."""
    s = as_triple(stride)
    c = np.asarray(coords, dtype=np.int64).reshape(-1, 4)
    seen: dict[tuple[int, ...], int] = {}
    out: list[tuple[int, ...]] = []
    inverse = np.zeros(c.shape[0], dtype=np.int64)
    for i, row in enumerate(c):
        key = (int(row[0]), *(int(floor_div(int(row[1 + a]), s[a])) for a in range(3)))
        if key not in seen:
            seen[key] = len(out)
            out.append(key)
        inverse[i] = seen[key]
    return np.array(out, dtype=np.int32).reshape(-1, 4), inverse


def morton_code(x: int, y: int, z: int) -> int:
    """Interleave x, y, z (each offset by 2^20 into 21 bits): bit 3i+2 = x_i, 3i+1 = y_i, 3i = z_i."""
    code = 0
    for axis_shift, v in ((2, x), (1, y), (0, z)):
        u = int(v) + MORTON_OFFSET
        if not 0 <= u < (1 << 21):
            raise ValueError(f"value {v} outside [-2^20, 2^20)")
        for i in range(21):
            code |= ((u >> i) & 1) << (3 * i + axis_shift)
    return code


def morton_codes(coords: Any) -> np.ndarray:
    """(N,) int64 codes of (N, 3) (x, y, z) or (N, 4) (batch, x, y, z) rows (batch ignored)."""
    c = np.asarray(coords, dtype=np.int64)
    xyz = c[:, -3:]
    return np.array([morton_code(*r) for r in xyz], dtype=np.int64).reshape(-1)


def morton_order(coords: Any) -> np.ndarray:
    """(N,) permutation by (batch, code), stable."""
    c = np.asarray(coords, dtype=np.int64)
    codes = morton_codes(c)
    batch = c[:, 0] if c.shape[1] == 4 else np.zeros(c.shape[0], dtype=np.int64)
    return np.array(sorted(range(c.shape[0]), key=lambda i: (int(batch[i]), int(codes[i]), i)), dtype=np.int64)


def crop_mask(coords: Any, lo: Any, hi: Any) -> np.ndarray:
    """Rows with lo <= (x, y, z) < hi on every axis."""
    c = np.asarray(coords, dtype=np.int64)
    lo3, hi3 = np.array(as_triple(lo)), np.array(as_triple(hi))
    return np.all((c[:, 1:] >= lo3) & (c[:, 1:] < hi3), axis=1)


def collate(samples: Sequence[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Batched ``(coords, feats, batch_counts)``: sample i gets batch i; a batch column is replaced."""
    coords, feats, counts = [], [], []
    for i, (c, f) in enumerate(samples):
        xyz = np.asarray(c, dtype=np.int64)[:, -3:]
        coords.append(np.concatenate([np.full((xyz.shape[0], 1), i), xyz], axis=1))
        feats.append(np.asarray(f, dtype=np.float64))
        counts.append(int(xyz.shape[0]))
    return np.concatenate(coords).astype(np.int32), np.concatenate(feats), counts


def from_coordinates(coords: Any, feats: Any, reduction: str = "mean") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique rows (first occurrence), the per-row sum or mean of features, and the inverse map."""
    unique, inverse = downsample_coords(coords, 1)
    f = np.asarray(feats, dtype=np.float64)
    out = np.zeros((unique.shape[0], f.shape[1]))
    counts = np.zeros(unique.shape[0])
    for i, m in enumerate(inverse):
        out[m] += f[i]
        counts[m] += 1
    if reduction == "mean":
        out = out / np.maximum(counts, 1)[:, None]
    elif reduction != "sum":
        raise ValueError(reduction)
    return unique, out, inverse


def to_dense(coords: Any, feats: Any, batches: int, shape: Any, origin: Any = 0) -> np.ndarray:
    """(B, C, X, Y, Z) float64 grid with row (b, x, y, z) at [b, :, x-ox, y-oy, z-oz]."""
    c = np.asarray(coords, dtype=np.int64)
    f = np.asarray(feats, dtype=np.float64)
    s, o = as_triple(shape), as_triple(origin)
    grid = np.zeros((batches, f.shape[1], *s))
    for row, v in zip(c, f):
        grid[row[0], :, row[1] - o[0], row[2] - o[1], row[3] - o[2]] = v
    return grid


def from_dense(grid: Any, origin: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sites with any non-zero channel, lexicographic (b, x, y, z) order: (coords + origin, feats)."""
    g = np.asarray(grid, dtype=np.float64)
    o = as_triple(origin)
    coords, feats = [], []
    for b, x, y, z in np.ndindex(g.shape[0], *g.shape[2:]):
        v = g[b, :, x, y, z]
        if np.any(v != 0):
            coords.append((b, x + o[0], y + o[1], z + o[2]))
            feats.append(v)
    return np.array(coords, dtype=np.int32).reshape(-1, 4), np.array(feats).reshape(-1, g.shape[1])
