"""Sparse algebra (SEMANTICS.md "Sparse algebra and coordinate utilities").

Two sparse tensors are aligned by coordinate value (batch included) with a join, then their
aligned feature rows are combined:

* ``inner``: the lhs rows found in rhs, in lhs order;
* ``left``: the lhs rows; ``right``: the rhs rows;
* ``outer``: the lhs rows, then the rhs rows absent from lhs, in rhs order.

A side missing at an output row reads the constant ``fill`` (default 0, rounded to the feature
dtype) and receives no gradient. Default joins: ``sparse_add``/``sparse_sub`` outer,
``sparse_mul``/``sparse_maximum``/``sparse_minimum``/``sparse_cat_aligned`` inner. Both tensors
must have the same stride (ValueError otherwise), feature dtype and (except for the
concatenation) channel count.

Identity of the output: when both operands share one coordinate key nothing is aligned (the fast
path) and the output keeps that key. Otherwise the output *is* an operand's coordinate set (same
key, cached relations reused) exactly when its rows are that operand's rows in that operand's
order, lhs checked first: left joins keep lhs's key, right joins rhs's, inner joins that find
every lhs row and outer joins without rhs-only rows keep lhs's. Any other output gets a new key
(with ``batch_counts`` when every operand contributing rows has them).

Every op is differentiable in both operands. ``sparse_maximum``/``sparse_minimum`` send the whole
gradient of an element to the side they chose, lhs on ties (and lhs when lhs is NaN, so NaN
propagates); a missing side (the fill) gets nothing.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional

import torch
from torch.autograd.function import once_differentiable

from .._core import core, from_core, to_core
from .._device import check_device
from ..tensor import SparseTensor

JOINS = ("inner", "left", "right", "outer")
DEFAULT_JOIN = {"add": "outer", "sub": "outer", "mul": "inner", "maximum": "inner", "minimum": "inner", "cat": "inner"}
OP_COMBINE = {
    "sparse_add": "add",
    "sparse_sub": "sub",
    "sparse_mul": "mul",
    "sparse_maximum": "maximum",
    "sparse_minimum": "minimum",
    "sparse_cat_aligned": "cat",
}


class CombineFunction(torch.autograd.Function):
    """Combine of aligned feature rows (core forward/backward kernels); gradients for both sides."""

    @staticmethod
    def forward(ctx: Any, lhs: torch.Tensor, rhs: torch.Tensor, alignment: Any, combine: str, fill: float,  # type: ignore[override]
                route: Optional[str]) -> torch.Tensor:
        out = from_core(core.algebra_forward(alignment, combine, to_core(lhs), to_core(rhs), fill, route))
        ctx.alignment, ctx.combine, ctx.fill, ctx.route = alignment, combine, fill, route
        ctx.save_for_backward(lhs, rhs)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        lhs, rhs = ctx.saved_tensors
        need_lhs, need_rhs = ctx.needs_input_grad[:2]
        if not (need_lhs or need_rhs):
            return None, None, None, None, None, None
        dl, dr = core.algebra_backward(
            ctx.alignment, ctx.combine, to_core(lhs), to_core(rhs), to_core(grad_out.contiguous()), ctx.fill,
            bool(need_lhs), bool(need_rhs), ctx.route,
        )
        return (
            from_core(dl) if dl is not None else None,
            from_core(dr) if dr is not None else None,
            None, None, None, None,
        )


def check_sparse(op: str, what: str, x: Any) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"[{op}] {what}: expected a lattice.SparseTensor, got {type(x).__name__}")
    return x


def _check_join(op: str, join: Any, combine: str) -> str:
    if join is None:
        return DEFAULT_JOIN[combine]
    if not isinstance(join, str):
        raise TypeError(f"[{op}] join: expected one of 'inner', 'left', 'right', 'outer' or None, got {type(join).__name__}")
    if join not in JOINS:
        raise ValueError(f"[{op}] join: expected one of 'inner', 'left', 'right', 'outer', got {join!r}")
    return join


def _check_fill(op: str, fill: Any) -> float:
    if isinstance(fill, bool) or not isinstance(fill, numbers.Real):
        raise TypeError(f"[{op}] fill: expected a real number, got {type(fill).__name__}")
    return float(fill)


def check_route(op: str, route: Any) -> Optional[str]:
    if route is not None and not isinstance(route, str):
        raise TypeError(f"[{op}] route: expected a route name (str) or None, got {type(route).__name__}")
    return route


def wrap_output(output_set: Any, lhs: SparseTensor, rhs: SparseTensor, feats: torch.Tensor) -> SparseTensor:
    """A SparseTensor on the alignment's output set, reusing an operand's tensor when it is its set."""
    if output_set.key == lhs.key:
        return lhs.replace_feats(feats)
    if output_set.key == rhs.key:
        return rhs.replace_feats(feats)
    return SparseTensor._from_core(output_set, feats)


def _apply(op: str, lhs: Any, rhs: Any, join: Any, fill: Any, route: Any) -> SparseTensor:
    combine = OP_COMBINE[op]
    check_sparse(op, "lhs", lhs)
    check_sparse(op, "rhs", rhs)
    j = _check_join(op, join, combine)
    f = _check_fill(op, fill)
    r = check_route(op, route)
    check_device(op, "rhs", rhs, lhs.device)
    alignment = core.align(op, lhs._cs, rhs._cs, j, r)
    feats = CombineFunction.apply(lhs.feats, rhs.feats, alignment, combine, f, r)
    return wrap_output(alignment.output, lhs, rhs, feats)


def sparse_add(lhs: SparseTensor, rhs: SparseTensor, *, join: Optional[str] = None, fill: float = 0.0,
               route: Optional[str] = None) -> SparseTensor:
    """``lhs + rhs`` aligned by coordinates (default join ``outer``: the union of both supports).

    Args:
        lhs, rhs: SparseTensors with equal stride, channel count and feature dtype.
        join: "inner", "left", "right" or "outer" (default "outer").
        fill: value of a missing side (default 0).
        route: force an algebra route ("hashed", "reference").
    """
    return _apply("sparse_add", lhs, rhs, join, fill, route)


def sparse_sub(lhs: SparseTensor, rhs: SparseTensor, *, join: Optional[str] = None, fill: float = 0.0,
               route: Optional[str] = None) -> SparseTensor:
    """``lhs - rhs`` aligned by coordinates (default join ``outer``); see :func:`sparse_add`."""
    return _apply("sparse_sub", lhs, rhs, join, fill, route)


def sparse_mul(lhs: SparseTensor, rhs: SparseTensor, *, join: Optional[str] = None, fill: float = 0.0,
               route: Optional[str] = None) -> SparseTensor:
    """``lhs * rhs`` aligned by coordinates (default join ``inner``: rows present in both)."""
    return _apply("sparse_mul", lhs, rhs, join, fill, route)


def sparse_maximum(lhs: SparseTensor, rhs: SparseTensor, *, join: Optional[str] = None, fill: float = 0.0,
                   route: Optional[str] = None) -> SparseTensor:
    """Elementwise maximum aligned by coordinates (default join ``inner``).

    Picks lhs when ``lhs >= rhs`` (ties and a NaN lhs choose lhs; a NaN rhs is chosen otherwise,
    so NaN propagates); the gradient of each element goes entirely to the chosen side.
    """
    return _apply("sparse_maximum", lhs, rhs, join, fill, route)


def sparse_minimum(lhs: SparseTensor, rhs: SparseTensor, *, join: Optional[str] = None, fill: float = 0.0,
                   route: Optional[str] = None) -> SparseTensor:
    """Elementwise minimum aligned by coordinates (default join ``inner``); ties choose lhs, as in
    :func:`sparse_maximum`."""
    return _apply("sparse_minimum", lhs, rhs, join, fill, route)


def sparse_cat_aligned(lhs: SparseTensor, rhs: SparseTensor, *, join: Optional[str] = None, fill: float = 0.0,
                       route: Optional[str] = None) -> SparseTensor:
    """Feature concatenation ``[lhs | rhs]`` (C_lhs + C_rhs columns) of rows aligned by coordinates
    (default join ``inner``). Use :func:`lattice.ops.cat` when the tensors share one key."""
    return _apply("sparse_cat_aligned", lhs, rhs, join, fill, route)


_SCALAR_FN = {
    "add": lambda f, o: f + o,
    "sub": lambda f, o: f - o,
    "mul": lambda f, o: f * o,
    "rsub": lambda f, o: o - f,
}
_SPARSE_FN = {"add": sparse_add, "sub": sparse_sub, "mul": sparse_mul}


def operator(combine: str, x: SparseTensor, other: Any) -> Any:
    """``x (+ - *) other`` for the SparseTensor operators.

    Another SparseTensor goes through :func:`sparse_add` / :func:`sparse_sub` / :func:`sparse_mul`
    with their default joins; a Python number or a torch tensor that broadcasts to the feature
    matrix (N, C) (e.g. a scalar or a (C,) row) acts on the features and keeps the identity.
    Anything else returns NotImplemented (Python then raises TypeError).
    """
    if isinstance(other, SparseTensor):
        if combine == "rsub":
            return NotImplemented
        return _SPARSE_FN[combine](x, other)
    if isinstance(other, bool) or not isinstance(other, (numbers.Number, torch.Tensor)):
        return NotImplemented
    op = {"add": "sparse_add", "sub": "sparse_sub", "mul": "sparse_mul", "rsub": "sparse_sub"}[combine]
    if isinstance(other, torch.Tensor) and other.dim() > 0:  # a 0-d tensor is a scalar on any device
        check_device(op, "rhs", other, x.device)
    feats = _SCALAR_FN[combine](x.feats, other)
    if feats.shape != x.feats.shape:
        shape = tuple(other.shape) if isinstance(other, torch.Tensor) else ()
        raise ValueError(
            f"[{op}] rhs: expected a number or a tensor broadcasting to the features {tuple(x.feats.shape)}, "
            f"got shape {shape}"
        )
    return x.replace_feats(feats)


EXPLAINED = tuple(OP_COMBINE)


def explain(op: str, lhs: Any = None, rhs: Any = None, *, join: Optional[str] = None, pass_: str = "forward",
            **_ignored: Any) -> Any:
    """Route decision of an algebra op. ``pass_``: "forward" (the alignment, or the combine when both
    operands share one key and nothing is aligned), "align", "combine" (forward combine of the
    aligned rows) or "backward"."""
    combine = OP_COMBINE[op]
    check_sparse(op, "lhs", lhs)
    check_sparse(op, "rhs", rhs)
    j = _check_join(op, join, combine)
    check_device(op, "rhs", rhs, lhs.device)
    if pass_ not in ("forward", "align", "combine", "backward"):
        raise ValueError(f"[explain] pass_: expected 'forward', 'align', 'combine' or 'backward', got {pass_!r}")
    same_key = lhs.key == rhs.key
    if pass_ == "align" or (pass_ == "forward" and not same_key):
        return core.explain_align(op, lhs._cs, rhs._cs, j)
    alignment = core.align(op, lhs._cs, rhs._cs, j)
    which = "backward" if pass_ == "backward" else "forward"
    return core.explain_combine(alignment, combine, which, to_core(lhs.feats), to_core(rhs.feats))
