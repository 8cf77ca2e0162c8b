"""Reference relations ("who sends to whom") for every kind in SEMANTICS.md.

Coordinates are integer arrays of shape ``(N, 4)`` with rows
``(batch, x, y, z)``; rows must be unique; any int32 value (including
negatives) is valid and everything is computed in int64 / Python ints.

Every function returns a :class:`Relation`: the output coordinates and the
edge list ``(in_idx, out_idx, k_idx)`` sorted by ``(out_idx, k_idx)``
(output-major, kernel row ascending). An edge always joins rows with equal
batch index. Membership is tested with a plain Python dict from coordinate
tuple to row index: slow, but obviously correct.

Edge rules (per spatial axis, batch equal):

==============  =========================================
kind            edge ``(i, o, k)`` exists iff
==============  =========================================
submanifold     ``c_i == c_o + off_k``   (centered offsets)
forward/target  ``c_i == o*s + off_k - p``   (centered odd / indexed even)
transposed      ``o == c_i*s + off_k - p``   (indexed offsets)
generative      ``o == c_i*s + off_k``       (indexed offsets)
==============  =========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .geometry import as_triple, floor_div, kernel_offsets

__all__ = [
    "Relation",
    "forward_relation",
    "generative_relation",
    "relation_dense_map",
    "subm_relation",
    "target_relation",
    "transposed_relation",
]

Coord = tuple[int, int, int, int]
IntTriple = int | Sequence[int]


@dataclass(frozen=True)
class Relation:
    """Result of a relation builder.

    Attributes:
        out_coords: ``(N_out, 4)`` int64 output rows ``(batch, x, y, z)``.
        in_idx: ``(E,)`` int64 input row of each edge.
        out_idx: ``(E,)`` int64 output row of each edge.
        k_idx: ``(E,)`` int64 kernel row of each edge.
        kernel_volume: ``K``, the number of kernel rows.

    Edges are sorted by ``(out_idx, k_idx)``.
    """

    out_coords: np.ndarray
    in_idx: np.ndarray
    out_idx: np.ndarray
    k_idx: np.ndarray
    kernel_volume: int

    @property
    def n_out(self) -> int:
        """Number of output rows."""
        return int(self.out_coords.shape[0])

    @property
    def n_edges(self) -> int:
        """Number of edges."""
        return int(self.in_idx.shape[0])

    def edges(self) -> list[tuple[int, int, int]]:
        """Edges as a list of ``(in, out, k)`` Python int tuples, in order."""
        return [
            (int(i), int(o), int(k))
            for i, o, k in zip(self.in_idx, self.out_idx, self.k_idx)
        ]

    def dense_map(self) -> np.ndarray:
        """``(N_out, K)`` int64 map from (output, kernel row) to input row or -1."""
        return relation_dense_map(
            self.in_idx, self.out_idx, self.k_idx, self.n_out, self.kernel_volume
        )


# ---------------------------------------------------------------------------
# helpers


def _check_coords(coords: np.ndarray | Sequence[Sequence[int]], name: str) -> np.ndarray:
    """Validate ``(N, 4)`` integer coordinates with unique rows; return int64 copy."""
    arr = np.asarray(coords)
    if arr.size == 0:
        arr = arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"{name} must have shape (N, 4), got {arr.shape}")
    if arr.shape[0] > 0 and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    arr64 = arr.astype(np.int64)
    seen: set[Coord] = set()
    for row in arr64:
        key = _key(row)
        if key in seen:
            raise ValueError(f"{name} has a duplicate row {key}")
        seen.add(key)
    return arr64


def _key(row: np.ndarray | Sequence[int]) -> Coord:
    """A coordinate row as a hashable tuple of Python ints."""
    return (int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def _row_map(coords: np.ndarray) -> dict[Coord, int]:
    """Dict from coordinate tuple to its row index."""
    return {_key(row): r for r, row in enumerate(coords)}


def _check_spec(
    kernel_size: IntTriple,
    stride: IntTriple,
    padding: IntTriple,
    dilation: IntTriple,
) -> tuple[tuple[int, int, int], ...]:
    """Validate and normalise a kernel spec to triples."""
    ks = as_triple(kernel_size, "kernel_size")
    st = as_triple(stride, "stride")
    pd = as_triple(padding, "padding")
    dl = as_triple(dilation, "dilation")
    if min(ks) < 1:
        raise ValueError(f"kernel_size must be >= 1, got {ks}")
    if min(st) < 1:
        raise ValueError(f"stride must be >= 1, got {st}")
    if min(pd) < 0:
        raise ValueError(f"padding must be >= 0, got {pd}")
    if min(dl) < 1:
        raise ValueError(f"dilation must be >= 1, got {dl}")
    return ks, st, pd, dl


def _make_relation(
    out_coords: np.ndarray | list[Coord],
    edges: list[tuple[int, int, int]],
    kernel_volume: int,
) -> Relation:
    """Pack output rows and an unordered ``(in, out, k)`` edge list."""
    out = np.array(out_coords, dtype=np.int64).reshape(-1, 4)
    ordered = sorted(edges, key=lambda e: (e[1], e[2]))
    keys = [(o, k) for _, o, k in ordered]
    if len(set(keys)) != len(keys):
        raise AssertionError("oracle bug: two inputs on one (output, kernel row)")
    in_idx = np.array([e[0] for e in ordered], dtype=np.int64)
    out_idx = np.array([e[1] for e in ordered], dtype=np.int64)
    k_idx = np.array([e[2] for e in ordered], dtype=np.int64)
    return Relation(out, in_idx, out_idx, k_idx, kernel_volume)


def _gather_edges(
    in_coords: np.ndarray,
    out_coords: np.ndarray,
    offsets: np.ndarray,
    stride: tuple[int, int, int],
    padding: tuple[int, int, int],
) -> list[tuple[int, int, int]]:
    """Edges of the forward rule ``c_i == o*s + off_k - p`` (batch equal).

    For every output row and kernel row, compute the one input coordinate
    that would feed it and look it up.
    """
    in_map = _row_map(in_coords)
    edges: list[tuple[int, int, int]] = []
    for o, orow in enumerate(out_coords):
        b = int(orow[0])
        for k, off in enumerate(offsets):
            want = (b,) + tuple(
                int(orow[1 + a]) * stride[a] + int(off[a]) - padding[a] for a in range(3)
            )
            i = in_map.get(want)  # type: ignore[arg-type]
            if i is not None:
                edges.append((i, o, k))
    return edges


def _scatter_edges(
    in_coords: np.ndarray,
    out_coords: np.ndarray,
    offsets: np.ndarray,
    stride: tuple[int, int, int],
    padding: tuple[int, int, int],
) -> list[tuple[int, int, int]]:
    """Edges of the transposed rule ``o == c_i*s + off_k - p`` (batch equal).

    For every input row and kernel row, compute the output coordinate it
    lands on and look it up.
    """
    out_map = _row_map(out_coords)
    edges: list[tuple[int, int, int]] = []
    for i, irow in enumerate(in_coords):
        for k, off in enumerate(offsets):
            child = _child(irow, off, stride, padding)
            o = out_map.get(child)
            if o is not None:
                edges.append((i, o, k))
    return edges


def _child(
    irow: np.ndarray,
    off: np.ndarray,
    stride: tuple[int, int, int],
    padding: tuple[int, int, int],
) -> Coord:
    """``c*s + off - p`` per spatial axis, batch kept."""
    return (
        int(irow[0]),
        int(irow[1]) * stride[0] + int(off[0]) - padding[0],
        int(irow[2]) * stride[1] + int(off[1]) - padding[1],
        int(irow[3]) * stride[2] + int(off[2]) - padding[2],
    )


def _unique_first_occurrence(rows: list[Coord]) -> list[Coord]:
    """Deduplicate keeping the first occurrence of each row, in order."""
    seen: set[Coord] = set()
    out: list[Coord] = []
    for r in rows:
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


# ---------------------------------------------------------------------------
# public relation builders


def subm_relation(
    coords: np.ndarray | Sequence[Sequence[int]],
    kernel_size: IntTriple,
    dilation: IntTriple = 1,
) -> Relation:
    """Submanifold relation: output rows are the input rows.

    Edge ``(i, o, k)`` iff ``c_i == c_o + off_k`` with centered offsets.
    Every axis of ``kernel_size`` must be odd (ValueError otherwise).
    """
    ks, st, pd, dl = _check_spec(kernel_size, 1, 0, dilation)
    if any(s % 2 == 0 for s in ks):
        raise ValueError(f"submanifold convolution needs an odd kernel, got {ks}")
    c = _check_coords(coords, "coords")
    offsets = kernel_offsets(ks, dl, centered=True)
    edges = _gather_edges(c, c, offsets, st, pd)
    return _make_relation(c, edges, len(offsets))


def forward_relation(
    coords: np.ndarray | Sequence[Sequence[int]],
    kernel_size: IntTriple,
    stride: IntTriple = 1,
    padding: IntTriple = 0,
    dilation: IntTriple = 1,
    expand: bool = False,
) -> Relation:
    """Forward (strided) convolution relation.

    Offsets: centered for odd sizes, indexed for even sizes, times dilation.

    Output support:

    - ``expand=False`` and stride 1: the input rows, input order;
    - ``expand=False`` otherwise: unique ``floor_div(c_xyz, s)`` (batch kept)
      in first-occurrence order over input rows;
    - ``expand=True``: iterate input rows, then kernel rows; the candidate
      ``o = (c_i + p - off_k) / s`` is kept when exactly divisible on every
      axis; unique candidates in first-occurrence order.

    Edge ``(i, o, k)`` iff ``c_i == o*s + off_k - p``.
    """
    ks, st, pd, dl = _check_spec(kernel_size, stride, padding, dilation)
    c = _check_coords(coords, "coords")
    offsets = kernel_offsets(ks, dl, centered=True)

    candidates: list[Coord] = []
    if expand:
        for irow in c:
            for off in offsets:
                num = [int(irow[1 + a]) + pd[a] - int(off[a]) for a in range(3)]
                if all(num[a] % st[a] == 0 for a in range(3)):
                    candidates.append(
                        (int(irow[0]),) + tuple(num[a] // st[a] for a in range(3))  # type: ignore[arg-type]
                    )
    elif st == (1, 1, 1):
        candidates = [_key(row) for row in c]
    else:
        down = floor_div(c[:, 1:], np.array(st, dtype=np.int64))
        candidates = [
            (int(c[r, 0]), int(down[r, 0]), int(down[r, 1]), int(down[r, 2]))
            for r in range(c.shape[0])
        ]
    out = np.array(_unique_first_occurrence(candidates), dtype=np.int64).reshape(-1, 4)
    edges = _gather_edges(c, out, offsets, st, pd)
    return _make_relation(out, edges, len(offsets))


def target_relation(
    coords: np.ndarray | Sequence[Sequence[int]],
    target: np.ndarray | Sequence[Sequence[int]],
    kernel_size: IntTriple,
    stride: IntTriple = 1,
    padding: IntTriple = 0,
    dilation: IntTriple = 1,
) -> Relation:
    """Forward relation onto a given target support (target rows, their order).

    Edge ``(i, o, k)`` iff ``c_i == t_o*s + off_k - p`` (centered odd /
    indexed even offsets). Target rows with no input keep zero edges.
    """
    ks, st, pd, dl = _check_spec(kernel_size, stride, padding, dilation)
    c = _check_coords(coords, "coords")
    t = _check_coords(target, "target")
    offsets = kernel_offsets(ks, dl, centered=True)
    edges = _gather_edges(c, t, offsets, st, pd)
    return _make_relation(t, edges, len(offsets))


def transposed_relation(
    coords: np.ndarray | Sequence[Sequence[int]],
    kernel_size: IntTriple,
    stride: IntTriple,
    padding: IntTriple = 0,
    dilation: IntTriple = 1,
    target: np.ndarray | Sequence[Sequence[int]] | None = None,
) -> Relation:
    """Transposed convolution relation (indexed offsets ``(0..K-1)*dilation``).

    Output support: without ``target``, unique ``c*s + off_k - p`` over
    (input row, kernel row) iterated input-major then kernel row, in
    first-occurrence order; with ``target``, exactly the target rows.

    Edge ``(i, o, k)`` iff ``o == c_i*s + off_k - p``.
    """
    ks, st, pd, dl = _check_spec(kernel_size, stride, padding, dilation)
    c = _check_coords(coords, "coords")
    offsets = kernel_offsets(ks, dl, centered=False)
    if target is None:
        children = [_child(irow, off, st, pd) for irow in c for off in offsets]
        out = np.array(_unique_first_occurrence(children), dtype=np.int64).reshape(-1, 4)
    else:
        out = _check_coords(target, "target")
    edges = _scatter_edges(c, out, offsets, st, pd)
    return _make_relation(out, edges, len(offsets))


def generative_relation(
    coords: np.ndarray | Sequence[Sequence[int]],
    kernel_size: IntTriple,
    stride: IntTriple,
    dilation: IntTriple = 1,
) -> Relation:
    """Generative transposed relation: children ``c*s + off_k``, deduplicated.

    Same as :func:`transposed_relation` without target and with padding 0
    (deviation from mlx-lattice, which repeats rows when K > s).
    """
    return transposed_relation(coords, kernel_size, stride, 0, dilation, target=None)


def relation_dense_map(
    in_idx: np.ndarray,
    out_idx: np.ndarray,
    k_idx: np.ndarray,
    n_out: int,
    K: int,
) -> np.ndarray:
    """``(n_out, K)`` int64 array holding the input row of each (output, kernel row), or -1.

    Asserts that at most one input maps to each (output, kernel row).
    """
    dense = np.full((int(n_out), int(K)), -1, dtype=np.int64)
    for i, o, k in zip(np.asarray(in_idx), np.asarray(out_idx), np.asarray(k_idx)):
        assert dense[int(o), int(k)] == -1, f"two inputs on (out {int(o)}, k {int(k)})"
        dense[int(o), int(k)] = int(i)
    return dense
