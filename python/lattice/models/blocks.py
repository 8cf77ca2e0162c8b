"""Building blocks shared by the :mod:`lattice.models` networks.

* :class:`ConvBlock`: conv -> BatchNorm -> ReLU (the TorchSparse ``SparseConvBlock`` /
  ``SparseConvTransposeBlock``, SPVNAS ``BasicConvolutionBlock``, OpenPCDet ``post_act_block``);
* :class:`ResidualBlock`: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` with a 1x1
  conv + BatchNorm shortcut when the channel count changes (TorchSparse ``SparseResBlock``,
  MinkowskiEngine ``BasicBlock``, SPVNAS ``ResidualBlock``);
* :class:`WindowConv3d`: a strided conv with the spconv / TorchSparse window
  ``stride * o - padding + [0, K)`` for odd kernels too (lattice's own odd kernels are centred,
  see SEMANTICS.md), obtained by translating the input before a lattice conv.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import nn as lnn
from .. import ops
from .._core import as_triple
from ..tensor import SparseTensor

IntOr3 = Union[int, Sequence[int]]


class ConvBlock(torch.nn.Module):
    """``conv -> BatchNorm -> ReLU``; ``forward(x, coordinates=None)`` passes a target to the conv.

    Children: ``conv`` (any lattice.nn conv), ``bn`` (:class:`lattice.nn.BatchNorm`), ``relu``.
    """

    def __init__(self, conv: torch.nn.Module, *, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.conv = conv
        self.bn = lnn.BatchNorm(conv.out_channels, eps=eps, momentum=momentum)
        self.relu = lnn.ReLU()

    @property
    def out_channels(self) -> int:
        return int(self.conv.out_channels)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        y = self.conv(x) if coordinates is None else self.conv(x, coordinates)  # positional: hooks see it
        return lnn.features.batch_norm_relu(self.bn, self.relu, y)  # relu(bn(y)), ReLU in place when plain


class ResidualBlock(torch.nn.Module):
    """Two submanifold convs (kernel ``kernel_size``) with BatchNorm, ReLU after the residual sum.

    ``shortcut`` is ``None`` (identity) when ``c_in == c_out``, else ``Sequential(SubmConv3d(c_in,
    c_out, 1), BatchNorm(c_out))``. Children: ``conv1, bn1, conv2, bn2, shortcut, relu``.
    """

    def __init__(self, c_in: int, c_out: int, kernel_size: IntOr3 = 3, *, eps: float = 1e-5,
                 momentum: float = 0.1) -> None:
        super().__init__()
        self.conv1 = lnn.SubmConv3d(c_in, c_out, kernel_size)
        self.bn1 = lnn.BatchNorm(c_out, eps=eps, momentum=momentum)
        self.conv2 = lnn.SubmConv3d(c_out, c_out, kernel_size)
        self.bn2 = lnn.BatchNorm(c_out, eps=eps, momentum=momentum)
        self.relu = lnn.ReLU()
        self.shortcut: Optional[torch.nn.Module] = None
        if c_in != c_out:
            self.shortcut = torch.nn.Sequential(lnn.SubmConv3d(c_in, c_out, 1),
                                                lnn.BatchNorm(c_out, eps=eps, momentum=momentum))

    def forward(self, x: SparseTensor) -> SparseTensor:
        y = self.conv2(lnn.features.batch_norm_relu(self.bn1, self.relu, self.conv1(x)))
        skip = x if self.shortcut is None else self.shortcut(x)
        # relu(bn2(y) + skip): one lattice node where its batch norm applies (NN_RESIDUAL_DEVICES)
        return lnn.features.batch_norm_add_relu(self.bn2, self.relu, y, skip)


def translate(x: SparseTensor, shift: Sequence[int]) -> SparseTensor:
    """``x`` with every (x, y, z) coordinate moved by ``shift`` (same features, a new identity)."""
    if not any(shift):
        return x
    c = x.coords.clone()
    c[:, 1:] += torch.tensor(list(shift), dtype=c.dtype, device=c.device)
    return SparseTensor(c, x.feats, x.stride, x.batch_counts)


class WindowConv3d(lnn.Conv3d):
    """A strided sparse conv with the spconv / TorchSparse geometry on every axis:
    output ``o`` reads the inputs ``stride * o - padding + k`` for ``k = 0 .. K-1`` and exists when
    at least one of them does (spconv's output growth), for odd and even ``K`` alike.

    lattice centres odd kernels (``k - (K-1)/2``), so the module translates the input by
    ``padding - (K-1)//2`` per odd axis before ``lattice.ops.conv3d(..., padding=0, expand=True)``;
    the output lands on the same integer coordinates spconv gives (a new coordinate identity).
    The weight layout and kernel-row order are lattice's (C_out, Kx, Ky, Kz, C_in), z fastest.
    ``spatial_shape`` (optional, X, Y, Z of the *input* grid) also drops outputs outside
    spconv's output grid ``(size + 2 p - K) // s + 1`` per axis, as spconv does.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3, stride: IntOr3,
                 padding: IntOr3 = 0, bias: bool = False) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=0, bias=bias, expand=True)
        self.window_padding = as_triple(padding, "padding", "WindowConv3d")
        k, p = self.kernel_size, self.window_padding
        self.shift = tuple((p[a] - (k[a] - 1) // 2) if k[a] % 2 else p[a] for a in range(3))
        # even axes: lattice's indexed offsets already are 0..K-1; padding enters through the shift

    def output_shape(self, shape: Sequence[int]) -> tuple[int, int, int]:
        """spconv's output grid for an input grid ``shape`` (X, Y, Z)."""
        k, s, p = self.kernel_size, self.stride, self.window_padding
        return tuple((int(shape[a]) + 2 * p[a] - k[a]) // s[a] + 1 for a in range(3))

    def forward(self, x: SparseTensor, spatial_shape: Optional[Sequence[int]] = None) -> SparseTensor:  # type: ignore[override]
        # even axes take the padding as a translation too (lattice padding would do the same, but
        # one rule for both parities keeps the output coordinates spconv's)
        y = ops.conv3d(translate(x, self.shift), self.weight, self.bias, kernel_size=self.kernel_size,
                       stride=self.stride, padding=0, dilation=self.dilation, expand=True)
        if spatial_shape is not None:
            y = ops.crop(y, (0, 0, 0), self.output_shape(spatial_shape))
        return y

    def extra_repr(self) -> str:
        return super().extra_repr() + f", window_padding={self.window_padding}"
