"""lattice.ops: the functional API (SparseTensors and torch tensors in, the same kinds out)."""
from .conv import conv3d, conv_transpose3d, generative_conv_transpose3d, subm_conv3d
from .features import (
    batch_norm,
    cat,
    dropout,
    gelu,
    layer_norm,
    leaky_relu,
    linear,
    relu,
    rms_norm,
    sigmoid,
    silu,
    softplus,
    tanh,
)
from .fused_bn import fused_batch_norm
from .algebra import sparse_add, sparse_cat_aligned, sparse_maximum, sparse_minimum, sparse_mul, sparse_sub
from .coords import (
    contains_coords,
    crop,
    dense,
    downsample_coords,
    from_dense,
    intersection_coords,
    lookup_coords,
    morton_codes,
    morton_order,
    prune,
    sparse_collate,
    sparse_from_coordinates,
    union_coords,
)
from .quantize import sparse_quantize
from .point_voxel import PointVoxelMap, build_point_voxel_map, devoxelize, voxelize
from .pool import (
    avg_pool3d,
    global_avg_pool,
    global_max_pool,
    global_sum_pool,
    max_pool3d,
    pool3d,
    pool_transpose3d,
    sum_pool3d,
    trilinear_upsample3d,
)

__all__ = [
    "conv3d",
    "subm_conv3d",
    "conv_transpose3d",
    "generative_conv_transpose3d",
    "sparse_quantize",
    "voxelize",
    "build_point_voxel_map",
    "devoxelize",
    "PointVoxelMap",
    "cat",
    "pool3d",
    "sum_pool3d",
    "avg_pool3d",
    "max_pool3d",
    "global_sum_pool",
    "global_avg_pool",
    "global_max_pool",
    "pool_transpose3d",
    "trilinear_upsample3d",
]
__all__ += ["linear", "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "batch_norm", "layer_norm",
            "rms_norm", "dropout"]
__all__ += ["fused_batch_norm"]
__all__ += ["sparse_add", "sparse_sub", "sparse_mul", "sparse_maximum", "sparse_minimum", "sparse_cat_aligned"]
__all__ += ["union_coords", "intersection_coords", "lookup_coords", "contains_coords", "downsample_coords", "morton_codes",
            "morton_order", "prune", "crop", "sparse_collate", "sparse_from_coordinates", "dense", "from_dense"]
