"""torch.autograd.Function wrappers over the core's forward and backward kernels."""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from ._core import borrow, core, from_core, to_core
from ._held import held

# torch dtype -> the core's dtype name (the weight gradient's dtype argument of conv_backward)
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
                torch.float64: "float64"}


def _bias_arg(bias: Optional[torch.Tensor]) -> Any:
    """The core argument of a conv's bias: a module's parameter is held across calls
    (lattice._held: converted once per storage), any other tensor (a cast under autocast, a
    functional caller's temporary) crosses for this call only."""
    if bias is None:
        return None
    if isinstance(bias, torch.nn.Parameter):
        return held(bias)
    return borrow(bias)


def conv_forward(plan: Any, feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 weight_core: Any = None) -> torch.Tensor:
    """The core's forward of one planned conv (no autograd): ConvFunction's forward, and the call
    lattice.ops makes directly when nothing needs a gradient. ``weight_core``: the core's array of
    ``weight`` when the caller holds one (a cached kernel-major layout), else None."""
    w = weight_core if weight_core is not None else borrow(weight)
    return from_core(core.conv_forward(plan, borrow(feats), w, _bias_arg(bias)))


def _torch_kernel_major(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, tuple]:
    """``weight`` (dense (C_out, Kx, Ky, Kz, C_in) or kernel-major) as the contiguous kernel-major
    (K, C_in, C_out) array in ``dtype``, by torch's permute and one copy (the ops
    lattice.ops.conv.kernel_major_weight runs outside the node), and what the backward needs to map
    the gradient back: (the weight's dtype, its dense shape or None)."""
    if weight.dim() == 5:
        kv = weight.shape[1] * weight.shape[2] * weight.shape[3]
        km = weight.permute(1, 2, 3, 4, 0).reshape(kv, weight.shape[4], weight.shape[0])
        dense_shape = tuple(weight.shape)
    else:
        km, dense_shape = weight, None
    return torch.empty(km.shape, dtype=dtype, device=weight.device).copy_(km), (weight.dtype, dense_shape)


class ConvFunction(torch.autograd.Function):
    """Y = conv(X, W) (+ b) over a planned relation; gradients for X, W and b from the core.

    ``prepare=True`` (a training call, see ``lattice.ops.conv._core_prepares``): ``weight`` is the
    caller's parameter as it is -- dense or kernel-major, and under ``torch.autocast`` still in
    its float32 master dtype. The core makes the kernel-major weight in the feature dtype in one
    pass (``conv_compute_weight``), the forward saves that copy for the backward, and the backward
    returns the weight gradient in the parameter's own layout and dtype, converted once: no torch
    cast or permute and none of their autograd nodes. The values are those of casting and permuting
    with torch first (exact conversions, the same kernels), bit for bit.

    ``prepare="torch"`` (the same on the CPU, lattice.ops.conv.PERMUTE_IN_NODE): the forward
    permutes / casts with torch inside the node (no autograd ops), and the backward maps the
    kernel-major gradient back with ``.to(dtype)`` and a permuted view -- what the autograd nodes of
    those torch ops would do, minus the nodes.

    ``weight_core``: the core's array of ``weight`` when the caller holds one (lattice.ops.conv's
    cached kernel-major layout of a weight that needs no gradient), used by forward and backward.
    """

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Any,  # type: ignore[override]
                prepare: Union[bool, str] = False, weight_core: Any = None) -> torch.Tensor:
        ctx.weight_form = (None, None)
        ctx.torch_form = None
        w = weight
        if prepare and not (weight.dim() == 3 and weight.dtype == feats.dtype and weight.is_contiguous()):
            weight_core = None
            if prepare == "torch":
                w, ctx.torch_form = _torch_kernel_major(weight, feats.dtype)
            else:
                w = from_core(core.conv_compute_weight(plan, borrow(feats), to_core(weight)))
                ctx.weight_form = ("dense" if weight.dim() == 5 else "kernel_major",
                                   _DTYPE_NAMES.get(weight.dtype) or str(weight.dtype).split(".")[-1])
        out = conv_forward(plan, feats, w, bias, weight_core)
        ctx.plan = plan
        ctx.has_bias = bias is not None
        ctx.weight_core = weight_core
        ctx.save_for_backward(feats, w)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        feats, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if not (need_x or need_w or need_b):
            return None, None, None, None, None, None
        w = ctx.weight_core if ctx.weight_core is not None else borrow(weight)
        dx, dw, db = core.conv_backward(
            ctx.plan, borrow(feats), w, borrow(grad_out.contiguous()),
            bool(need_x), bool(need_w), bool(need_b and ctx.has_bias), *ctx.weight_form,
        )
        if dw is not None:
            dw = from_core(dw)
            if ctx.torch_form is not None:  # prepare="torch": back to the parameter's layout and dtype
                dtype, dense_shape = ctx.torch_form
                dw = dw.to(dtype)
                if dense_shape is not None:  # (K, C_in, C_out) -> (C_out, Kx, Ky, Kz, C_in), a view
                    dw = dw.view(*dense_shape[1:], dense_shape[0]).permute(4, 0, 1, 2, 3)
        return (
            from_core(dx) if dx is not None else None,
            dw,
            from_core(db) if db is not None else None,
            None,
            None,
            None,
        )
