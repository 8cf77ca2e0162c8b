"""lattice.nn: torch.nn.Module versions of the ops, acting on lattice.SparseTensor."""
from .conv import Conv3d, ConvTranspose3d, GenerativeConvTranspose3d, SubmConv3d
from .features import BatchNorm, Linear, ReLU

__all__ = ["Conv3d", "SubmConv3d", "ConvTranspose3d", "GenerativeConvTranspose3d", "BatchNorm", "ReLU", "Linear"]
