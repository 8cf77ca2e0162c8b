"""lattice: sparse voxel tensors for point clouds, with explainable execution routes.

    import torch, lattice
    x = lattice.SparseTensor(coords, feats)            # coords (N, 4) int32 (b, x, y, z), feats (N, C)
    y = lattice.ops.subm_conv3d(x, w, kernel_size=3)    # w (C_out, 3, 3, 3, C_in)
    print(lattice.explain("subm_conv3d", x, w, kernel_size=3))
"""
from . import _host_memory

_host_memory.tune()  # large feature matrices reuse the heap instead of fresh mmaps (LATTICE_HOST_MALLOC=default: off)
from . import nn, ops
from . import io  # point-cloud file readers: lattice.io.read_kitti / read_las / read_pcd / read_ply / read
from ._core import UnsupportedError
from .explain import backend_info, device_caps, explain, get_num_threads, set_num_threads
from .tensor import SparseTensor

__version__ = "0.1.0"

__all__ = ["SparseTensor", "ops", "nn", "explain", "backend_info", "device_caps", "get_num_threads", "set_num_threads", "UnsupportedError", "__version__"]
__all__ += ["io"]
from .quantize import QuantizedWeight, dequantize_weight, quantize_weight  # packed int4/int8 weights (issue 7)
__all__ += ["QuantizedWeight", "quantize_weight", "dequantize_weight"]
from . import convert, data, models  # backbones, data pipeline, checkpoint import (issue 13)
__all__ += ["models", "data", "convert"]
# deployment: graph.json + weights.safetensors (issue 14). The module is lattice._export so that the
# name lattice.export is only the function; "lattice.export" stays importable as a module name
# (importlib.import_module("lattice.export"), from lattice.export import read_safetensors) for
# code written before the rename.
from . import _export
from ._export import ExportError, export, load_exported
import sys as _sys
_sys.modules[__name__ + ".export"] = _export
del _sys
__all__ += ["export", "load_exported", "ExportError"]
from . import cuda  # lattice's CUDA allocator: memory_stats / host_syncs / empty_cache (issue 12)
__all__ += ["cuda"]
from .tuning import clear_tuning, load_tuning, save_tuning, tune, tuning_entries  # measured route choices (issue 19)
__all__ += ["tune", "load_tuning", "save_tuning", "clear_tuning", "tuning_entries"]
from . import _compile  # torch.compile (torch >= 2): lattice's core calls stay out of dynamo's graphs (last:
_compile.install()      # it wraps the ops every lattice module imported)
