"""SparseResNet21D: TorchSparse's CenterPoint-style sparse encoder (``torchsparse.backbones``).

Five stages ``(blocks, channels, kernel, stride)``: ``(3, 16, 3, 1)``, ``(3, 32, 3, 2)``,
``(3, 64, 3, 2)``, ``(3, 128, 3, 2)``, ``(1, 128, (1, 3, 1), (1, 2, 1))``. The first layer of a
stage is a conv + BatchNorm + ReLU (submanifold at stride 1; at stride 2 a
:class:`~lattice.models.blocks.WindowConv3d` with TorchSparse's window ``2 o + [0, K)``, padding 0),
the others :class:`~lattice.models.blocks.ResidualBlock` s. Channels times ``width_multiplier``.

Input convention: SparseTensor, coords ``(batch, x, y, z)`` int32 at stride 1, ``in_channels``
features. The kernel ``(1, 3, 1)`` / stride ``(1, 2, 1)`` of the last stage act on the second
coordinate column after the batch (``y`` in lattice's order), exactly as TorchSparse's tuple does on
its own coordinate columns. Output: the list of the five stage outputs (strides 1, 2, 4, 8 and
(8, 16, 8)).
"""
from __future__ import annotations

from typing import Sequence, Union

import torch

from .. import nn as lnn
from .._core import as_triple
from ..tensor import SparseTensor
from .blocks import ConvBlock, ResidualBlock, WindowConv3d

IntOr3 = Union[int, Sequence[int]]
STAGES_21D = ((3, 16, 3, 1), (3, 32, 3, 2), (3, 64, 3, 2), (3, 128, 3, 2), (1, 128, (1, 3, 1), (1, 2, 1)))


def _first_conv(c_in: int, c_out: int, kernel: IntOr3, stride: IntOr3) -> torch.nn.Module:
    k, s = as_triple(kernel, "kernel_size", "SparseResNet"), as_triple(stride, "stride", "SparseResNet")
    if s == (1, 1, 1) and all(v % 2 for v in k):
        return lnn.SubmConv3d(c_in, c_out, k)
    return WindowConv3d(c_in, c_out, k, stride=s, padding=0)


class SparseResNet(torch.nn.Module):
    """A stack of sparse residual stages; ``forward`` returns every stage's output (a list).

    Args:
        stages: ``(blocks, channels, kernel_size, stride)`` per stage.
        in_channels: input features per voxel.
        width_multiplier: channel scale (``int(width_multiplier * channels)``).

    Children: ``stages[i]`` = Sequential(ConvBlock, ResidualBlock, ...).
    """

    def __init__(self, stages: Sequence[tuple], *, in_channels: int = 4, width_multiplier: float = 1.0) -> None:
        super().__init__()
        self.in_channels = int(in_channels)
        self.stages = torch.nn.ModuleList()
        c_in = in_channels
        for n, c, k, s in stages:
            c_out = max(1, int(c * width_multiplier))
            layers: list[torch.nn.Module] = [ConvBlock(_first_conv(c_in, c_out, k, s))]
            layers += [ResidualBlock(c_out, c_out, k) for _ in range(n - 1)]
            self.stages.append(torch.nn.Sequential(*layers))
            c_in = c_out

    def forward(self, x: SparseTensor) -> list[SparseTensor]:  # type: ignore[override]
        if not isinstance(x, SparseTensor):
            raise TypeError(f"[{type(self).__name__}] input: expected a lattice.SparseTensor, got {type(x).__name__}")
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs


class SparseResNet21D(SparseResNet):
    """TorchSparse's SparseResNet21D stage table (see the module docstring)."""

    def __init__(self, *, in_channels: int = 4, width_multiplier: float = 1.0) -> None:
        super().__init__(STAGES_21D, in_channels=in_channels, width_multiplier=width_multiplier)
