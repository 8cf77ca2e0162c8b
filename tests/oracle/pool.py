"""Float64 reference pooling (SEMANTICS.md "Pooling"); imports only numpy and this package.

Every function reduces, per output row, the input rows of an explicit edge list built by the
oracle's own relations (:mod:`.relations`), never lattice's:

* ``sum``: the sum of the rows; ``avg``: that sum divided by the number of edges of the row
  (not the kernel volume); rows without edges are 0;
* ``max``: per channel the largest value; equal values go to the first edge in
  (input row, kernel row) order, which is the smallest input row (one input reaches an output
  through one kernel row only); NaN beats every number and the smallest NaN row wins; rows
  without edges are 0 with winner -1. The gradient goes entirely to the winner;
* ``weighted``: the sum of ``w_e * x[i_e]`` (trilinear upsampling).

Global pooling groups the rows by batch id into ``B = len(batch_counts)`` or ``max id + 1``
dense rows. Trilinear weights are computed with exact rational arithmetic (``fractions``) from
the physical voxel centres, independently of lattice's integer formulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from .conv import _f64
from .geometry import as_triple
from .relations import (
    _check_coords,
    forward_relation,
    generative_relation,
    target_relation,
    transposed_relation,
)

__all__ = [
    "global_pool",
    "global_pool_backward",
    "local_pool",
    "pool_backward",
    "pool_edges",
    "pool_forward",
    "pool_transpose",
    "trilinear_edges",
]

MODES = ("sum", "avg", "max", "weighted")


def _edge_arrays(in_idx: Any, out_idx: Any, weights: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    i = np.asarray(in_idx, dtype=np.int64).reshape(-1)
    o = np.asarray(out_idx, dtype=np.int64).reshape(-1)
    if i.shape != o.shape:
        raise ValueError(f"edge arrays differ in length: {i.shape} {o.shape}")
    w = None if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w is not None and w.shape != i.shape:
        raise ValueError(f"weights length {w.shape} differs from the edges {i.shape}")
    return i, o, w


def _beats(v: float, i: int, best: float, best_i: int) -> bool:
    """The max rule: larger wins, ties to the smaller row, NaN beats numbers."""
    if math.isnan(v) or math.isnan(best):
        return math.isnan(v) and (not math.isnan(best) or i < best_i)
    return v > best or (v == best and i < best_i)


def pool_forward(
    x: Any,
    in_idx: Any,
    out_idx: Any,
    n_out: int,
    mode: str,
    weights: Any = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Pooling over an explicit edge list, in float64.

    Args:
        x: ``(N_in, C)`` features.
        in_idx, out_idx: ``(E,)`` edges (any order).
        n_out: number of output rows.
        mode: ``sum``, ``avg``, ``max`` or ``weighted`` (then ``weights`` ``(E,)``).

    Returns:
        ``(y, winners)``: ``y`` ``(n_out, C)`` float64; ``winners`` ``(n_out, C)`` int64 input row
        chosen by max (-1 for a row without edges), None for the other modes.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    x64 = _f64(x)
    i_arr, o_arr, w = _edge_arrays(in_idx, out_idx, weights)
    if mode == "weighted" and w is None:
        raise ValueError("mode 'weighted' needs weights")
    n_out = int(n_out)
    C = x64.shape[1]
    y = np.zeros((n_out, C), dtype=np.float64)
    if mode == "max":
        winners = np.full((n_out, C), -1, dtype=np.int64)
        for i, o in zip(i_arr, o_arr):
            for c in range(C):
                v = float(x64[i, c])
                if winners[o, c] < 0 or _beats(v, int(i), float(y[o, c]), int(winners[o, c])):
                    y[o, c] = v
                    winners[o, c] = i
        return y, winners
    counts = np.zeros(n_out, dtype=np.int64)
    for e, (i, o) in enumerate(zip(i_arr, o_arr)):
        y[o] += x64[i] * (w[e] if mode == "weighted" else 1.0)
        counts[o] += 1
    if mode == "avg":
        y[counts > 0] /= counts[counts > 0, None]
    return y, None


def pool_backward(
    dy: Any,
    in_idx: Any,
    out_idx: Any,
    n_in: int,
    mode: str,
    winners: Any = None,
    weights: Any = None,
) -> np.ndarray:
    """Gradient of :func:`pool_forward` with respect to ``x``, in float64.

    ``dx[i] = sum over edges (i, o) of dy[o] * d`` with ``d`` = 1 (sum), ``1/n_o`` (avg), ``w_e``
    (weighted); for max ``dx[winners[o, c], c] += dy[o, c]``.
    """
    dy64 = _f64(dy)
    i_arr, o_arr, w = _edge_arrays(in_idx, out_idx, weights)
    C = dy64.shape[1]
    dx = np.zeros((int(n_in), C), dtype=np.float64)
    if mode == "max":
        win = np.asarray(winners, dtype=np.int64)
        for o in range(win.shape[0]):
            for c in range(C):
                if win[o, c] >= 0:
                    dx[win[o, c], c] += dy64[o, c]
        return dx
    counts = np.bincount(o_arr, minlength=dy64.shape[0]) if o_arr.size else np.zeros(dy64.shape[0], np.int64)
    for e, (i, o) in enumerate(zip(i_arr, o_arr)):
        scale = 1.0 if mode == "sum" else (1.0 / counts[o] if mode == "avg" else w[e])
        dx[i] += dy64[o] * scale
    return dx


def pool_edges(
    coords: Any,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    *,
    expand: bool = False,
    target: Any = None,
) -> Any:
    """The oracle relation of a local pooling (forward, or target when ``target`` is given).

    ``stride`` defaults to ``kernel_size``.
    """
    st = as_triple(kernel_size if stride is None else stride, "stride")
    if target is not None:
        return target_relation(coords, target, kernel_size, st, padding, dilation)
    return forward_relation(coords, kernel_size, st, padding, dilation, expand)


def local_pool(
    coords: Any,
    x: Any,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    mode: str = "max",
    *,
    expand: bool = False,
    target: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, Any]:
    """Local pooling: ``(out_coords, y, winners, relation)``."""
    rel = pool_edges(coords, kernel_size, stride, padding, dilation, expand=expand, target=target)
    y, winners = pool_forward(x, rel.in_idx, rel.out_idx, rel.n_out, mode)
    return rel.out_coords, y, winners, rel


def _batches(coords: np.ndarray, batch_counts: Sequence[int] | None) -> int:
    if batch_counts is not None:
        return len(batch_counts)
    if coords.shape[0] == 0:
        return 0
    if coords[:, 0].min() < 0:
        raise ValueError("global pooling needs batch ids >= 0")
    return int(coords[:, 0].max()) + 1


def global_pool(
    coords: Any,
    x: Any,
    mode: str,
    batch_counts: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Global pooling by batch: ``(y (B, C), winners or None)``.

    Raises ValueError for max when some batch has no rows.
    """
    c = np.asarray(coords, dtype=np.int64).reshape(-1, 4)
    B = _batches(c, batch_counts)
    if mode == "max":
        present = set(int(b) for b in c[:, 0])
        for b in range(B):
            if b not in present:
                raise ValueError(f"batch {b} has no rows: its max is undefined")
    in_idx = np.arange(c.shape[0], dtype=np.int64)
    return pool_forward(x, in_idx, c[:, 0], B, mode)


