"""Point <-> voxel conversion (SEMANTICS.md "Point <-> voxel").

* :func:`voxelize` reduces point features into the voxels that :func:`sparse_quantize` finds
  (sum, mean or max); differentiable in the features.
* :func:`build_point_voxel_map` maps points onto the rows of a voxel tensor (the voxel that
  contains each point, or the 8 voxel centres around it with trilinear weights) and returns a
  reusable :class:`PointVoxelMap`.
* :func:`devoxelize` gathers voxel features back to the points through a map; differentiable in
  the voxel features.

Voxel size and stride: ``voxel_size`` is always the size at stride 1 (what ``voxelize`` was
given). A voxel tensor at stride ``s`` (e.g. after a stride-2 conv) has physical voxel size
``voxel_size * s``; :func:`build_point_voxel_map` applies this itself, so pass the same
``voxel_size`` for every level of a network.

Every op runs a route of the ``point_voxel`` family (``"parallel"`` by default, ``"reference"``
for comparison); all routes are deterministic and bitwise identical.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from .._core import as_tensor, core, from_core, to_core
from .._device import check_device
from ..tensor import SparseTensor
from .quantize import FloatOr3, _batch, _points, _triple_float

__all__ = ["voxelize", "build_point_voxel_map", "devoxelize", "PointVoxelMap"]

REDUCTIONS = ("mean", "sum", "max")
MODES = ("nearest", "trilinear")


def _check_choice(op: str, what: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"[{op}] {what}: expected a str, one of {', '.join(map(repr, choices))}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"[{op}] {what}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_route(op: str, route: Any) -> Optional[str]:
    if route is not None and not isinstance(route, str):
        raise TypeError(f"[{op}] route: expected a route name (str) or None, got {type(route).__name__}")
    return route


# ---- voxelize ----------------------------------------------------------------------------------


class _VoxelizeFunction(torch.autograd.Function):
    """Voxel features (M, C) from point features (P, C) over a point grouping."""

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, grouping: Any, reduction: str, route: Optional[str]) -> torch.Tensor:  # type: ignore[override]
        out, argmax = core.voxelize_forward(grouping, to_core(feats), reduction, route)
        ctx.grouping, ctx.reduction, ctx.route = grouping, reduction, route
        ctx.argmax = None if argmax is None else from_core(argmax)
        return from_core(out)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        argmax = None if ctx.argmax is None else to_core(ctx.argmax)
        dx = core.voxelize_backward(ctx.grouping, to_core(grad_out.contiguous()), argmax, ctx.reduction, ctx.route)
        return from_core(dx), None, None, None


def voxelize(
    points: Any,
    feats: Any,
    voxel_size: FloatOr3,
    reduction: str = "mean",
    batch_indices: Optional[Any] = None,
    origin: FloatOr3 = 0.0,
    *,
    route: Optional[str] = None,
) -> SparseTensor:
    """Reduces point features into voxels: a SparseTensor at stride 1.

    Rows are :func:`sparse_quantize`'s unique voxels ``floor((p - origin) / voxel_size)`` with the
    batch id (first-occurrence order); the features of a voxel are the ``sum``, ``mean`` or
    ``max`` (per channel) of its points' features.

    Differentiable in ``feats``: ``sum`` passes ``dy[v]`` to every point of ``v``, ``mean``
    ``dy[v] / count[v]``, ``max`` passes ``dy[v, c]`` to the first point holding the maximum of
    channel ``c`` (ties: the lowest point index, the same point the forward took; a NaN counts as
    the maximum) and 0 to the others.

    Args:
        points: (P, 3) float32/float64 tensor or numpy array; NaN/inf raise ValueError (drop them
            first with ``sparse_quantize(..., drop_invalid=True)``'s mask).
        feats: (P, C) float16/bfloat16/float32/float64 features.
        voxel_size: positive number or 3 numbers.
        reduction: "mean" (default), "sum" or "max".
        batch_indices: optional (P,) integer batch ids (>= 0), part of the voxel key.
        origin: number or 3 numbers subtracted before division.
        route: force a ``point_voxel`` route ("parallel", "reference").
    """
    op = "voxelize"
    p = _points(points, op)
    f = as_tensor(feats, "feats", op)
    check_device(op, "feats", f, p.device)
    _check_choice(op, "reduction", reduction, REDUCTIONS)
    _check_route(op, route)
    b = _batch(batch_indices, op, p)
    grouping = core.group_points(
        to_core(p), _triple_float(voxel_size, "voxel_size", op), _triple_float(origin, "origin", op),
        None if b is None else to_core(b), op,
    )
    out = _VoxelizeFunction.apply(f, grouping, reduction, route)
    return SparseTensor._from_core(grouping.voxels, out)


# ---- point -> voxel maps -----------------------------------------------------------------------


class PointVoxelMap:
    """A reusable map from P points onto the rows of one voxel coordinate set.

    Built by :func:`build_point_voxel_map`; :func:`devoxelize` accepts it for any feature tensor
    on the same coordinates (same ``key``: e.g. the outputs of submanifold convs, norms and
    activations on that tensor).

    Attributes:
        indices: (P, 8) int64 voxel rows, -1 where no voxel. ``nearest`` uses column 0 only
            (columns 1..7 are -1); ``trilinear`` column ``k = dx*4 + dy*2 + dz`` is the corner
            ``lower + (dx, dy, dz)``.
        weights: (P, 8) weights in the points' dtype (float32 or float64), 0 where no voxel.
        mode, normalize, voxel_key, n_points, n_voxels, stride, voxel_size, origin.
    """

    __slots__ = ("_core", "_indices", "_weights")

    def __init__(self, core_map: Any) -> None:
        self._core = core_map
        self._indices = from_core(core_map.indices())
        self._weights = from_core(core_map.weights())

    @property
    def indices(self) -> torch.Tensor:
        return self._indices

    @property
    def weights(self) -> torch.Tensor:
        return self._weights

    @property
    def mode(self) -> str:
        return str(self._core.mode)

    @property
    def normalize(self) -> bool:
        return bool(self._core.normalize)

    @property
    def voxel_key(self) -> int:
        """Key of the voxel coordinate set the map was built against."""
        return int(self._core.voxel_key)

    @property
    def n_points(self) -> int:
        return int(self._core.n_points)

    @property
    def n_voxels(self) -> int:
        return int(self._core.n_voxels)

    @property
    def stride(self) -> tuple[int, int, int]:
        return tuple(self._core.stride)

    @property
    def voxel_size(self) -> tuple[float, float, float]:
        return tuple(self._core.voxel_size)

    @property
    def origin(self) -> tuple[float, float, float]:
        return tuple(self._core.origin)

    def voxel_csr(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The voxel-major CSR devoxelize's backward walks: ``(ptr (M+1,), entries (E,))``; the
        entries ``p*8 + k`` of voxel ``v`` are ``entries[ptr[v]:ptr[v+1]]``, ascending."""
        return from_core(self._core.voxel_ptr()), from_core(self._core.entries())

    def __repr__(self) -> str:
        return (
            f"PointVoxelMap(mode={self.mode!r}, normalize={self.normalize}, P={self.n_points}, "
            f"M={self.n_voxels}, stride={self.stride}, voxel_key={self.voxel_key})"
        )


def build_point_voxel_map(
    points: Any,
    voxels: SparseTensor,
    mode: str = "nearest",
    normalize: bool = True,
    *,
    voxel_size: Optional[FloatOr3] = None,
    origin: FloatOr3 = 0.0,
    batch_indices: Optional[Any] = None,
    route: Optional[str] = None,
    allow_mismatch: bool = False,
) -> PointVoxelMap:
    """Maps points onto the rows of ``voxels``.

    ``nearest``: the voxel containing the point, ``floor((p - origin) / voxel_size)`` (the
    :func:`sparse_quantize` rule), weight 1; -1 and weight 0 when that voxel is not a row of
    ``voxels``. ``trilinear``: the 8 voxels whose centres ``(v + 0.5) * voxel_size + origin``
    surround the point (lower corner ``floor((p - origin) / voxel_size - 0.5)``), weights the
    trilinear products; missing voxels get -1 / 0 and, with ``normalize=True``, the others are
    divided by their sum (``normalize=False`` keeps the raw products). A point with no present
    corner gets all zeros.

    Stride: for ``voxels`` at stride ``s`` the physical voxel size is ``voxel_size * s`` (pass
    the stride-1 ``voxel_size``); ``nearest`` looks up ``floor_div(floor((p - origin) /
    voxel_size), s)``, exactly the coordinates a strided conv produces.

    Args:
        points: (P, 3) float32/float64 (the weights come out in this dtype).
        voxels: the voxel SparseTensor (its coordinates and stride; features are not read).
        mode: "nearest" or "trilinear".
        normalize: trilinear only (see above).
        voxel_size: the stride-1 voxel size, number or 3 numbers (required).
        origin: number or 3 numbers.
        batch_indices: optional (P,) integer batch ids matched against the voxels' batch column.
        route: force a ``point_voxel`` route ("parallel", "reference").
        allow_mismatch: skip the mismatch check (below).

    Mismatch check: when more than half of the points match no voxel (nearest: no containing
    voxel; trilinear: no present corner) *and* more than half of the voxels receive no point,
    the points and the voxels do not describe the same grid (a ``voxel_size``, ``origin``, stride
    or batch ids other than the voxels were built with), and the map would silently leave most
    points at -1 / weight 0: that raises ValueError. Either half alone is legitimate and passes
    (voxels pruned or cropped after voxelization: points without a voxel, every voxel still
    hit; a subset of the points: voxels without a point). ``allow_mismatch=True`` turns the check
    off. Cost: one pass over the map, O(P + M).

    Raises:
        ValueError: the mismatch above (the message gives both counts and the voxel size the
            extents of the points and of the voxel coordinates suggest), or invalid arguments.
    """
    op = "build_point_voxel_map"
    p = _points(points, op)
    if not isinstance(voxels, SparseTensor):
        raise TypeError(f"[{op}] voxels: expected a lattice.SparseTensor, got {type(voxels).__name__}")
    _check_choice(op, "mode", mode, MODES)
    if not isinstance(normalize, bool):
        raise TypeError(f"[{op}] normalize: expected a bool, got {type(normalize).__name__}")
    _check_route(op, route)
    if not isinstance(allow_mismatch, bool):
        raise TypeError(f"[{op}] allow_mismatch: expected a bool, got {type(allow_mismatch).__name__}")
    check_device(op, "voxels", voxels, p.device)
    b = _batch(batch_indices, op, p)
    size = _triple_float(voxel_size, "voxel_size", op)
    m = PointVoxelMap(core.build_point_voxel_map(
        to_core(p), voxels._cs, size, _triple_float(origin, "origin", op),
        mode, normalize, None if b is None else to_core(b), route,
    ))
    n, n_voxels = int(p.shape[0]), len(voxels)
    if not allow_mismatch and n and n_voxels:
        hit = m.indices[m.indices >= 0]
        unmatched = n - int((m.indices >= 0).any(dim=1).sum())
        empty = n_voxels - int(torch.unique(hit).numel())
        if 2 * unmatched > n and 2 * empty > n_voxels:
            raise ValueError(_mismatch_message(op, p, voxels, size, unmatched, n, empty))
    return m


def _mismatch_message(op: str, p: torch.Tensor, voxels: SparseTensor, size: Sequence[float], unmatched: int,
                      n: int, empty: int) -> str:
    """build_point_voxel_map's mismatch error, with the voxel size that the extent of the points
    over the extent of the voxel coordinates suggests (a hint: exact for voxels built from these
    points up to one cell per axis)."""
    msg = (f"[{op}] voxel_size: expected the stride-1 voxel size the voxels were built with, got "
           f"{tuple(size)}, under which {unmatched} of {n} points match no voxel and {empty} of {len(voxels)} voxels "
           f"(stride {voxels.stride}) get no point")
    if len(voxels) and n > 1:
        pts = p.detach().double()
        extent = (pts.max(0).values - pts.min(0).values).cpu()
        c = voxels.coords[:, 1:].long()
        cells = (c.max(0).values - c.min(0).values + 1).cpu()
        stride = torch.tensor(voxels.stride, dtype=torch.float64)
        suggested = tuple(float(f"{float(e) / float(k * s):.3g}") for e, k, s in zip(extent, cells, stride))
        if all(v > 0 for v in suggested):
            msg += (f"; the points span {tuple(round(float(e), 6) for e in extent)} and the voxels "
                    f"{tuple(int(k) for k in cells)} cells, i.e. a voxel size near {suggested}")
    return msg + " (check voxel_size, origin and batch_indices; allow_mismatch=True skips this check)"


# ---- devoxelize --------------------------------------------------------------------------------


class _DevoxelizeFunction(torch.autograd.Function):
    """Point features (P, C) = weighted gather of voxel features (M, C) through a map."""

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, core_map: Any, coordinate_set: Any, route: Optional[str]) -> torch.Tensor:  # type: ignore[override]
        ctx.core_map, ctx.route = core_map, route
        return from_core(core.devoxelize_forward(core_map, coordinate_set, to_core(feats), route))

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        dv = core.devoxelize_backward(ctx.core_map, to_core(grad_out.contiguous()), ctx.route)
        return from_core(dv), None, None, None


