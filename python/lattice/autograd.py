"""torch.autograd.Function wrappers over the core's forward and backward kernels."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._core import core, from_core, optional_core, to_core


def conv_forward(plan: Any, feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The core's forward of one planned conv (no autograd): ConvFunction's forward, and the call
    lattice.ops makes directly when nothing needs a gradient."""
    return from_core(core.conv_forward(plan, to_core(feats), to_core(weight), optional_core(bias)))


class ConvFunction(torch.autograd.Function):
    """Y = conv(X, W) (+ b) over a planned relation; gradients for X, W and b from the core.

    ``prepare=True`` (a training call on the device, see ``lattice.ops.conv``): ``weight`` is the
    caller's parameter as it is -- dense or kernel-major, and under ``torch.autocast`` still in
    its float32 master dtype. The core makes the kernel-major weight in the feature dtype in one
    pass (``conv_compute_weight``), the forward saves that copy for the backward, and the backward
    returns the weight gradient in the parameter's own layout and dtype, converted once: no torch
    cast or permute and none of their autograd nodes. The values are those of casting and permuting
    with torch first (exact conversions, the same kernels), bit for bit.
    """

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Any,  # type: ignore[override]
                prepare: bool = False) -> torch.Tensor:
        ctx.weight_form = (None, None)
        w = weight
        if prepare and not (weight.dim() == 3 and weight.dtype == feats.dtype and weight.is_contiguous()):
            w = from_core(core.conv_compute_weight(plan, to_core(feats), to_core(weight)))
            ctx.weight_form = ("dense" if weight.dim() == 5 else "kernel_major", str(weight.dtype).split(".")[-1])
        out = conv_forward(plan, feats, w, bias)
        ctx.plan = plan
        ctx.has_bias = bias is not None
        ctx.save_for_backward(feats, w)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        feats, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if not (need_x or need_w or need_b):
            return None, None, None, None, None
        dx, dw, db = core.conv_backward(
            ctx.plan, to_core(feats), to_core(weight), to_core(grad_out.contiguous()),
            bool(need_x), bool(need_w), bool(need_b and ctx.has_bias), *ctx.weight_form,
        )
        return (
            from_core(dx) if dx is not None else None,
            from_core(dw) if dw is not None else None,
            from_core(db) if db is not None else None,
            None,
            None,
        )
