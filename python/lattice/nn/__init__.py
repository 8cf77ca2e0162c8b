"""lattice.nn: torch.nn.Module versions of the ops, acting on lattice.SparseTensor."""
from .conv import Conv3d, ConvTranspose3d, GenerativeConvTranspose3d, SubmConv3d
from .features import (
    GELU,
    BatchNorm,
    Dropout,
    LayerNorm,
    LeakyReLU,
    Linear,
    ReLU,
    RMSNorm,
    SiLU,
    Sigmoid,
    Softplus,
    SyncBatchNorm,
    SyncBatchNorm1d,
    Tanh,
    convert_sync_batchnorm,
)
from .pool import (
    AvgPool3d,
    GlobalAvgPool,
    GlobalMaxPool,
    GlobalSumPool,
    MaxPool3d,
    PoolTranspose3d,
    SumPool3d,
    TrilinearUpsample3d,
)

__all__ = ["Conv3d", "SubmConv3d", "ConvTranspose3d", "GenerativeConvTranspose3d", "BatchNorm", "ReLU", "Linear"]
__all__ += ["MaxPool3d", "AvgPool3d", "SumPool3d", "GlobalAvgPool", "GlobalMaxPool", "GlobalSumPool", "PoolTranspose3d",
            "TrilinearUpsample3d"]
__all__ += ["SyncBatchNorm", "SyncBatchNorm1d", "convert_sync_batchnorm", "LayerNorm", "RMSNorm", "LeakyReLU", "GELU", "SiLU", "Sigmoid",
            "Tanh", "Softplus", "Dropout"]
from .quantized import (  # packed int4/int8 inference modules (issue 7)
    QuantizedConv3d,
    QuantizedConvTranspose3d,
    QuantizedGenerativeConvTranspose3d,
    QuantizedLinear,
    QuantizedSubmConv3d,
    quantize,
    weight_bytes,
    weight_bytes_report,
)

__all__ += ["QuantizedLinear", "QuantizedConv3d", "QuantizedSubmConv3d", "QuantizedConvTranspose3d",
            "QuantizedGenerativeConvTranspose3d", "quantize", "weight_bytes", "weight_bytes_report"]