def devoxelize(voxels: SparseTensor, map: PointVoxelMap, *, route: Optional[str] = None) -> torch.Tensor:  # noqa: A002
    """Point features (P, C): ``out[p] = sum_k map.weights[p, k] * voxels.feats[map.indices[p, k]]``
    over the present corners; a point without voxels gets zeros.

    Differentiable in ``voxels.feats``; the backward is a deterministic weighted segment sum over
    the map's voxel-major CSR (no atomics). ``voxels`` must have the coordinate identity the map
    was built for (``voxels.key == map.voxel_key``).

    Args:
        voxels: SparseTensor (M, C), float16/bfloat16/float32/float64.
        map: from :func:`build_point_voxel_map` on these voxels' coordinates.
        route: force a ``point_voxel`` route ("parallel", "reference").
    """
    op = "devoxelize"
    if not isinstance(voxels, SparseTensor):
        raise TypeError(f"[{op}] voxels: expected a lattice.SparseTensor, got {type(voxels).__name__}")
    if not isinstance(map, PointVoxelMap):
        raise TypeError(f"[{op}] map: expected a lattice.ops.PointVoxelMap, got {type(map).__name__}")
    _check_route(op, route)
    check_device(op, "voxels", voxels, map.indices.device)
    return _DevoxelizeFunction.apply(voxels.feats, map._core, voxels._cs, route)


