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
    """Y = conv(X, W) (+ b) over a planned relation; gradients for X, W and b from the core."""

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Any) -> torch.Tensor:  # type: ignore[override]
        out = conv_forward(plan, feats, weight, bias)
        ctx.plan = plan
        ctx.has_bias = bias is not None
        ctx.save_for_backward(feats, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        feats, weight = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        if not (need_x or need_w or need_b):
            return None, None, None, None
        dx, dw, db = core.conv_backward(
            ctx.plan, to_core(feats), to_core(weight), to_core(grad_out.contiguous()),
            bool(need_x), bool(need_w), bool(need_b and ctx.has_bias),
        )
        return (
            from_core(dx) if dx is not None else None,
            from_core(dw) if dw is not None else None,
            from_core(db) if db is not None else None,
            None,
        )
