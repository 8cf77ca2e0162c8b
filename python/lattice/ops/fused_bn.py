"""Batch normalisation (+ fused ReLU) of the feature matrix on lattice's own route table (family
``batch_norm``: ``cuda``, ``parallel`` on the CPU with lattice's threads, the scalar ``reference``).

:func:`fused_batch_norm` is ``torch.nn.functional.batch_norm`` on the (N, C) feature matrix,
optionally followed by ReLU, as one autograd node: one core call forward (2-3 kernels on CUDA),
one backward (dx, dweight, dbias together). Semantics are torch's BatchNorm1d's: training
normalises with the rows' mean and biased variance and updates the running statistics in place
with the unbiased one (N / (N - 1)); eval uses the running statistics; N = 1 in training raises
ValueError, N = 0 returns an empty output and leaves the running statistics alone. Gradients
of x, weight and bias (once differentiable: no double backward, unlike torch's).

dtypes: features float16 / bfloat16 / float32 (float64 too); the per-channel tensors (weight,
bias, running statistics) float32, float64 for float64 features (the dtypes of a BatchNorm1d
under torch.autocast, whose batch norm runs in the input's dtype with float32 parameters). The
statistics and arithmetic are float32 for 16-bit features, the output rounded once.
Deterministic: every sum over rows runs in a fixed order (fixed 32-row blocks whose partials are
summed in a fixed order, src/backend/common/batch_norm.h), so results are bitwise the same for
any thread count and on every run.

:class:`lattice.nn.BatchNorm` and lattice.models' ``batch_norm_relu`` use this op when it is
exactly torch's computation (see :func:`lattice.nn.features._lattice_batch_norm`); the module
switch :data:`USE_LATTICE_BATCH_NORM` turns that off (torch's BatchNorm1d then runs).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.autograd.function import once_differentiable

from .._core import core, from_core, to_core
from .._held import optional_held
from ..tensor import SparseTensor

# lattice.nn's BatchNorm / batch_norm_relu run this op where it is equivalent to torch's
# (False: always torch's BatchNorm1d, e.g. to compare the two).
USE_LATTICE_BATCH_NORM = True
# The device types on which lattice.nn uses this op by default: NN_DEVICES in training mode,
# NN_EVAL_DEVICES in eval mode. On CUDA the op is used in training only. In eval mode its two
# launches (running statistics, then normalisation) cost more host time than torch's one kernel
# plus the in-place ReLU (kitti MinkUNet42 `.half()` inference 8.2 -> 11.4 ms on the H200,
# 2026-12-02), and eval has no reduction whose order could differ: torch's kernel is
# deterministic there. Setting both to frozenset({"cpu"}) gives torch's batch norm on CUDA.
NN_DEVICES = frozenset({"cpu", "cuda"})
NN_EVAL_DEVICES = frozenset({"cpu"})
# The device types on which lattice.models' residual blocks fuse their sum and ReLU into the
# second batch norm (lattice.nn.features.batch_norm_add_relu: relu(bn(x) + skip) as one node and
# one pass instead of a batch norm, torch's add and torch's in-place ReLU); a subset of the two
# sets above applies too (on CUDA: in training, where lattice's batch norm runs there).
NN_RESIDUAL_DEVICES = frozenset({"cpu", "cuda"})

_FEATURE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def param_dtype(feats_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the per-channel tensors for features of ``feats_dtype``."""
    return torch.float64 if feats_dtype == torch.float64 else torch.float32