def global_pool_backward(coords: Any, dy: Any, mode: str, winners: Any = None) -> np.ndarray:
    """Gradient of :func:`global_pool` with respect to the features."""
    c = np.asarray(coords, dtype=np.int64).reshape(-1, 4)
    return pool_backward(dy, np.arange(c.shape[0]), c[:, 0], c.shape[0], mode, winners)


def pool_transpose(
    coords: Any,
    x: Any,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    *,
    target: Any = None,
) -> tuple[np.ndarray, np.ndarray, Any]:
    """Transposed pooling: the mean of the coarse rows of the transposed relation per fine row.

    Returns ``(out_coords, y, relation)``.
    """
    st = as_triple(kernel_size if stride is None else stride, "stride")
    rel = transposed_relation(coords, kernel_size, st, padding, dilation, target=target)
    y, _ = pool_forward(x, rel.in_idx, rel.out_idx, rel.n_out, "avg")
    return rel.out_coords, y, rel


def trilinear_edges(
    coarse: Any,
    coarse_stride: int | Sequence[int],
    fine: Any = None,
    fine_stride: int | Sequence[int] | None = None,
    stride: int | Sequence[int] = 2,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Weighted edges of trilinear upsampling: ``(fine_coords, in_idx, out_idx, weights)``.

    Physical centres: coarse row ``c`` at ``(c + 1/2) * S_c``, fine row ``f`` at
    ``(f + 1/2) * S_f`` per axis. ``u = centre_f / S_c - 1/2``; the corners are ``floor(u)``
    (weight ``1 - t``) and ``floor(u) + 1`` (weight ``t = u - floor(u)``), the corner weight the
    product over axes. Absent corners and zero weights are dropped, the rest renormalised.
    Without ``fine`` the fine support is the children ``c*stride + (0..stride-1)`` (generative
    relation with kernel = stride) at stride ``S_c / stride``.
    """
    cs = as_triple(coarse_stride, "coarse_stride")
    c = _check_coords(coarse, "coarse")
    if fine is None:
        s = as_triple(stride, "stride")
        fine_c = generative_relation(c, s, s).out_coords
        fs = tuple(cs[a] // s[a] for a in range(3))
        if any(cs[a] % s[a] for a in range(3)):
            raise ValueError(f"stride {s} does not divide the coarse stride {cs}")
    else:
        fine_c = _check_coords(fine, "fine")
        fs = as_triple(fine_stride, "fine_stride")
    rows = {tuple(int(v) for v in r): k for k, r in enumerate(c)}
    ins: list[int] = []
    outs: list[int] = []
    ws: list[float] = []
    for o, frow in enumerate(fine_c):
        corners = []
        axis = []
        for a in range(3):
            u = Fraction(2 * int(frow[1 + a]) + 1, 2) * fs[a] / cs[a] - Fraction(1, 2)
            lo = math.floor(u)
            t = u - lo
            axis.append(((lo, 1 - t), (lo + 1, t)))
        for dx in (0, 1):
            for dy in (0, 1):
                for dz in (0, 1):
                    w = axis[0][dx][1] * axis[1][dy][1] * axis[2][dz][1]
                    key = (int(frow[0]), axis[0][dx][0], axis[1][dy][0], axis[2][dz][0])
                    if w != 0 and key in rows:
                        corners.append((rows[key], w))
        total = sum(w for _, w in corners)
        for i, w in corners:
            ins.append(i)
            outs.append(o)
            ws.append(float(w / total))
    return (
        np.asarray(fine_c, dtype=np.int64).reshape(-1, 4),
        np.asarray(ins, dtype=np.int64),
        np.asarray(outs, dtype=np.int64),
        np.asarray(ws, dtype=np.float64),
    )

