"""Convolution modules. Weights use the dense layout (C_out, Kx, Ky, Kz, C_in)."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from .. import ops
from .._core import as_triple
from ..tensor import SparseTensor

IntOr3 = Union[int, Sequence[int]]


def _at_least(value: IntOr3, what: str, op: str, minimum: int) -> tuple[int, int, int]:
    v = as_triple(value, what, op)
    if min(v) < minimum:
        raise ValueError(f"[{op}] {what}: expected values >= {minimum}, got {v}")
    return v


class _ConvBase(torch.nn.Module):
    def __init__(self, op: str, in_channels: int, out_channels: int, kernel_size: IntOr3, bias: bool,
                 dtype: Optional[torch.dtype], device: Optional[torch.device]) -> None:
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"[{op}] channels: expected positive in/out channels, got {in_channels}, {out_channels}")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = as_triple(kernel_size, "kernel_size", op)
        if min(self.kernel_size) < 1:
            raise ValueError(f"[{op}] kernel_size: expected sizes >= 1, got {self.kernel_size}")
        kw = {"dtype": dtype, "device": device}
        self.weight = torch.nn.Parameter(torch.empty(out_channels, *self.kernel_size, in_channels, **kw))
        self.bias = torch.nn.Parameter(torch.empty(out_channels, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torch's Conv default: kaiming_uniform(a=sqrt(5)) == U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        fan_in = self.in_channels * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, bias={self.bias is not None}"


class Conv3d(_ConvBase):
    """Forward sparse conv (``lattice.ops.conv3d``); ``forward(x, coordinates=None)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3, stride: IntOr3 = 1,
                 padding: IntOr3 = 0, dilation: IntOr3 = 1, bias: bool = False, expand: bool = False,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None, *,
                 transposed: bool = False, generative: bool = False) -> None:
        if transposed or generative:  # TorchSparse spells these as flags of its Conv3d
            name = "GenerativeConvTranspose3d" if generative else "ConvTranspose3d"
            raise TypeError(
                f"[Conv3d] {'generative' if generative else 'transposed'}: expected False (TorchSparse's "
                f"Conv3d(..., {'generative' if generative else 'transposed'}=True) is a separate module here), got True: "
                f"use lattice.nn.{name}(in_channels, out_channels, kernel_size, stride)"
                + ("" if generative else ", and call it as up(x, coordinates=skip) to land on the skip's rows "
                   "(TorchSparse reuses the encoder's coordinates implicitly)"))
        super().__init__("Conv3d", in_channels, out_channels, kernel_size, bias, dtype, device)
        self.stride = _at_least(stride, "stride", "Conv3d", 1)
        self.padding = _at_least(padding, "padding", "Conv3d", 0)
        self.dilation = _at_least(dilation, "dilation", "Conv3d", 1)
        self.expand = bool(expand)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        return ops.conv3d(x, self.weight, self.bias, kernel_size=self.kernel_size, stride=self.stride,
                          padding=self.padding, dilation=self.dilation, coordinates=coordinates,
                          expand=self.expand)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", stride={self.stride}"


class SubmConv3d(_ConvBase):
    """Submanifold conv (``lattice.ops.subm_conv3d``): output rows = input rows."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3 = 3, dilation: IntOr3 = 1,
                 bias: bool = False, dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__("SubmConv3d", in_channels, out_channels, kernel_size, bias, dtype, device)
        self.dilation = _at_least(dilation, "dilation", "SubmConv3d", 1)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return ops.subm_conv3d(x, self.weight, self.bias, kernel_size=self.kernel_size, dilation=self.dilation)


class ConvTranspose3d(_ConvBase):
    """Transposed conv; ``forward(x, coordinates=None)`` generates rows or lands on a target."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3, stride: IntOr3 = 1,
                 padding: IntOr3 = 0, dilation: IntOr3 = 1, bias: bool = False,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> None:
        super().__init__("ConvTranspose3d", in_channels, out_channels, kernel_size, bias, dtype, device)
        self.stride = _at_least(stride, "stride", "ConvTranspose3d", 1)
        self.padding = _at_least(padding, "padding", "ConvTranspose3d", 0)
        self.dilation = _at_least(dilation, "dilation", "ConvTranspose3d", 1)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        return ops.conv_transpose3d(x, self.weight, self.bias, kernel_size=self.kernel_size, stride=self.stride,
                                    padding=self.padding, dilation=self.dilation, coordinates=coordinates)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", stride={self.stride}"


class GenerativeConvTranspose3d(_ConvBase):
    """Generative transposed conv: every child ``coords*stride + offset`` (deduplicated)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3, stride: IntOr3 = 1,
                 dilation: IntOr3 = 1, bias: bool = False, dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__("GenerativeConvTranspose3d", in_channels, out_channels, kernel_size, bias, dtype, device)
        self.stride = _at_least(stride, "stride", "GenerativeConvTranspose3d", 1)
        self.dilation = _at_least(dilation, "dilation", "GenerativeConvTranspose3d", 1)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return ops.generative_conv_transpose3d(x, self.weight, self.bias, kernel_size=self.kernel_size,
                                               stride=self.stride, dilation=self.dilation)
