"""Pooling modules (no parameters): local, global, transposed pooling and trilinear upsampling."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import ops
from .._core import as_triple
from ..tensor import SparseTensor

IntOr3 = Union[int, Sequence[int]]


def _at_least(value: IntOr3, what: str, op: str, minimum: int) -> tuple[int, int, int]:
    v = as_triple(value, what, op)
    if min(v) < minimum:
        raise ValueError(f"[{op}] {what}: expected values >= {minimum}, got {v}")
    return v


class _LocalPool(torch.nn.Module):
    _op = "pool3d"
    _mode = "max"

    def __init__(self, kernel_size: IntOr3, stride: Optional[IntOr3] = None, padding: IntOr3 = 0,
                 dilation: IntOr3 = 1, expand: bool = False) -> None:
        super().__init__()
        name = type(self).__name__
        self.kernel_size = _at_least(kernel_size, "kernel_size", name, 1)
        self.stride = self.kernel_size if stride is None else _at_least(stride, "stride", name, 1)
        self.padding = _at_least(padding, "padding", name, 0)
        self.dilation = _at_least(dilation, "dilation", name, 1)
        self.expand = bool(expand)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        return getattr(ops, self._op)(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                      coordinates=coordinates, expand=self.expand)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, dilation={self.dilation}"


class MaxPool3d(_LocalPool):
    """``lattice.ops.max_pool3d`` as a module; ``forward(x, coordinates=None)``. Stride defaults
    to the kernel size."""

    _op = "max_pool3d"


class AvgPool3d(_LocalPool):
    """``lattice.ops.avg_pool3d`` (mean over the rows present in each window) as a module."""

    _op = "avg_pool3d"


class SumPool3d(_LocalPool):
    """``lattice.ops.sum_pool3d`` as a module."""

    _op = "sum_pool3d"


class _GlobalPool(torch.nn.Module):
    _op = "global_avg_pool"

    def forward(self, x: SparseTensor) -> torch.Tensor:
        return getattr(ops, self._op)(x)


class GlobalAvgPool(_GlobalPool):
    """Mean of each batch's rows -> dense ``(B, C)`` tensor (``lattice.ops.global_avg_pool``)."""

    _op = "global_avg_pool"


class GlobalMaxPool(_GlobalPool):
    """Per-channel max of each batch's rows -> dense ``(B, C)`` (``lattice.ops.global_max_pool``)."""

    _op = "global_max_pool"


class GlobalSumPool(_GlobalPool):
    """Sum of each batch's rows -> dense ``(B, C)`` tensor (``lattice.ops.global_sum_pool``)."""

    _op = "global_sum_pool"


class PoolTranspose3d(torch.nn.Module):
    """``lattice.ops.pool_transpose3d`` as a module; ``forward(x, coordinates=None)`` generates the
    fine rows or lands on a target (e.g. the skip connection)."""

    def __init__(self, kernel_size: IntOr3, stride: Optional[IntOr3] = None, padding: IntOr3 = 0,
                 dilation: IntOr3 = 1) -> None:
        super().__init__()
        self.kernel_size = _at_least(kernel_size, "kernel_size", "PoolTranspose3d", 1)
        self.stride = self.kernel_size if stride is None else _at_least(stride, "stride", "PoolTranspose3d", 1)
        self.padding = _at_least(padding, "padding", "PoolTranspose3d", 0)
        self.dilation = _at_least(dilation, "dilation", "PoolTranspose3d", 1)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        return ops.pool_transpose3d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                    coordinates=coordinates)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class TrilinearUpsample3d(torch.nn.Module):
    """``lattice.ops.trilinear_upsample3d`` as a module; ``forward(x, coordinates=None)``.

    ``stride`` is the upsampling factor used when no target is given (default 2); with a target
    the factor is the ratio of the tensor strides.
    """

    def __init__(self, stride: IntOr3 = 2) -> None:
        super().__init__()
        self.stride = _at_least(stride, "stride", "TrilinearUpsample3d", 1)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        if coordinates is not None:
            return ops.trilinear_upsample3d(x, coordinates=coordinates)
        return ops.trilinear_upsample3d(x, self.stride)

    def extra_repr(self) -> str:
        return f"stride={self.stride}"
