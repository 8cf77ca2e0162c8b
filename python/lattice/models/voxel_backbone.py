"""VoxelBackBone8x: the SECOND / CenterPoint / PV-RCNN 3-D sparse backbone (OpenPCDet's
``VoxelBackBone8x``) with the height-compressed bird's-eye-view output (``HeightCompression``).

Layers (BatchNorm eps 1e-3, momentum 0.01, ReLU after every BN; spconv's paddings kept exactly,
through :class:`~lattice.models.blocks.WindowConv3d`):

=========  ===============================================  ===============
name       layers                                           output stride
=========  ===============================================  ===============
conv_input subm k3 C_in -> 16                                1
conv1      subm k3 16 -> 16                                  1
conv2      k3 s2 p1 16 -> 32, subm k3 32 x 2                 2
conv3      k3 s2 p1 32 -> 64, subm k3 64 x 2                 4
conv4      k3 s2 p(1, 1, 0) 64 -> 64, subm k3 64 x 2         8
conv_out   k(1, 1, 3) s(1, 1, 2) p0 64 -> 128                (8, 8, 16)
=========  ===============================================  ===============

Input convention (differs from OpenPCDet's ``(batch, z, y, x)``): coords ``(batch, x, y, z)`` int32
voxel indices inside ``spatial_shape = (X, Y, Z)`` (OpenPCDet's ``sparse_shape`` reversed:
KITTI ``(1408, 1600, 41)``), ``in_channels`` features (4: mean x, y, z, intensity). The kernel /
padding tuples above are in lattice's (x, y, z) order; spconv writes them (z, y, x).

``forward(x, spatial_shape, batch_size=None)`` returns a dict: ``"bev"`` (B, 128 * D, Y8, X8) float,
``c * D + d`` channel order and (y, x) spatial order, as OpenPCDet's ``spatial_features``
(``dense().view(N, C * D, H, W)``), built by a scatter without a dense-size limit; ``"encoded"`` the
conv_out SparseTensor; ``"features"`` the outputs of conv1..conv4; ``"shape"`` the conv_out grid.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import nn as lnn
from ..tensor import SparseTensor
from .blocks import ConvBlock, WindowConv3d

BN = {"eps": 1e-3, "momentum": 0.01}


def _subm(c_in: int, c_out: int) -> ConvBlock:
    return ConvBlock(lnn.SubmConv3d(c_in, c_out, 3), **BN)


def _down(c_in: int, c_out: int, kernel, stride, padding) -> ConvBlock:
    return ConvBlock(WindowConv3d(c_in, c_out, kernel, stride=stride, padding=padding), **BN)


def bev_scatter(x: SparseTensor, shape: Sequence[int], batch_size: Optional[int] = None) -> torch.Tensor:
    """The (B, C * Z, Y, X) bird's-eye-view grid of ``x`` (coords inside ``[0, shape)``): channel
    ``c * Z + z`` at ``[y, x]`` holds ``feats[row, c]``; empty cells are 0. Differentiable in the
    features; no element limit (the grid is ``B * C * X * Y * Z`` values of the feature dtype).

    Under :func:`lattice.export` it runs outside the graph (``lattice._export.outside_graph``): the
    exported VoxelBackBone8x returns the sparse ``encoded`` tensor and the BEV is rebuilt from it."""
    from .._export import outside_graph

    with outside_graph():
        return _bev_scatter(x, shape, batch_size)


def _bev_scatter(x: SparseTensor, shape: Sequence[int], batch_size: Optional[int]) -> torch.Tensor:
    X, Y, Z = (int(v) for v in shape)
    c = x.coords.long()
    b = batch_size if batch_size is not None else (
        len(x.batch_counts) if x.batch_counts is not None else (int(c[:, 0].max()) + 1 if len(x) else 0))
    lo = c[:, 1:].min(0).values if len(x) else None
    hi = c[:, 1:].max(0).values if len(x) else None
    if len(x) and (int(lo.min()) < 0 or int(hi[0]) >= X or int(hi[1]) >= Y or int(hi[2]) >= Z):
        raise ValueError(f"[bev_scatter] coords: expected x, y, z within [0, {(X, Y, Z)}), got range "
                         f"[{tuple(lo.tolist())}, {tuple(hi.tolist())}]")
    C = x.feats.shape[1]
    grid = x.feats.new_zeros((b, Z, Y, X, C))
    grid = grid.index_put((c[:, 0], c[:, 3], c[:, 2], c[:, 1]), x.feats)
    return grid.permute(0, 4, 1, 2, 3).reshape(b, C * Z, Y, X)


class VoxelBackBone8x(torch.nn.Module):
    """SECOND's 3-D backbone and height compression (see the module docstring)."""

    def __init__(self, in_channels: int = 4) -> None:
        super().__init__()
        self.in_channels = int(in_channels)
        self.conv_input = _subm(in_channels, 16)
        self.conv1 = torch.nn.Sequential(_subm(16, 16))
        self.conv2 = torch.nn.Sequential(_down(16, 32, 3, 2, 1), _subm(32, 32), _subm(32, 32))
        self.conv3 = torch.nn.Sequential(_down(32, 64, 3, 2, 1), _subm(64, 64), _subm(64, 64))
        self.conv4 = torch.nn.Sequential(_down(64, 64, 3, 2, (1, 1, 0)), _subm(64, 64), _subm(64, 64))
        self.conv_out = _down(64, 128, (1, 1, 3), (1, 1, 2), 0)
        self.num_bev_features = 128 * 2  # for the KITTI / nuScenes z grids (41 -> 2)

    @staticmethod
    def _stage(stage: torch.nn.Sequential, x: SparseTensor, shape: tuple) -> tuple[SparseTensor, tuple]:
        first = stage[0] if isinstance(stage, torch.nn.Sequential) else stage
        if isinstance(first.conv, WindowConv3d):
            y = first.relu(first.bn(first.conv(x, shape)))
            shape = first.conv.output_shape(shape)
        else:
            y = first(x)
        if isinstance(stage, torch.nn.Sequential):
            for layer in list(stage)[1:]:
                y = layer(y)
        return y, shape

    def forward(self, x: SparseTensor, spatial_shape: Sequence[int], batch_size: Optional[int] = None) -> dict:  # type: ignore[override]
        if not isinstance(x, SparseTensor):
            raise TypeError(f"[VoxelBackBone8x] input: expected a lattice.SparseTensor, got {type(x).__name__}")
        shape = tuple(int(v) for v in spatial_shape)
        if len(shape) != 3:
            raise ValueError(f"[VoxelBackBone8x] spatial_shape: expected (X, Y, Z), got {tuple(spatial_shape)}")
        y = self.conv_input(x)
        feats = []
        for stage in (self.conv1, self.conv2, self.conv3, self.conv4):
            y, shape = self._stage(stage, y, shape)
            feats.append(y)
        out, shape = self._stage(self.conv_out, y, shape)
        return {"bev": bev_scatter(out, shape, batch_size), "encoded": out, "features": feats, "shape": shape}
