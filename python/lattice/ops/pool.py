"""Sparse pooling (SEMANTICS.md "Pooling").

Local pooling (``pool3d``, ``sum_pool3d``, ``avg_pool3d``, ``max_pool3d``) reduces, per output
row, the input rows of the forward relation (``c_i == o*stride + offset_k - padding``; the same
relations, output supports and cache as ``conv3d``):

* ``sum``; ``avg`` divides by the number of edges of that output row (not the kernel volume);
* ``max`` per channel; equal values go to the first edge in (input row, kernel row) order, i.e.
  the smallest input row, and the whole gradient goes to that same row. NaN wins (propagates).

Output rows without any edge (possible with a target, or when a window misses the row that
generated it) are 0 and pass no gradient. Global pooling reduces the rows of each batch into a
dense ``(B, C)`` tensor. ``pool_transpose3d`` spreads coarse rows back onto a fine support (the
mean of the contributing coarse rows) and ``trilinear_upsample3d`` interpolates them.

Features keep their dtype (float16, bfloat16, float32; float64 for tests); float16/bfloat16
accumulate in float32. Every function is differentiable in the features.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch.autograd.function import once_differentiable

from .._core import as_triple, core, from_core, optional_core, to_core
from .._device import check_device
from ..tensor import SparseTensor

IntOr3 = Union[int, Sequence[int]]

MODES = ("sum", "avg", "max")


class PoolFunction(torch.autograd.Function):
    """out = pool(feats) over a planned edge list; the feature gradient from the core."""

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, plan: Any) -> torch.Tensor:  # type: ignore[override]
        out, argmax = core.pool_forward(plan, to_core(feats))
        ctx.plan = plan
        ctx.argmax = None if argmax is None else from_core(argmax)
        return from_core(out)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        dx = core.pool_backward(ctx.plan, to_core(grad_out.contiguous()), optional_core(ctx.argmax))
        return from_core(dx), None


def _check_input(op: str, x: Any, what: str = "input") -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"[{op}] {what}: expected a lattice.SparseTensor, got {type(x).__name__}")
    return x


def _check_route(op: str, route: Any) -> None:
    if route is not None and not isinstance(route, str):
        raise TypeError(f"[{op}] route: expected a route name (str) or None, got {type(route).__name__}")


def _check_mode(op: str, mode: Any) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"[{op}] mode: expected 'sum', 'avg' or 'max', got {mode!r}")
    return mode


def _target(op: str, coordinates: Optional[SparseTensor], input: Optional[SparseTensor] = None) -> Any:
    if coordinates is None:
        return None
    cs = _check_input(op, coordinates, "coordinates")._cs
    if input is not None:
        check_device(op, "coordinates", coordinates, input.device)
    return cs


def _wrap(p: Any, x: SparseTensor) -> SparseTensor:
    feats = PoolFunction.apply(x.feats, p)
    if p.output.key == x.key:
        return x.replace_feats(feats)
    return SparseTensor._from_core(p.output, feats)


# ---- plans (shared by the ops and lattice.explain) ----------------------------------------------


def plan_pool(
    op: str,
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: Optional[IntOr3] = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    mode: str = "max",
    *,
    coordinates: Optional[SparseTensor] = None,
    expand: bool = False,
    route: Optional[str] = None,
    deterministic: bool = True,
) -> Any:
    """Validates a local pooling call and builds (or fetches) its forward / target relation."""
    _check_input(op, input)
    _check_mode(op, mode)
    _check_route(op, route)
    ks = as_triple(kernel_size, "kernel_size", op)
    st = ks if stride is None else as_triple(stride, "stride", op)
    return core.plan_pool(op, mode, input._cs, ks, st, as_triple(padding, "padding", op),
                          as_triple(dilation, "dilation", op), bool(expand), bool(deterministic), route,
                          _target(op, coordinates, input))


def plan_global_pool(op: str, input: SparseTensor, mode: str, *, route: Optional[str] = None,
                     deterministic: bool = True) -> Any:
    """Validates a global pooling call and groups the rows by batch."""
    _check_input(op, input)
    _check_mode(op, mode)
    _check_route(op, route)
    return core.plan_global_pool(op, mode, input._cs, bool(deterministic), route)


def plan_pool_transpose(
    op: str,
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: Optional[IntOr3] = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    *,
    coordinates: Optional[SparseTensor] = None,
    route: Optional[str] = None,
    deterministic: bool = True,
) -> Any:
    """Validates a pool_transpose3d call and builds (or fetches) its transposed relation."""
    _check_input(op, input)
    _check_route(op, route)
    ks = as_triple(kernel_size, "kernel_size", op)
    st = ks if stride is None else as_triple(stride, "stride", op)
    return core.plan_pool_transpose(op, input._cs, ks, st, as_triple(padding, "padding", op),
                                    as_triple(dilation, "dilation", op), bool(deterministic), route,
                                    _target(op, coordinates, input))


def plan_trilinear_upsample(
    op: str,
    input: SparseTensor,
    stride: Optional[IntOr3] = None,
    *,
    coordinates: Optional[SparseTensor] = None,
    route: Optional[str] = None,
    deterministic: bool = True,
) -> Any:
    """Validates a trilinear_upsample3d call and computes its weighted edges."""
    _check_input(op, input)
    _check_route(op, route)
    st = None if stride is None else as_triple(stride, "stride", op)
    return core.plan_trilinear_upsample(op, input._cs, st, bool(deterministic), route, _target(op, coordinates, input))


# ---- local pooling ------------------------------------------------------------------------------


def pool3d(
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: Optional[IntOr3] = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    mode: str = "max",
    *,
    coordinates: Optional[SparseTensor] = None,
    expand: bool = False,
    route: Optional[str] = None,
    deterministic: bool = True,
) -> SparseTensor:
    """Local sparse pooling over the forward relation.

    Output support (as ``conv3d``): with stride 1 the input rows (same identity); otherwise the
    unique ``floor_div(coords, stride)`` in first-occurrence order (``expand=True``: every output
    whose window holds an input); with ``coordinates=target`` exactly the target's rows (the
    target must carry the output stride). Output stride = input stride * stride. Kernel offsets:
    odd sizes centred (``-r..r``), even sizes indexed (``0..K-1``), times dilation, so
    ``kernel_size=2, stride=2`` pools each 2x2x2 block.

    Args:
        input: SparseTensor (N, C).
        kernel_size: int or 3 ints (>= 1).
        stride: int or 3 ints (>= 1); default ``kernel_size``.
        padding, dilation: int or 3 ints (>= 0, >= 1).
        mode: ``"sum"``, ``"avg"`` (divides by the rows actually present in the window) or
            ``"max"`` (ties to the smallest input row, gradient to that row only).
        coordinates: optional target SparseTensor.
        expand: spconv-style output growth (no target only).
        route: force a route ("reference", "csr_reduce", "input_exclusive"); raises when the
            route is not admitted for this problem. Backward passes with disjoint windows
            (``stride >= (size-1)*dilation + 1`` on every axis) take the input-exclusive gather.
    """
    p = plan_pool("pool3d", input, kernel_size, stride, padding, dilation, mode, coordinates=coordinates,
                  expand=expand, route=route, deterministic=deterministic)
    return _wrap(p, input)


def _local(op: str, mode: str, input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3],
           padding: IntOr3, dilation: IntOr3, coordinates: Optional[SparseTensor], expand: bool,
           route: Optional[str], deterministic: bool) -> SparseTensor:
    p = plan_pool(op, input, kernel_size, stride, padding, dilation, mode, coordinates=coordinates,
                  expand=expand, route=route, deterministic=deterministic)
    return _wrap(p, input)


def sum_pool3d(input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3] = None, padding: IntOr3 = 0,
               dilation: IntOr3 = 1, *, coordinates: Optional[SparseTensor] = None, expand: bool = False,
               route: Optional[str] = None, deterministic: bool = True) -> SparseTensor:
    """``pool3d(..., mode="sum")``: the sum of the input rows in each window."""
    return _local("sum_pool3d", "sum", input, kernel_size, stride, padding, dilation, coordinates, expand, route,
                  deterministic)


def avg_pool3d(input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3] = None, padding: IntOr3 = 0,
               dilation: IntOr3 = 1, *, coordinates: Optional[SparseTensor] = None, expand: bool = False,
               route: Optional[str] = None, deterministic: bool = True) -> SparseTensor:
    """``pool3d(..., mode="avg")``: the mean over the input rows present in each window."""
    return _local("avg_pool3d", "avg", input, kernel_size, stride, padding, dilation, coordinates, expand, route,
                  deterministic)


def max_pool3d(input: SparseTensor, kernel_size: IntOr3, stride: Optional[IntOr3] = None, padding: IntOr3 = 0,
               dilation: IntOr3 = 1, *, coordinates: Optional[SparseTensor] = None, expand: bool = False,
               route: Optional[str] = None, deterministic: bool = True) -> SparseTensor:
    """``pool3d(..., mode="max")``: per-channel max; ties and the gradient go to the smallest input row."""
    return _local("max_pool3d", "max", input, kernel_size, stride, padding, dilation, coordinates, expand, route,
                  deterministic)


# ---- global pooling -----------------------------------------------------------------------------


def _global(op: str, mode: str, input: SparseTensor, route: Optional[str], deterministic: bool) -> torch.Tensor:
    p = plan_global_pool(op, input, mode, route=route, deterministic=deterministic)
    return PoolFunction.apply(input.feats, p)


def global_sum_pool(input: SparseTensor, *, route: Optional[str] = None, deterministic: bool = True) -> torch.Tensor:
    """Sum of the rows of each batch: a dense ``(B, C)`` tensor.

    ``B = len(batch_counts)`` when the input carries batch counts, else ``max batch id + 1``
    (0 for an empty input); batch ids must be >= 0 and rows unique (ValueError naming the first
    offending row: a repeated row would be counted twice). An empty batch gives a zero row.
    """
    return _global("global_sum_pool", "sum", input, route, deterministic)


def global_avg_pool(input: SparseTensor, *, route: Optional[str] = None, deterministic: bool = True) -> torch.Tensor:
    """Mean of the rows of each batch: a dense ``(B, C)`` tensor (B as in ``global_sum_pool``);
    an empty batch gives a zero row."""
    return _global("global_avg_pool", "avg", input, route, deterministic)


def global_max_pool(input: SparseTensor, *, route: Optional[str] = None, deterministic: bool = True) -> torch.Tensor:
    """Per-channel max of the rows of each batch: a dense ``(B, C)`` tensor (B as in
    ``global_sum_pool``). Ties and the gradient go to the first row; an empty batch raises
    ValueError."""
    return _global("global_max_pool", "max", input, route, deterministic)


# ---- coarse -> fine -----------------------------------------------------------------------------


def pool_transpose3d(
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: Optional[IntOr3] = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    *,
    coordinates: Optional[SparseTensor] = None,
    route: Optional[str] = None,
    deterministic: bool = True,
) -> SparseTensor:
    """Unpooling: each fine row gets the mean of the coarse rows that reach it through the
    transposed relation ``o == c*stride + offset_k - padding`` (indexed offsets ``0..K-1`` times
    dilation).

    Without ``coordinates`` the output is the relation's generated support (unique children in
    first-occurrence order; ``kernel_size == stride`` gives each coarse row its own block of
    children, each a copy of its parent); with ``coordinates=target`` (e.g. a skip connection)
    exactly the target's rows and identity, rows with no coarse parent being 0. Output stride =
    input stride / stride (exact). ``stride`` defaults to ``kernel_size``.
    """
    p = plan_pool_transpose("pool_transpose3d", input, kernel_size, stride, padding, dilation,
                            coordinates=coordinates, route=route, deterministic=deterministic)
    return _wrap(p, input)


def trilinear_upsample3d(
    input: SparseTensor,
    stride: Optional[IntOr3] = None,
    *,
    coordinates: Optional[SparseTensor] = None,
    route: Optional[str] = None,
    deterministic: bool = True,
) -> SparseTensor:
    """Trilinear interpolation from a coarse tensor (stride ``S_c``) onto a fine support (``S_f``).

    Geometry, per axis, in physical units: coarse row ``c`` is centred at ``(c + 0.5) * S_c``,
    fine row ``f`` at ``(f + 0.5) * S_f``. With ``r = S_c / S_f`` the fine centre sits at
    ``u = (f + 0.5) / r - 0.5`` coarse lattice units; its neighbours are ``lo = floor(u)``
    (weight ``1 - t``) and ``lo + 1`` (weight ``t``), ``t = u - lo``. A fine row takes the 8
    corner rows (same batch) with the product of the three axis weights. Corners absent from the
    input (or with weight 0) are dropped and the remaining weights renormalised to sum 1; a fine
    row with no corner gets 0. Same stride (``r = 1``) copies rows that exist.

    Fine support: ``coordinates`` (its stride must divide the input's; ``stride``, if given,
    must equal the ratio), or without it the children ``c*stride + (0..stride-1)`` of every
    coarse row (deduplicated, first-occurrence order) at stride ``S_c / stride`` (``stride``
    defaults to 2 and must divide ``S_c``).
    """
    p = plan_trilinear_upsample("trilinear_upsample3d", input, stride, coordinates=coordinates, route=route,
                                deterministic=deterministic)
    return _wrap(p, input)


# ---- lattice.explain ----------------------------------------------------------------------------

_LOCAL_MODES = {"sum_pool3d": "sum", "avg_pool3d": "avg", "max_pool3d": "max"}
_GLOBAL_MODES = {"global_sum_pool": "sum", "global_avg_pool": "avg", "global_max_pool": "max"}
POOL_OPS = ("pool3d", *_LOCAL_MODES, *_GLOBAL_MODES, "pool_transpose3d", "trilinear_upsample3d")


def explain_pool(op: str, args: tuple, kwargs: dict, pass_: str = "forward") -> Any:
    """The route decision of a pooling op called with ``args``/``kwargs`` (without running it).

    ``pass_`` is "forward" or "input_grad"; the input's features stand in for the gradient
    (only their dtype and channel count matter).
    """
    if not args:
        raise TypeError(f"[explain] args: expected the op's (input, ...) arguments, got {len(args)} values")
    kw = dict(kwargs)
    x = _check_input(op, args[0])
    if op == "pool3d":
        p = plan_pool(op, *args, **kw)
    elif op in _LOCAL_MODES:
        p = plan_pool(op, *args, **{**kw, "mode": _LOCAL_MODES[op]})
    elif op in _GLOBAL_MODES:
        p = plan_global_pool(op, args[0], _GLOBAL_MODES[op], **kw)
    elif op == "pool_transpose3d":
        p = plan_pool_transpose(op, *args, **kw)
    elif op == "trilinear_upsample3d":
        p = plan_trilinear_upsample(op, *args, **kw)
    else:
        raise ValueError(f"[explain] op: expected one of {', '.join(POOL_OPS)}, got {op!r}")
    if pass_ == "input_grad":
        feats = torch.zeros(int(p.n_out), x.feats.shape[1], dtype=x.feats.dtype, device=x.feats.device)
    else:
        feats = x.feats
    return core.explain_pool(p, to_core(feats), pass_)