# ---- explain -----------------------------------------------------------------------------------

EXPLAINED = ("voxelize", "build_point_voxel_map", "devoxelize")


def explain(op: str, *args: Any, pass_: str = "forward", **kwargs: Any) -> Any:
    """The route decision of a point <-> voxel op called with these arguments (``lattice.explain``).

    ``voxelize`` quantizes the points (it needs the voxel count) but reduces nothing;
    ``pass_`` is "forward" or "backward" (voxelize, devoxelize).
    """
    route = _check_route(op, kwargs.pop("route", None))
    if op == "voxelize":
        names = ("points", "feats", "voxel_size", "reduction", "batch_indices", "origin")
        kw = dict(zip(names, args))
        kw.update(kwargs)
        p = _points(kw["points"], op)
        f = as_tensor(kw["feats"], "feats", op)
        check_device(op, "feats", f, p.device)
        reduction = _check_choice(op, "reduction", kw.get("reduction", "mean"), REDUCTIONS)
        b = _batch(kw.get("batch_indices"), op, p)
        grouping = core.group_points(
            to_core(p), _triple_float(kw["voxel_size"], "voxel_size", op),
            _triple_float(kw.get("origin", 0.0), "origin", op), None if b is None else to_core(b), op,
        )
        return core.explain_voxelize(grouping, to_core(f), reduction, pass_, route)
    if op == "build_point_voxel_map":
        p = _points(args[0] if args else kwargs["points"], op)
        voxels = args[1] if len(args) > 1 else kwargs["voxels"]
        if not isinstance(voxels, SparseTensor):
            raise TypeError(f"[{op}] voxels: expected a lattice.SparseTensor, got {type(voxels).__name__}")
        check_device(op, "voxels", voxels, p.device)
        mode = _check_choice(op, "mode", args[2] if len(args) > 2 else kwargs.get("mode", "nearest"), MODES)
        return core.explain_build_point_voxel_map(to_core(p), voxels._cs, mode, route)
    if op == "devoxelize":
        voxels = args[0] if args else kwargs["voxels"]
        m = args[1] if len(args) > 1 else kwargs["map"]
        if not isinstance(voxels, SparseTensor) or not isinstance(m, PointVoxelMap):
            raise TypeError(f"[{op}] args: expected (SparseTensor, PointVoxelMap), got "
                            f"({type(voxels).__name__}, {type(m).__name__})")
        check_device(op, "voxels", voxels, m.indices.device)
        return core.explain_devoxelize(m._core, to_core(voxels.feats), pass_, route)
    raise ValueError(f"[explain] op: expected one of {', '.join(EXPLAINED)}, got {op!r}")
