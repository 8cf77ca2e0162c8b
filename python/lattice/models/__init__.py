"""lattice.models: ready-made sparse backbones built from :mod:`lattice.nn`.

    import lattice
    model = lattice.models.MinkUNet18(in_channels=4, num_classes=19, cr=1.0)
    logits = model(lattice.SparseTensor(coords, feats))   # coords (N, 4) int32 (batch, x, y, z)

* :class:`MinkUNet18`, :class:`MinkUNet34`, :class:`MinkUNet42` (and the configurable
  :class:`MinkUNet`): per-voxel segmentation U-Nets (SemanticKITTI);
* :class:`SparseResNet21D`: TorchSparse's CenterPoint-style encoder (list of stage outputs);
* :class:`VoxelBackBone8x`: the SECOND / CenterPoint 3-D backbone with the BEV output.

Checkpoints of the matching TorchSparse / SPVNAS / MinkowskiEngine / spconv (OpenPCDet) networks
load through :mod:`lattice.convert`; docs/migrating.md lists the equivalences.
"""
from .blocks import ConvBlock, ResidualBlock, WindowConv3d, translate
from .minkunet import MinkUNet, MinkUNet18, MinkUNet34, MinkUNet42
from .resnet import SparseResNet, SparseResNet21D
from .voxel_backbone import VoxelBackBone8x, bev_scatter

__all__ = ["MinkUNet", "MinkUNet18", "MinkUNet34", "MinkUNet42", "SparseResNet", "SparseResNet21D",
           "VoxelBackBone8x", "bev_scatter", "ConvBlock", "ResidualBlock", "WindowConv3d", "translate"]
