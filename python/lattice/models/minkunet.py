"""The MinkUNet family for LiDAR semantic segmentation (SemanticKITTI and similar).

All three share one layout (SPVNAS ``MinkUNet`` = TorchSparse ``SparseResUNet42`` + classifier =
MinkowskiEngine ``MinkUNet18`` except for the stem), channels ``(32 | 32, 64, 128, 256 | 256,
128, 96, 96)`` times the width multiplier ``cr``:

* stem: submanifold convs at stride 1 (``stem_kernels``), each with BatchNorm + ReLU;
* encoder stage i (i = 1..4): a k2 s2 conv (channels unchanged) + BN + ReLU, then
  ``blocks[i-1]`` :class:`~lattice.models.blocks.ResidualBlock` (the first changes the channels);
* decoder stage i: a k2 s2 transposed conv onto the encoder skip's coordinates + BN + ReLU,
  concatenation ``[up, skip]`` (``lattice.ops.cat``), then ``blocks[3+i]`` residual blocks;
* classifier: a per-voxel ``Linear`` to ``num_classes``.

================  ==================  ===============================  ======================
network           stem                residual blocks per stage        same layout as
================  ==================  ===============================  ======================
MinkUNet18        one k5              2, 2, 2, 2 | 2, 2, 2, 2          ME examples MinkUNet18 (*)
MinkUNet34        one k5              2, 3, 4, 6 | 2, 2, 2, 2          ME examples MinkUNet34C
MinkUNet42        two k3              2, 2, 2, 2 | 2, 2, 2, 2          SPVNAS MinkUNet,
                                                                       TorchSparse SparseResUNet42
================  ==================  ===============================  ======================

(*) ME's plain MinkUNet18 defines no channel table; its 18A / 18B / 18D variants change the decoder
channels: ``MinkUNet18(channels=(32, 32, 64, 128, 256, 128, 128, 96, 96))`` is MinkUNet18A,
``(..., 128, 128, 128, 128)`` 18B, ``(..., 384, 384, 384, 384)`` 18D (the first five stay
32, 32, 64, 128, 256). The default is 34C's / SPVNAS's table.

Input convention: a :class:`lattice.SparseTensor` with coords ``(batch, x, y, z)`` int32 at
stride 1 (voxel indices, e.g. ``floor(xyz / 0.05)``) and ``in_channels`` features per voxel
(SemanticKITTI: x, y, z, remission -> 4). Output: a SparseTensor with the input's rows (same
coordinate identity and order) and ``num_classes`` logits; with ``return_features=True``
``forward`` returns ``(logits, [stem, enc1..enc4, dec1..dec4])``, the per-level outputs that
TorchSparse's backbone returns.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .. import nn as lnn
from .. import ops
from ..tensor import SparseTensor
from .blocks import ConvBlock, ResidualBlock

CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)


class MinkUNet(torch.nn.Module):
    """A sparse residual U-Net (see the module docstring for the layout).

    Args:
        in_channels: features per input voxel (4 for x, y, z, remission).
        num_classes: classifier outputs (19 for SemanticKITTI).
        cr: width multiplier; every channel count is ``int(cr * c)``.
        blocks: residual blocks per stage, 4 encoder then 4 decoder stages.
        stem_kernels: the kernel sizes of the stem's submanifold convs.
        channels: 9 channel counts (stem, 4 encoder stages, 4 decoder stages) before ``cr``.

    Children (TorchSparse's ``SparseResUNet`` names): ``stem`` (Sequential of ConvBlock),
    ``encoders`` (4 x Sequential: ConvBlock(k2 s2), ResidualBlock...), ``decoders`` (4 x ModuleDict:
    ``upsample`` ConvBlock(ConvTranspose3d k2 s2), ``fuse`` Sequential of ResidualBlock), ``classifier``
    (lattice.nn.Linear). Registration order = execution order = the source libraries' order, which
    is what ``lattice.convert`` relies on.
    """

    def __init__(self, in_channels: int = 4, num_classes: int = 19, *, cr: float = 1.0,
                 blocks: Sequence[int] = (2,) * 8, stem_kernels: Sequence[int] = (3, 3),
                 channels: Sequence[int] = CHANNELS) -> None:
        super().__init__()
        if len(blocks) != 8 or min(blocks) < 1:
            raise ValueError(f"[MinkUNet] blocks: expected 8 positive counts (4 encoder, 4 decoder), got {tuple(blocks)}")
        if not cr > 0:
            raise ValueError(f"[MinkUNet] cr: expected a positive width multiplier, got {cr}")
        if len(channels) != 9 or min(channels) < 1:
            raise ValueError(f"[MinkUNet] channels: expected 9 positive counts (stem, 4 encoder, 4 decoder), got {tuple(channels)}")
        cs = [max(1, int(cr * c)) for c in channels]
        self.in_channels, self.num_classes, self.cr = int(in_channels), int(num_classes), float(cr)
        self.blocks, self.stem_kernels, self.channels = tuple(blocks), tuple(stem_kernels), tuple(cs)
        stem = []
        c_prev = in_channels
        for k in stem_kernels:
            stem.append(ConvBlock(lnn.SubmConv3d(c_prev, cs[0], k)))
            c_prev = cs[0]
        self.stem = torch.nn.Sequential(*stem)
        self.encoders = torch.nn.ModuleList()
        for i in range(4):
            layers: list[torch.nn.Module] = [ConvBlock(lnn.Conv3d(cs[i], cs[i], 2, stride=2))]
            c_in = cs[i]
            for _ in range(blocks[i]):
                layers.append(ResidualBlock(c_in, cs[i + 1]))
                c_in = cs[i + 1]
            self.encoders.append(torch.nn.Sequential(*layers))
        self.decoders = torch.nn.ModuleList()
        for i in range(4):
            c_up, c_out, c_skip = cs[4 + i], cs[5 + i], cs[3 - i]
            up = ConvBlock(lnn.ConvTranspose3d(c_up, c_out, 2, stride=2))
            fuse = []
            c_in = c_out + c_skip
            for _ in range(blocks[4 + i]):
                fuse.append(ResidualBlock(c_in, c_out))
                c_in = c_out
            self.decoders.append(torch.nn.ModuleDict({"upsample": up, "fuse": torch.nn.Sequential(*fuse)}))
        self.classifier = lnn.Linear(cs[8], num_classes)

    def forward(self, x: SparseTensor, return_features: bool = False):  # type: ignore[override]
        if not isinstance(x, SparseTensor):
            raise TypeError(f"[{type(self).__name__}] input: expected a lattice.SparseTensor, got {type(x).__name__}")
        if x.feats.shape[1] != self.in_channels:
            raise ValueError(f"[{type(self).__name__}] input: expected {self.in_channels} feature channels, "
                             f"got {x.feats.shape[1]}")
        levels = [self.stem(x)]
        for stage in self.encoders:
            levels.append(stage(levels[-1]))
        y = levels[-1]
        for i in range(4):
            skip = levels[3 - i]
            dec = self.decoders[i]
            y = dec["fuse"](ops.cat([dec["upsample"](y, skip), skip]))
            levels.append(y)
        out = self.classifier(y)
        return (out, levels) if return_features else out


class MinkUNet42(MinkUNet):
    """SPVNAS's SemanticKITTI MinkUNet (= TorchSparse ``SparseResUNet42`` + a linear classifier):
    two k3 stem convs, two residual blocks per stage. See :class:`MinkUNet` for the arguments."""

    def __init__(self, in_channels: int = 4, num_classes: int = 19, *, cr: float = 1.0,
                 channels: Sequence[int] = CHANNELS) -> None:
        super().__init__(in_channels, num_classes, cr=cr, blocks=(2,) * 8, stem_kernels=(3, 3), channels=channels)


class MinkUNet18(MinkUNet):
    """MinkowskiEngine's MinkUNet18 layout: one k5 stem conv, two residual blocks per stage
    (``channels=`` for ME's 18A / 18B / 18D, see the module docstring). See :class:`MinkUNet`."""

    def __init__(self, in_channels: int = 4, num_classes: int = 19, *, cr: float = 1.0,
                 channels: Sequence[int] = CHANNELS) -> None:
        super().__init__(in_channels, num_classes, cr=cr, blocks=(2,) * 8, stem_kernels=(5,), channels=channels)


class MinkUNet34(MinkUNet):
    """MinkowskiEngine's MinkUNet34(C) layout: one k5 stem conv, encoder blocks 2, 3, 4, 6,
    decoder blocks 2, 2, 2, 2. See :class:`MinkUNet` for the arguments."""

    def __init__(self, in_channels: int = 4, num_classes: int = 19, *, cr: float = 1.0,
                 channels: Sequence[int] = CHANNELS) -> None:
        super().__init__(in_channels, num_classes, cr=cr, blocks=(2, 3, 4, 6, 2, 2, 2, 2), stem_kernels=(5,),
                         channels=channels)