class BatchNormFunction(torch.autograd.Function):
    """Batch norm (+ ReLU) of a feature matrix through the core (forward / backward kernels).

    The core keeps what the backward reads (x, y when relu, the weight, mean and invstd) as its
    own arrays in a state object, so the backward converts only dy; x and y are also saved here,
    so that torch's saved-tensor version check still catches an in-place change of either."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],  # type: ignore[override]
                running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor], training: bool,
                momentum: float, eps: float, relu: bool, op: str, route: Optional[str],
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        # the per-channel tensors are a module's parameters and buffers, the same tensors on every
        # call: their core arrays are held across calls (lattice._held)
        y, state = core.batch_norm_apply(
            to_core(x), optional_held(weight), optional_held(bias), optional_held(running_mean),
            optional_held(running_var), training, relu, eps, momentum, op, route,
            None if residual is None else to_core(residual))
        y = from_core(y)
        ctx.state = state
        ctx.save_for_backward(x, y if relu else None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        ctx.saved_tensors  # the version check of x and y (values are read from ctx.state)
        need = ctx.needs_input_grad
        need_params = bool(need[1] or need[2])
        need_residual = bool(need[11])
        if not (need[0] or need_params or need_residual):
            return (None,) * 12
        dx, dw, db, dr = core.batch_norm_apply_backward(ctx.state, to_core(grad_out.contiguous()), bool(need[0]),
                                                        need_params, need_residual)
        return (from_core(dx) if need[0] else None, from_core(dw) if need[1] else None,
                from_core(db) if need[2] else None) + (None,) * 8 + (from_core(dr) if need_residual else None,)


def batch_norm_feats(feats: torch.Tensor, running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
                     weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, training: bool = False,
                     momentum: float = 0.1, eps: float = 1e-5, relu: bool = False, *, op: str = "fused_batch_norm",
                     route: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`fused_batch_norm` on a plain (N, C) tensor. The core validates every argument
    ("[op] argument: expected ..., got ..."), torch-level type errors are raised here."""
    if not isinstance(feats, torch.Tensor):
        raise TypeError(f"[{op}] input: expected a torch.Tensor (N, C), got {type(feats).__name__}")
    if residual is not None and not isinstance(residual, torch.Tensor):
        raise TypeError(f"[{op}] residual: expected a torch.Tensor (N, C) or None, got {type(residual).__name__}")
    for what, v in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if v is not None and not isinstance(v, torch.Tensor):
            raise TypeError(f"[{op}] {what}: expected a torch.Tensor or None, got {type(v).__name__}")
    for what, v in (("running_mean", running_mean), ("running_var", running_var)):
        # updated in place: a strided one would reach the core as a contiguous copy on CUDA
        if v is not None and not v.is_contiguous():
            raise ValueError(f"[{op}] {what}: expected a contiguous tensor (it is updated in place), got a strided one")
    if route is not None and not isinstance(route, str):
        raise TypeError(f"[{op}] route: expected a route name or None, got {type(route).__name__}")
    for what, v in (("momentum", momentum), ("eps", eps)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"[{op}] {what}: expected a real number, got {type(v).__name__}")
    return BatchNormFunction.apply(feats, weight, bias, running_mean, running_var, bool(training), float(momentum),
                                   float(eps), bool(relu), op, route, residual)


def fused_batch_norm(input: SparseTensor, running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
                     weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, training: bool = False,
                     momentum: float = 0.1, eps: float = 1e-5, relu: bool = False, *,
                     route: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> SparseTensor:
    """Batch norm of the features (then ReLU when ``relu``) on lattice's route table: the
    arguments of :func:`lattice.ops.batch_norm` (torch's kernel), plus ``relu``, ``route``
    ("cuda", "parallel" or "reference"; None lets the table choose) and ``residual``: an (N, C)
    tensor of the input's dtype and device, row i added to output row i before the ReLU
    (``relu(bn(x) + residual)``, a residual block's sum; the sum is made in the accumulation type
    (float32; float64 for float64 features) and rounded once; the CPU routes only). Rows and coordinate identity are unchanged."""
    op = "fused_batch_norm"
    if not isinstance(input, SparseTensor):
        raise TypeError(f"[{op}] input: expected a lattice.SparseTensor, got {type(input).__name__}")
    return input.replace_feats(batch_norm_feats(input.feats, running_mean, running_var, weight, bias, training,
                                                momentum, eps, relu, op=op, route=route, residual=residual))


def explain(input: Any, *, training: bool = False, relu: bool = False, pass_: str = "forward") -> Any:
    """The route decision of :func:`fused_batch_norm` on ``input`` (a SparseTensor or an (N, C)
    tensor) for ``pass_`` "forward" or "backward"."""
    feats = input.feats if isinstance(input, SparseTensor) else input
    if not isinstance(feats, torch.Tensor):
        raise TypeError(f"[explain] input: expected a lattice.SparseTensor or torch.Tensor, got {type(input).__name__}")
    return core.explain_batch_norm(to_core(feats), pass_, bool(training), bool(relu), "fused_batch_norm")
