"""lattice.ops: the functional API (SparseTensors and torch tensors in, the same kinds out)."""
from .conv import conv3d, conv_transpose3d, generative_conv_transpose3d, subm_conv3d
from .features import cat
from .quantize import sparse_quantize

__all__ = [
    "conv3d",
    "subm_conv3d",
    "conv_transpose3d",
    "generative_conv_transpose3d",
    "sparse_quantize",
    "cat",
]
