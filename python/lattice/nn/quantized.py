"""Inference modules with packed int4 / int8 weights (SEMANTICS.md "Packed affine quantization").

``QuantizedConv3d`` / ``QuantizedSubmConv3d`` / ``QuantizedConvTranspose3d`` /
``QuantizedGenerativeConvTranspose3d`` / ``QuantizedLinear`` mirror their float modules, holding
the weight as buffers ``packed`` (int32 words), ``scales`` and ``biases`` (and the float bias as a
buffer ``bias``), so ``state_dict`` / ``.to(device, dtype)`` work (``.half()`` converts scales,
biases and bias; the packed words never change). Build them with ``from_float(module, bits,
group_size)``, or convert a whole model with :func:`quantize`. Inference only: backward through
a packed weight raises ``RuntimeError`` (dequantize for training).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .. import ops
from ..quantize import QuantizedWeight, quantize_weight
from ..tensor import SparseTensor
from . import conv as _conv
from .features import Linear

__all__ = ["QuantizedLinear", "QuantizedConv3d", "QuantizedSubmConv3d", "QuantizedConvTranspose3d",
           "QuantizedGenerativeConvTranspose3d", "quantize", "weight_bytes", "weight_bytes_report"]


class _QuantizedBase(torch.nn.Module):
    """Holds a QuantizedWeight as buffers; ``weight`` rebuilds (and validates) it per call."""

    _float_type: type = torch.nn.Module
    _layout = "dense_5d"

    def __init__(self, q: QuantizedWeight, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        if not isinstance(q, QuantizedWeight):
            raise TypeError(f"[{type(self).__name__}] weight: expected a lattice.QuantizedWeight, got {type(q).__name__}")
        if q.layout != self._layout:
            raise ValueError(f"[{type(self).__name__}] weight: expected layout {self._layout!r}, got {q.layout!r}")
        self.register_buffer("packed", q.packed)
        self.register_buffer("scales", q.scales)
        self.register_buffer("biases", q.biases)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.bits = q.bits
        self.group_size = q.group_size
        self.weight_shape = tuple(q.shape)

    @property
    def weight(self) -> QuantizedWeight:
        return QuantizedWeight(self.packed, self.scales, self.biases, self.bits, self.group_size, self._layout,
                               self.weight_shape)

    def _bias_for(self, x: SparseTensor) -> Optional[torch.Tensor]:
        b = self.bias
        if b is None or b.dtype == x.feats.dtype:
            return b
        return b.to(x.feats.dtype)

    def extra_repr(self) -> str:
        return f"int{self.bits}, group_size={self.group_size}, weight_shape={self.weight_shape}, bias={self.bias is not None}"


class _QuantizedConvBase(_QuantizedBase):
    _geometry: tuple[str, ...] = ()

    @classmethod
    def from_float(cls, module: torch.nn.Module, bits: int = 4, group_size: Optional[int] = None) -> "_QuantizedConvBase":
        """A quantized copy of ``module`` (its weight quantized with ``quantize_weight``; geometry and
        bias copied). ``module`` is not modified."""
        if not isinstance(module, cls._float_type):
            raise TypeError(f"[{cls.__name__}.from_float] module: expected a lattice.nn.{cls._float_type.__name__}, "
                            f"got {type(module).__name__}")
        q = quantize_weight(module.weight.detach(), bits=bits, group_size=group_size, layout="dense_5d")
        dev = module.weight.device
        q = QuantizedWeight(q.packed.to(dev), q.scales.to(dev), q.biases.to(dev), q.bits, q.group_size, q.layout, q.shape)
        out = cls(q, module.bias, **{k: getattr(module, k) for k in cls._geometry})
        return out

    def _init_geometry(self, **geometry: Any) -> None:
        self.in_channels = self.weight_shape[4]
        self.out_channels = self.weight_shape[0]
        self.kernel_size = tuple(self.weight_shape[1:4])
        for k, v in geometry.items():
            setattr(self, k, v)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " + super().extra_repr()


class QuantizedConv3d(_QuantizedConvBase):
    """``lattice.nn.Conv3d`` with a packed weight; ``forward(x, coordinates=None)``."""

    _float_type = _conv.Conv3d
    _geometry = ("stride", "padding", "dilation", "expand")

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, expand: bool = False) -> None:
        super().__init__(weight, bias)
        self._init_geometry(stride=stride, padding=padding, dilation=dilation, expand=bool(expand))

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        return ops.conv3d(x, self.weight, self._bias_for(x), stride=self.stride, padding=self.padding,
                          dilation=self.dilation, coordinates=coordinates, expand=self.expand)


class QuantizedSubmConv3d(_QuantizedConvBase):
    """``lattice.nn.SubmConv3d`` with a packed weight."""

    _float_type = _conv.SubmConv3d
    _geometry = ("dilation",)

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None, dilation: Any = 1) -> None:
        super().__init__(weight, bias)
        self._init_geometry(dilation=dilation)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return ops.subm_conv3d(x, self.weight, self._bias_for(x), dilation=self.dilation)


class QuantizedConvTranspose3d(_QuantizedConvBase):
    """``lattice.nn.ConvTranspose3d`` with a packed weight; ``forward(x, coordinates=None)``."""

    _float_type = _conv.ConvTranspose3d
    _geometry = ("stride", "padding", "dilation")

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1) -> None:
        super().__init__(weight, bias)
        self._init_geometry(stride=stride, padding=padding, dilation=dilation)

    def forward(self, x: SparseTensor, coordinates: Optional[SparseTensor] = None) -> SparseTensor:
        return ops.conv_transpose3d(x, self.weight, self._bias_for(x), stride=self.stride, padding=self.padding,
                                    dilation=self.dilation, coordinates=coordinates)


class QuantizedGenerativeConvTranspose3d(_QuantizedConvBase):
    """``lattice.nn.GenerativeConvTranspose3d`` with a packed weight."""

    _float_type = _conv.GenerativeConvTranspose3d
    _geometry = ("stride", "dilation")

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None, stride: Any = 1,
                 dilation: Any = 1) -> None:
        super().__init__(weight, bias)
        self._init_geometry(stride=stride, dilation=dilation)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return ops.generative_conv_transpose3d(x, self.weight, self._bias_for(x), stride=self.stride,
                                               dilation=self.dilation)


class QuantizedLinear(_QuantizedBase):
    """``lattice.nn.Linear`` with a packed ``linear`` weight (C_out, C_in)."""

    _layout = "linear"

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None) -> None:
        super().__init__(weight, bias)
        self.out_features, self.in_features = self.weight_shape

    @classmethod
    def from_float(cls, module: torch.nn.Module, bits: int = 4, group_size: Optional[int] = None) -> "QuantizedLinear":
        """A quantized copy of a ``lattice.nn.Linear`` (or ``torch.nn.Linear``: the forward then
        takes a SparseTensor)."""
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"[QuantizedLinear.from_float] module: expected a lattice.nn.Linear, got {type(module).__name__}")
        q = quantize_weight(module.weight.detach(), bits=bits, group_size=group_size, layout="linear")
        dev = module.weight.device
        q = QuantizedWeight(q.packed.to(dev), q.scales.to(dev), q.biases.to(dev), q.bits, q.group_size, q.layout, q.shape)
        return cls(q, module.bias)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return ops.linear(x, self.weight, self._bias_for(x))


# float module type -> quantized module type (exact types: subclasses of a float module may
# change its forward, so they are left alone)
_CONVERSIONS: dict[type, type] = {
    _conv.Conv3d: QuantizedConv3d,
    _conv.SubmConv3d: QuantizedSubmConv3d,
    _conv.ConvTranspose3d: QuantizedConvTranspose3d,
    _conv.GenerativeConvTranspose3d: QuantizedGenerativeConvTranspose3d,
    Linear: QuantizedLinear,
}


def quantize(model: torch.nn.Module, bits: int = 4, group_size: Optional[int] = None) -> torch.nn.Module:
    """Replaces, in place, every ``lattice.nn`` Conv3d / SubmConv3d / ConvTranspose3d /
    GenerativeConvTranspose3d / Linear of ``model`` (the model itself included only through its
    children) by its quantized module (``from_float(module, bits, group_size)``); returns ``model``.

    ``group_size`` None picks 64 when a layer's C_in >= 64, else 32 (per layer); C_in is
    zero-padded to the group. Other modules (norms, activations, pools) stay float. The model is
    for inference afterwards (backward through a packed weight raises).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"[quantize] model: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(bits, bool) or bits not in (4, 8):
        raise ValueError(f"[quantize] bits: expected 4 or 8, got {bits!r}")
    if group_size is not None and (isinstance(group_size, bool) or group_size not in (32, 64, 128)):
        raise ValueError(f"[quantize] group_size: expected 32, 64, 128 or None, got {group_size!r}")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            target = _CONVERSIONS.get(type(child))
            if target is not None:
                setattr(parent, name, target.from_float(child, bits=bits, group_size=group_size))
    return model


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def weight_bytes_report(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of a model's weights: ``layers`` (conv / linear weights: float parameters, or packed
    words + scales + biases of quantized modules), ``other`` (every other parameter and buffer:
    biases, norms and their running statistics) and ``total``. Tensors shared by several modules
    are counted once."""
    seen: set[int] = set()
    layers = other = 0
    for m in model.modules():
        if isinstance(m, _QuantizedBase):
            for t in (m.packed, m.scales, m.biases):
                if id(t) not in seen:
                    seen.add(id(t))
                    layers += _tensor_bytes(t)
        elif isinstance(m, (_conv._ConvBase, torch.nn.Linear)):
            t = m.weight
            if id(t) not in seen:
                seen.add(id(t))
                layers += _tensor_bytes(t)
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            other += _tensor_bytes(t)
    return {"layers": layers, "other": other, "total": layers + other}


def weight_bytes(model: torch.nn.Module) -> int:
    """Total bytes of a model's parameters and buffers (packed weights at their packed size)."""
    return weight_bytes_report(model)["total"]
