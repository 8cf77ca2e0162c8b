"""Export a trained lattice network to a directory that runs without Python (docs/deploy.md).

    lattice.export(model.eval(), example_input, "out/net", metadata={"voxelize": {...}})
    net = lattice.load_exported("out/net")      # the same graph, run with lattice's Python ops
    logits = net(x)                              # C++: lattice::Runtime / the lattice-run tool

The directory holds ``graph.json`` (schema ``lattice.graph`` version 1; 2 when the graph has
packed weights or pooling; 3 when it has ``window_conv3d`` nodes: values, nodes, their op,
attributes and which values they read) and
``weights.safetensors`` (float32; packed int8 / int4 words as int32 with float32 / float16 scales;
little endian).

How the graph is obtained: tracing. The model runs once on ``example_input`` with

* every lattice.nn convolution (``SubmConv3d``, ``Conv3d``, ``ConvTranspose3d``,
  ``GenerativeConvTranspose3d``, and ``lattice.models.WindowConv3d``: a ``window_conv3d`` node,
  graph version 3), packed module (``Quantized*``, ``QuantizedLinear``) and local
  pooling module (``MaxPool3d``, ``AvgPool3d``, ``SumPool3d``) wrapped: the call is recorded as
  one node with the module's geometry and weights (its internals are not traced);
* a ``torch.overrides.TorchFunctionMode`` active around everything else: every torch function
  that reads a traced feature matrix is either one of the supported feature functions (below),
  which becomes a node, or the export fails with ``[export] <module path>: ...`` naming the
  function and the innermost module that called it.

Supported feature functions (what lattice.nn's BatchNorm, ReLU, LeakyReLU, GELU, SiLU, Sigmoid, Tanh,
Softplus, Linear, LayerNorm, Dropout and ``lattice.ops.cat`` call, and the same torch modules /
functions applied to ``x.feats`` by hand): ``F.batch_norm`` (eval only), ``F.relu``,
``F.leaky_relu``, ``F.gelu``, ``F.silu``, ``torch.sigmoid``, ``torch.tanh``, ``F.softplus``,
``F.linear``, ``F.layer_norm`` (over the channels), ``F.dropout`` (eval or p = 0: the identity),
``torch.cat`` along the channels, and ``+``, ``-``, ``*`` of two feature matrices on the same rows
(residual adds).

Limits of tracing (documented in docs/deploy.md): the graph is the path the example took — Python
control flow that depends on the data is frozen; the input is one SparseTensor; the outputs are
the SparseTensors found in what ``forward`` returns (tuples, lists and dicts are flattened, other
values are ignored); functional convolutions and pooling (``lattice.ops.conv3d`` called without
a module), global / transposed pooling, trilinear upsampling, point/voxel ops
inside the model and coordinate edits (new SparseTensors built from traced features) are not
exported and fail with the clear error. Code inside :func:`outside_graph` is not traced (its
results are not graph outputs): ``lattice.models.bev_scatter`` runs there, so VoxelBackBone8x
exports its sparse outputs and the BEV is rebuilt from the first one (docs/deploy.md).

``weights="int8" | "int4"`` packs every convolution / Linear weight after the folding below
(``quantize_weight``, the rule of ``lattice.nn.quantize``); see :func:`export`.

BatchNorm is folded into the convolution or Linear before it when that layer's output feeds only
the BatchNorm (exact up to float32 rounding: ``W' = W * s``, ``b' = (b - mean) * s + beta``,
``s = gamma / sqrt(var + eps)`` computed in float64, stored as float32). Others become a
``scale_shift`` node.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import nn as lnn
from . import ops
from .quantize import QuantizedWeight, quantize_weight
from .tensor import SparseTensor

FORMAT = "lattice.graph"
VERSION = 3  # the newest schema written; each graph is written as the oldest version that has its ops
VERSIONS = (1, 2, 3)
WEIGHTS = ("float32", "int8", "int4")


def _quantized_attr(q: QuantizedWeight) -> dict[str, Any]:
    """attrs["quantized"] of a node with a packed weight (graph version 2)."""
    return {"bits": int(q.bits), "group_size": int(q.group_size), "layout": q.layout, "shape": [int(d) for d in q.shape]}

__all__ = ["export", "load_exported", "ExportError", "ExportedModel", "read_safetensors", "write_safetensors",
           "outside_graph",
           "point_features", "voxelize_points", "demo_voxelize_spec", "FORMAT", "VERSION", "VERSIONS", "WEIGHTS"]


class ExportError(ValueError):
    """A model (part) that lattice.export cannot write; the message names the module and function."""


_ACTIVE: list["_Tracer"] = []  # the tracers of the export() calls running now (innermost last)


@contextlib.contextmanager
def outside_graph():
    """Code in ``with outside_graph():`` is not traced by a running :func:`export`: the torch
    functions it calls on traced features are neither recorded nor refused, and what it returns
    is not part of the graph (a dense head such as ``lattice.models.bev_scatter``, computed from
    a graph output after the runtime). Outside an export it does nothing."""
    if not _ACTIVE:
        yield
        return
    tracer = _ACTIVE[-1]
    tracer.leaf += 1
    try:
        yield
    finally:
        tracer.leaf -= 1


# ------------------------------------------------------------------------------------------------
# safetensors (https://huggingface.co/docs/safetensors): u64 LE header length, JSON header, buffers
# ------------------------------------------------------------------------------------------------

_ST_DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int8"): "I8",
              np.dtype("int32"): "I32", np.dtype("int64"): "I64", np.dtype("uint8"): "U8",
              np.dtype("float16"): "F16"}
_ST_NUMPY = {v: k for k, v in _ST_DTYPES.items()}


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: Optional[dict[str, str]] = None) -> None:
    """Writes ``tensors`` (name -> C-contiguous numpy array) in the safetensors layout, names sorted,
    buffers 8-byte aligned (the header is padded with spaces, as the reference writer does)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in _ST_DTYPES:
            raise ExportError(f"[export] weights.{name}: expected one of {sorted(str(d) for d in _ST_DTYPES)}, got {a.dtype}")
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        raw = a.tobytes()
        header[name] = {"dtype": _ST_DTYPES[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads a safetensors file written by :func:`write_safetensors` (or any writer)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"[load_exported] {path}: expected a safetensors file (>= 8 bytes), got {len(data)} bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"[load_exported] {path}: expected a header of {n} bytes, got a file of {len(data)} bytes")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        dt = _ST_NUMPY[info["dtype"]].newbyteorder("<")
        a = np.frombuffer(data[base + lo:base + hi], dtype=dt).reshape(info["shape"])
        out[name] = a.astype(dt.newbyteorder("="))
    return out


# ------------------------------------------------------------------------------------------------
# Tracing
# ------------------------------------------------------------------------------------------------

_CONV_MODULES = (lnn.SubmConv3d, lnn.Conv3d, lnn.ConvTranspose3d, lnn.GenerativeConvTranspose3d)
# packed int4 / int8 modules (lattice.nn.quantized): recorded as the same ops with packed weights
_QUANT_MODULES = (lnn.QuantizedSubmConv3d, lnn.QuantizedConv3d, lnn.QuantizedConvTranspose3d,
                  lnn.QuantizedGenerativeConvTranspose3d, lnn.QuantizedLinear)
# local pooling (graph version 2): max / avg / sum over the forward relation or onto a target
_POOL_MODULES = (lnn.MaxPool3d, lnn.AvgPool3d, lnn.SumPool3d)
_LEAF_MODULES = _CONV_MODULES + _QUANT_MODULES + _POOL_MODULES
_MODULE_OPS = {lnn.SubmConv3d: "subm_conv3d", lnn.Conv3d: "conv3d", lnn.ConvTranspose3d: "conv_transpose3d",
               lnn.GenerativeConvTranspose3d: "generative_conv_transpose3d",
               lnn.QuantizedSubmConv3d: "subm_conv3d", lnn.QuantizedConv3d: "conv3d",
               lnn.QuantizedConvTranspose3d: "conv_transpose3d",
               lnn.QuantizedGenerativeConvTranspose3d: "generative_conv_transpose3d", lnn.QuantizedLinear: "linear",
               lnn.MaxPool3d: "max_pool3d", lnn.AvgPool3d: "avg_pool3d", lnn.SumPool3d: "sum_pool3d"}
_LEAF_NAMES = ("SubmConv3d, Conv3d, ConvTranspose3d, GenerativeConvTranspose3d (or their Quantized* modules), "
               "QuantizedLinear, MaxPool3d, AvgPool3d, SumPool3d, lattice.models.WindowConv3d")


@dataclass
class _Node:
    name: str
    op: str
    inputs: list[str]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)


def _fname(func: Any) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    mod = getattr(func, "__module__", None)
    if name == "__get__" and hasattr(func, "__self__"):
        return f"Tensor.{getattr(func.__self__, '__name__', '?')} (attribute)"
    if mod and mod.startswith("torch.nn.functional"):
        return f"torch.nn.functional.{name}"
    if mod is None or mod == "torch._C._TensorBase" or "Tensor" in repr(func):
        return f"Tensor.{name}" if not name.startswith("torch") else name
    return f"{mod}.{name}"


def _flatten(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flatten(o)]
    if isinstance(obj, dict):
        return [t for k in obj for t in _flatten(obj[k])]
    return [obj]


class _Tracer(TorchFunctionMode):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.values: dict[int, str] = {}      # id(feats tensor) -> value name
        self.keep: list[torch.Tensor] = []     # keeps traced tensors alive (ids stay unique)
        self.value_coords: dict[str, str] = {}  # value -> coordinate set name
        self.value_channels: dict[str, int] = {}
        self.coord_keys: dict[int, str] = {}  # python coordinate key -> coordinate set name
        self.coord_strides: dict[str, list[int]] = {}
        self.nodes: list[_Node] = []
        self.stack: list[tuple[str, str]] = []  # (module path, type name)
        self.leaf = 0
        self.names: dict[int, str] = {id(m): n for n, m in model.named_modules()}

    # -- bookkeeping --------------------------------------------------------------------------------
    def place(self) -> str:
        """The innermost module being run: ``path (Type)``, ``model (Type)`` for the root."""
        if not self.stack:
            return "model"
        path, kind = self.stack[-1]
        return f"{path or 'model'} ({kind})" if kind else (path or "model")

    def fail(self, what: str) -> None:
        raise ExportError(f"[export] {self.place()}: {what}")

    def coords_of(self, x: SparseTensor) -> str:
        if x.key not in self.coord_keys:
            name = f"c{len(self.coord_strides)}"
            self.coord_keys[x.key] = name
            self.coord_strides[name] = list(x.stride)
        return self.coord_keys[x.key]

    def new_value(self, t: torch.Tensor, coords: str) -> str:
        name = f"v{len(self.value_coords)}"
        self.values[id(t)] = name
        self.keep.append(t)
        self.value_coords[name] = coords
        self.value_channels[name] = int(t.shape[1]) if t.dim() == 2 else -1
        return name

    def value_of_sparse(self, x: Any, what: str) -> str:
        if not isinstance(x, SparseTensor):
            self.fail(f"{what}: expected a lattice.SparseTensor, got {type(x).__name__}")
        v = self.values.get(id(x.feats))
        if v is None:
            self.fail(f"{what}: expected features computed by exportable ops from the model input, got a tensor "
                      f"produced by something the exporter did not see (a functional lattice op, a pooling or "
                      f"point/voxel op, or a torch function on non-traced data; see lattice.export's docstring)")
        expected = self.value_coords[v]
        if self.coords_of(x) != expected:
            self.fail(f"{what}: expected the coordinates its features were computed on ({expected}), got another "
                      f"coordinate set (coordinates edited outside the exportable ops, e.g. a new SparseTensor "
                      f"built from traced features)")
        return v

    # -- modules ------------------------------------------------------------------------------------
    def wrap(self, module: torch.nn.Module) -> Callable[..., Any]:
        original = module.forward
        path = self.names.get(id(module), "")
        conv = isinstance(module, _LEAF_MODULES)

        def forward(*args: Any, **kwargs: Any) -> Any:
            self.stack.append((path, type(module).__name__))
            try:
                if conv and self.leaf == 0:
                    return self.conv(module, path, original, args, kwargs)
                return original(*args, **kwargs)
            finally:
                self.stack.pop()

        return forward

    def conv(self, m: torch.nn.Module, path: str, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        from .models.blocks import WindowConv3d

        kind = type(m).__name__
        if type(m) is WindowConv3d:
            return self.window_conv(m, path, original, args, kwargs)
        if type(m) not in _LEAF_MODULES:
            self.fail(f"{kind}: expected one of {_LEAF_NAMES}, got a subclass")
        if len(args) < 1:
            self.fail(f"{kind} input: expected a SparseTensor argument, got none")
        x = args[0]
        target = args[1] if len(args) > 1 else kwargs.get("coordinates")
        extra = [k for k in kwargs if k != "coordinates"]
        if extra or len(args) > 2:
            self.fail(f"{kind} arguments: expected (x) or (x, coordinates), got extra {extra or len(args)}")
        inputs = [self.value_of_sparse(x, f"{kind} input")]
        if target is not None:
            inputs.append(self.value_of_sparse(target, f"{kind} coordinates"))
        self.leaf += 1
        try:
            y = original(*args, **kwargs)
        finally:
            self.leaf -= 1
        op = _MODULE_OPS[type(m)]
        if isinstance(m, _QUANT_MODULES):
            attrs, params = self.quantized_attrs(m, op, kind)
        elif isinstance(m, _POOL_MODULES):
            attrs = {"kernel_size": list(m.kernel_size), "stride": list(m.stride), "padding": list(m.padding),
                     "dilation": list(m.dilation), "expand": bool(m.expand)}
            params = {}
        else:
            attrs = {"kernel_size": list(m.kernel_size), "dilation": list(m.dilation)}
            if op in ("conv3d", "conv_transpose3d"):
                attrs.update(stride=list(m.stride), padding=list(m.padding))
            if op == "generative_conv_transpose3d":
                attrs["stride"] = list(m.stride)
            if op == "conv3d":
                attrs["expand"] = bool(m.expand)
            params = {"weight": m.weight.detach()}
            if m.bias is not None:
                params["bias"] = m.bias.detach()
            if m.weight.dtype != torch.float32:
                self.fail(f"{kind} weight: expected float32 (the graph stores float32), got {m.weight.dtype}")
        out = self.new_value(y.feats, self.coords_of(y))
        self.nodes.append(_Node(path or kind, op, inputs, out, attrs, params))
        return y

    def window_conv(self, m: torch.nn.Module, path: str, original: Callable[..., Any], args: tuple,
                    kwargs: dict) -> Any:
        """lattice.models.WindowConv3d -> one ``window_conv3d`` node (graph version 3): translate
        the input by ``shift``, conv3d (padding 0, expand), keep the rows inside ``[0, crop)``
        when the call had a ``spatial_shape`` (``crop`` = its output grid, frozen; else null)."""
        kind = type(m).__name__
        if len(args) < 1:
            self.fail(f"{kind} input: expected a SparseTensor argument, got none")
        extra = [k for k in kwargs if k != "spatial_shape"]
        if extra or len(args) > 2:
            self.fail(f"{kind} arguments: expected (x) or (x, spatial_shape), got extra {extra or len(args)}")
        shape = args[1] if len(args) > 1 else kwargs.get("spatial_shape")
        inputs = [self.value_of_sparse(args[0], f"{kind} input")]
        if m.weight.dtype != torch.float32:
            self.fail(f"{kind} weight: expected float32 (the graph stores float32), got {m.weight.dtype}")
        self.leaf += 1
        try:
            y = original(*args, **kwargs)
        finally:
            self.leaf -= 1
        attrs = {"kernel_size": list(m.kernel_size), "stride": list(m.stride), "dilation": list(m.dilation),
                 "shift": [int(v) for v in m.shift],
                 "crop": None if shape is None else [int(v) for v in m.output_shape(shape)]}
        params = {"weight": m.weight.detach()}
        if m.bias is not None:
            params["bias"] = m.bias.detach()
        out = self.new_value(y.feats, self.coords_of(y))
        self.nodes.append(_Node(path or kind, "window_conv3d", inputs, out, attrs, params))
        return y

    def quantized_attrs(self, m: torch.nn.Module, op: str, kind: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Geometry and packed weight of a lattice.nn Quantized* module (graph version 2)."""
        from ._core import as_triple

        q = m.weight
        attrs: dict[str, Any] = {}
        if op != "linear":
            attrs = {"kernel_size": list(q.shape[1:4]), "dilation": list(as_triple(m.dilation, "dilation", kind))}
            if op in ("conv3d", "conv_transpose3d", "generative_conv_transpose3d"):
                attrs["stride"] = list(as_triple(m.stride, "stride", kind))
            if op in ("conv3d", "conv_transpose3d"):
                attrs["padding"] = list(as_triple(m.padding, "padding", kind))
            if op == "conv3d":
                attrs["expand"] = bool(m.expand)
        if q.scales.dtype not in (torch.float32, torch.float16):
            self.fail(f"{kind} weight.scales: expected float32 or float16 (safetensors F32 / F16), got {q.scales.dtype} "
                      f"(module.float() widens them exactly)")
        if m.bias is not None and m.bias.dtype != torch.float32:
            self.fail(f"{kind} bias: expected float32 (the graph's activations are float32), got {m.bias.dtype}")
        attrs["quantized"] = _quantized_attr(q)
        params = {"packed": q.packed.detach(), "scales": q.scales.detach(), "biases": q.biases.detach()}
        if m.bias is not None:
            params["bias"] = m.bias.detach()
        return attrs, params

    # -- torch functions ------------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.leaf:
            return out
        traced = [a for a in _flatten(list(args) + list(kwargs.values()))
                  if isinstance(a, torch.Tensor) and id(a) in self.values]
        if not traced or not any(isinstance(o, torch.Tensor) for o in _flatten(out)):
            return out  # metadata (shape, dtype, ...) or work on other tensors
        if isinstance(out, torch.Tensor) and any(out is t for t in traced):
            return out  # an alias (x.contiguous(), x.float() of float32, ...)
        self.record(func, args, kwargs, out, traced)
        return out

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any, traced: list[torch.Tensor]) -> None:
        name = _fname(func)

        def unsupported(why: str = "") -> None:
            self.fail(f"{name}: expected one of the exportable feature functions (F.batch_norm in eval, F.relu, "
                      f"F.leaky_relu, F.gelu, F.silu, sigmoid, tanh, F.softplus, F.linear, F.layer_norm, F.dropout "
                      f"in eval, torch.cat on dim 1, +, -, * of two feature matrices), got {name}{why}")

        def arg(i: int, key: str, default: Any = None) -> Any:
            return args[i] if len(args) > i else kwargs.get(key, default)

        x = traced[0]
        vx = self.values[id(x)]
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != x.shape[0]:
            unsupported(" (its result is not a feature matrix of the same rows)")
        if x.dtype != torch.float32:
            self.fail(f"{name} input: expected float32 features (the graph's activations are float32), got {x.dtype}")
        attrs: dict[str, Any] = {}
        params: dict[str, torch.Tensor] = {}
        inputs = [vx]
        fn = getattr(func, "__name__", "")
        binary = {"add": "add", "__add__": "add", "__radd__": "add", "__iadd__": "add", "sub": "sub",
                  "__sub__": "sub", "__isub__": "sub", "mul": "mul", "__mul__": "mul", "__rmul__": "mul",
                  "__imul__": "mul"}
        if func is F.relu or func is torch.relu or fn == "relu":
            op = "relu"
        elif func is F.leaky_relu:
            op, attrs["negative_slope"] = "leaky_relu", float(arg(1, "negative_slope", 0.01))
        elif func is F.gelu:
            op, attrs["approximate"] = "gelu", str(kwargs.get("approximate", "none"))
        elif func is F.silu:
            op = "silu"
        elif func is torch.sigmoid or fn == "sigmoid":
            op = "sigmoid"
        elif func is torch.tanh or fn == "tanh":
            op = "tanh"
        elif func is F.softplus:
            op = "softplus"
            attrs.update(beta=float(arg(1, "beta", 1.0)), threshold=float(arg(2, "threshold", 20.0)))
        elif func is F.dropout:
            p, training = float(arg(1, "p", 0.5)), bool(arg(2, "training", True))
            if training and p > 0:
                self.fail(f"{name}: expected eval mode (training=False) or p=0, got training=True with p={p}: call model.eval()")
            self.values[id(out)] = vx
            self.keep.append(out)
            return
        elif func is F.batch_norm:
            rm, rv, w, b = arg(1, "running_mean"), arg(2, "running_var"), arg(3, "weight"), arg(4, "bias")
            training, eps = bool(arg(5, "training", False)), float(arg(7, "eps", 1e-5))
            if training or rm is None or rv is None:
                self.fail(f"{name}: expected eval mode with running statistics, got training={training}, "
                          f"running stats {'present' if rm is not None else 'absent'}: call model.eval()")
            op, attrs["eps"] = "batch_norm", eps
            params = {"running_mean": rm.detach(), "running_var": rv.detach()}
            if w is not None:
                params["weight"] = w.detach()
            if b is not None:
                params["bias"] = b.detach()
        elif func is F.layer_norm:
            shape = tuple(arg(1, "normalized_shape"))
            if shape != (x.shape[1],):
                unsupported(f" (normalized_shape {shape}: only the channel dimension ({x.shape[1]},) is exportable)")
            w, b = arg(2, "weight"), arg(3, "bias")
            op, attrs["eps"] = "layer_norm", float(arg(4, "eps", 1e-5))
            if w is not None:
                params["weight"] = w.detach()
            if b is not None:
                params["bias"] = b.detach()
        elif func is F.linear:
            w, b = arg(1, "weight"), arg(2, "bias")
            if any(id(t) in self.values for t in (w, b) if isinstance(t, torch.Tensor)) or id(args[0]) != id(x):
                unsupported(" (features used as a weight)")
            op, params = "linear", {"weight": w.detach()}
            if b is not None:
                params["bias"] = b.detach()
        elif func is torch.cat:
            seq = arg(0, "tensors")
            dim = arg(1, "dim", 0)
            if dim not in (1, -1) or not all(isinstance(t, torch.Tensor) and id(t) in self.values for t in seq):
                unsupported(f" (dim={dim}; every input must be a traced feature matrix and dim 1)")
            inputs = [self.values[id(t)] for t in seq]
            op = "cat"
        elif fn in binary:
            a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other")
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and id(a) in self.values
                    and id(b) in self.values) or tuple(a.shape) != tuple(b.shape):
                unsupported(" with a constant or a broadcast operand")
            if kwargs.get("alpha", 1) != 1:
                unsupported(" with alpha != 1")
            op, inputs = binary[fn], [self.values[id(a)], self.values[id(b)]]
        else:
            unsupported()
        coords = {self.value_coords[v] for v in inputs}
        if len(coords) != 1:
            self.fail(f"{name}: expected inputs on one coordinate set, got {sorted(coords)} (align them first)")
        for k, t in params.items():
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                self.fail(f"{name} {k}: expected a float32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if id(out) in self.values:  # an in-place op on a traced tensor: a new value
            self.values.pop(id(out))
        node_name = f"{self.stack[-1][0]}:{op}" if self.stack and self.stack[-1][0] else op
        self.nodes.append(_Node(node_name, op, inputs, self.new_value(out, coords.pop()), attrs, params))


# ------------------------------------------------------------------------------------------------
# Graph passes and serialisation
# ------------------------------------------------------------------------------------------------

_FOLDABLE = ("subm_conv3d", "conv3d", "conv_transpose3d", "generative_conv_transpose3d", "linear", "window_conv3d")
_V2_OPS = ("max_pool3d", "avg_pool3d", "sum_pool3d")  # ops that graph version 1 does not have
_V3_OPS = ("window_conv3d",)  # ops that graph version 2 does not have


def _bn_scale_shift(params: dict[str, torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean, var = params["running_mean"].double(), params["running_var"].double()
    gamma = params["weight"].double() if "weight" in params else torch.ones_like(mean)
    beta = params["bias"].double() if "bias" in params else torch.zeros_like(mean)
    s = gamma / torch.sqrt(var + eps)
    return s, beta - mean * s


def _fold_batch_norm(nodes: list[_Node], outputs: set[str]) -> list[_Node]:
    consumers: dict[str, int] = {}
    for n in nodes:
        for v in n.inputs:
            consumers[v] = consumers.get(v, 0) + 1
    producer = {n.output: n for n in nodes}
    result: list[_Node] = []
    removed: set[int] = set()
    for n in nodes:
        if n.op != "batch_norm":
            continue
        s, t = _bn_scale_shift(n.params, n.attrs["eps"])
        prev = producer.get(n.inputs[0])
        if (prev is not None and prev.op in _FOLDABLE and "quantized" not in prev.attrs
                and consumers.get(prev.output) == 1 and prev.output not in outputs):
            w = prev.params["weight"].double()
            shape = (-1,) + (1,) * (w.dim() - 1)
            b = prev.params["bias"].double() if "bias" in prev.params else torch.zeros(w.shape[0], dtype=torch.float64)
            prev.params = {"weight": (w * s.view(shape)).float(), "bias": (b * s + t).float()}
            prev.attrs["folded_batch_norm"] = n.name
            prev.output = n.output
            removed.add(id(n))
        else:
            n.op, n.attrs, n.params = "scale_shift", {}, {"scale": s.float(), "shift": t.float()}
    for n in nodes:
        if id(n) not in removed:
            result.append(n)
    return result


def export(model: torch.nn.Module, example_input: SparseTensor, path: str, *,
           metadata: Optional[dict[str, Any]] = None, fold_batch_norm: bool = True, weights: str = "float32",
           group_size: Optional[int] = None, forward_args: Sequence[Any] = (),
           forward_kwargs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Traces ``model`` on ``example_input`` and writes ``path/graph.json`` + ``path/weights.safetensors``.

    The model must be in eval mode where it has BatchNorm or Dropout (training-mode statistics
    cannot be exported). ``metadata`` (JSON-serialisable) is stored as the graph's ``metadata``;
    ``lattice-run`` reads ``metadata["voxelize"]`` (see :func:`point_features`). Returns the graph
    dictionary that was written. Raises :class:`ExportError` naming the module path and the
    function for anything outside the supported set.

    ``weights``: ``"float32"`` (default) keeps float weights; ``"int8"`` / ``"int4"`` stores every
    convolution and Linear weight packed (``lattice.quantize_weight`` of the weight after BatchNorm
    folding: layout ``dense_5d`` for convolutions, ``linear`` for Linear, ``group_size`` None = 64
    when C_in >= 64 else 32, as ``lattice.nn.quantize``), run by the quantized routes in Python and
    C++. Modules that are already packed (``lattice.nn.Quantized*``) are stored packed as they are,
    whatever ``weights`` says; BatchNorm after a packed layer stays a ``scale_shift`` node (folding
    into packed codes would not be exact).

    ``forward_args`` / ``forward_kwargs``: further arguments of ``model(example_input, *forward_args,
    **forward_kwargs)``, frozen into the graph as the trace saw them (e.g. VoxelBackBone8x's
    ``spatial_shape``: the crop of each ``window_conv3d`` node); they must not be traced features.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"[export] weights: expected one of {WEIGHTS}, got {weights!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"[export] model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, SparseTensor):
        raise TypeError(f"[export] example_input: expected a lattice.SparseTensor, got {type(example_input).__name__}")
    if example_input.dtype != torch.float32:
        raise ExportError(f"[export] example_input: expected float32 features (the graph's activations are float32), got {example_input.dtype}")
    tracer = _Tracer(model)
    x = example_input.replace_feats(example_input.feats.detach().clone())
    input_value = tracer.new_value(x.feats, tracer.coords_of(x))
    forward_kwargs = dict(forward_kwargs or {})
    saved: list[tuple[torch.nn.Module, Any]] = []
    for m in model.modules():
        saved.append((m, m.__dict__.get("forward")))
        m.forward = tracer.wrap(m)  # type: ignore[method-assign]
    _ACTIVE.append(tracer)
    try:
        with torch.no_grad(), tracer:
            result = model(x, *forward_args, **forward_kwargs)
    finally:
        _ACTIVE.remove(tracer)
        for m, f in saved:
            if f is None:
                del m.forward
            else:
                m.forward = f
    outs = [o for o in _flatten(result) if isinstance(o, SparseTensor)]
    if not outs:
        raise ExportError(f"[export] model: expected forward to return SparseTensors (or tuples/lists/dicts of them), "
                          f"got {type(result).__name__}")
    tracer.stack = [("output", "")]
    out_values = [tracer.value_of_sparse(o, f"output {i}") for i, o in enumerate(outs)]
    nodes = _fold_batch_norm(tracer.nodes, set(out_values)) if fold_batch_norm else tracer.nodes
    for n in nodes:  # unfolded batch norm -> scale_shift when folding is off
        if n.op == "batch_norm":
            s, t = _bn_scale_shift(n.params, n.attrs["eps"])
            n.op, n.attrs, n.params = "scale_shift", {}, {"scale": s.float(), "shift": t.float()}
    # drop nodes nothing reads (a traced branch whose result the model discarded)
    live = set(out_values)
    kept: list[_Node] = []
    for n in reversed(nodes):
        if n.output in live:
            kept.append(n)
            live.update(n.inputs)
    nodes = kept[::-1]
    if weights != "float32":
        bits = 8 if weights == "int8" else 4
        for n in nodes:
            if n.op in _FOLDABLE and "quantized" not in n.attrs:
                q = quantize_weight(n.params["weight"].detach().cpu().float(), bits=bits, group_size=group_size,
                                    layout="linear" if n.op == "linear" else "dense_5d")
                bias = n.params.get("bias")
                n.params = {"packed": q.packed, "scales": q.scales, "biases": q.biases}
                if bias is not None:
                    n.params["bias"] = bias
                n.attrs["quantized"] = _quantized_attr(q)
    tensors: dict[str, np.ndarray] = {}
    graph_nodes = []
    for i, n in enumerate(nodes):
        refs = {}
        for k, t in n.params.items():
            key = f"n{i}.{k}"
            t = t.detach().cpu().contiguous()
            # packed words stay int32 and float16 scales float16; every float weight is float32
            keep = t.dtype == torch.int32 or (t.dtype == torch.float16 and "quantized" in n.attrs)
            tensors[key] = t.numpy() if keep else t.float().numpy()
            refs[k] = key
        graph_nodes.append({"name": n.name, "op": n.op, "inputs": n.inputs, "output": n.output,
                            "attrs": n.attrs, "weights": refs})
    used = {input_value, *[n.output for n in nodes]}
    values = {v: {"coords": tracer.value_coords[v], "channels": tracer.value_channels[v]}
              for v in sorted(used, key=lambda s: int(s[1:]))}
    coords_used = {values[v]["coords"] for v in values}
    needs_v2 = any("quantized" in n.attrs or n.op in _V2_OPS for n in nodes)
    needs_v3 = any(n.op in _V3_OPS for n in nodes)
    graph = {
        "format": FORMAT,
        "version": 3 if needs_v3 else 2 if needs_v2 else 1,
        "producer": f"lattice {_version()} (lattice.export, torch {torch.__version__})",
        "dtype": "float32",
        "inputs": [{"name": "input", "value": input_value, "channels": int(x.feats.shape[1]),
                    "stride": list(x.stride)}],
        "outputs": [{"name": f"output{i}", "value": v} for i, v in enumerate(out_values)],
        "coords": {c: {"stride": tracer.coord_strides[c]} for c in sorted(coords_used, key=lambda s: int(s[1:]))},
        "values": values,
        "nodes": graph_nodes,
        "metadata": metadata or {},
    }
    json.dumps(graph)  # fails here (not half-way through writing) when metadata is not JSON
    os.makedirs(path, exist_ok=True)
    write_safetensors(os.path.join(path, "weights.safetensors"), tensors, {"format": FORMAT, "version": str(graph["version"])})
    with open(os.path.join(path, "graph.json"), "w") as f:
        json.dump(graph, f, indent=1)
        f.write("\n")
    return graph


def _version() -> str:
    from . import __version__

    return __version__


# ------------------------------------------------------------------------------------------------
# The Python executor (parity with the C++ runtime)
# ------------------------------------------------------------------------------------------------

_OPS = ("subm_conv3d", "conv3d", "conv_transpose3d", "generative_conv_transpose3d", "linear", "scale_shift", "relu",
        "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "layer_norm", "add", "sub", "mul", "cat",
        "max_pool3d", "avg_pool3d", "sum_pool3d", "window_conv3d")


class ExportedModel:
    """An exported graph run with lattice's Python ops, node for node as ``lattice::Runtime``
    runs it (Linear as a kernel-1 submanifold conv, BatchNorm folded or as scale_shift)."""

    def __init__(self, graph: dict[str, Any], weights: dict[str, np.ndarray], device: Any = "cpu") -> None:
        self.graph = graph
        self.device = torch.device(device)
        self.weights = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in weights.items()}
        self.metadata = graph.get("metadata", {})

    def __call__(self, x: SparseTensor) -> list[SparseTensor]:
        g = self.graph
        inp = g["inputs"][0]
        if not isinstance(x, SparseTensor) or x.feats.dim() != 2 or x.feats.shape[1] != inp["channels"]:
            got = tuple(x.feats.shape) if isinstance(x, SparseTensor) else type(x).__name__
            raise ValueError(f"[ExportedModel] input: expected a SparseTensor with {inp['channels']} channels, got {got}")
        env: dict[str, SparseTensor] = {inp["value"]: x}
        for n in g["nodes"]:
            env[n["output"]] = self._run(n, [env[v] for v in n["inputs"]])
        return [env[o["value"]] for o in g["outputs"]]

    def _run(self, n: dict[str, Any], xs: list[SparseTensor]) -> SparseTensor:
        op, a = n["op"], n["attrs"]
        w = {k: self.weights[v] for k, v in n["weights"].items()}
        x = xs[0]
        if "quantized" in a:  # a packed weight: lattice's quantized routes, as the Quantized* modules run
            qa = a["quantized"]
            w["weight"] = QuantizedWeight(w["packed"], w["scales"], w["biases"], int(qa["bits"]), int(qa["group_size"]),
                                          qa["layout"], tuple(int(d) for d in qa["shape"]))
            if op == "linear":
                return ops.linear(x, w["weight"], w.get("bias"))
        if op == "subm_conv3d":
            return ops.subm_conv3d(x, w["weight"], w.get("bias"), kernel_size=a["kernel_size"], dilation=a["dilation"])
        if op == "conv3d":
            return ops.conv3d(x, w["weight"], w.get("bias"), kernel_size=a["kernel_size"], stride=a["stride"],
                              padding=a["padding"], dilation=a["dilation"], expand=a["expand"],
                              coordinates=xs[1] if len(xs) > 1 else None)
        if op == "conv_transpose3d":
            return ops.conv_transpose3d(x, w["weight"], w.get("bias"), kernel_size=a["kernel_size"], stride=a["stride"],
                                        padding=a["padding"], dilation=a["dilation"],
                                        coordinates=xs[1] if len(xs) > 1 else None)
        if op == "window_conv3d":  # lattice.models.WindowConv3d.forward with the node's weights
            from .models.blocks import translate

            y = ops.conv3d(translate(x, a["shift"]), w["weight"], w.get("bias"), kernel_size=a["kernel_size"],
                           stride=a["stride"], padding=0, dilation=a["dilation"], expand=True)
            return y if a.get("crop") is None else ops.crop(y, (0, 0, 0), a["crop"])
        if op == "generative_conv_transpose3d":
            return ops.generative_conv_transpose3d(x, w["weight"], w.get("bias"), kernel_size=a["kernel_size"],
                                                   stride=a["stride"], dilation=a["dilation"])
        if op in ("max_pool3d", "avg_pool3d", "sum_pool3d"):
            return getattr(ops, op)(x, a["kernel_size"], a["stride"], a["padding"], a["dilation"],
                                    coordinates=xs[1] if len(xs) > 1 else None, expand=a["expand"])
        if op == "linear":
            k = w["weight"]
            return ops.subm_conv3d(x, k.view(k.shape[0], 1, 1, 1, k.shape[1]), w.get("bias"), kernel_size=1)
        f = x.feats
        if op == "scale_shift":
            return x.replace_feats(f * w["scale"] + w["shift"])
        if op == "relu":
            return x.replace_feats(torch.relu(f))
        if op == "leaky_relu":
            return x.replace_feats(F.leaky_relu(f, a["negative_slope"]))
        if op == "gelu":
            return x.replace_feats(F.gelu(f, approximate=a["approximate"]))
        if op == "silu":
            return x.replace_feats(F.silu(f))
        if op == "sigmoid":
            return x.replace_feats(torch.sigmoid(f))
        if op == "tanh":
            return x.replace_feats(torch.tanh(f))
        if op == "softplus":
            return x.replace_feats(F.softplus(f, a["beta"], a["threshold"]))
        if op == "layer_norm":
            return x.replace_feats(F.layer_norm(f, (f.shape[1],), w.get("weight"), w.get("bias"), a["eps"]))
        if op in ("add", "sub", "mul"):
            g = xs[1].feats
            return x.replace_feats(f + g if op == "add" else f - g if op == "sub" else f * g)
        if op == "cat":
            return x.replace_feats(torch.cat([t.feats for t in xs], 1))
        graph_version = self.graph.get("version")
        raise ValueError(f"[ExportedModel] {n['name']}: expected an op of graph version {graph_version} {_OPS}, got {op!r}")


def load_exported(path: str, device: Any = "cpu") -> ExportedModel:
    """Loads a directory written by :func:`export`; call the result on a SparseTensor."""
    with open(os.path.join(path, "graph.json")) as f:
        graph = json.load(f)
    if graph.get("format") != FORMAT or graph.get("version") not in VERSIONS:
        raise ValueError(f"[load_exported] {path}/graph.json: expected format {FORMAT!r} version {VERSIONS}, "
                         f"got {graph.get('format')!r} version {graph.get('version')!r}")
    return ExportedModel(graph, read_safetensors(os.path.join(path, "weights.safetensors")), device)


# ------------------------------------------------------------------------------------------------
# Voxelization recipe (metadata["voxelize"]), mirrored by lattice::Runtime / lattice-run
# ------------------------------------------------------------------------------------------------

_SOURCES = ("x", "y", "z", "intensity", "offset_x", "offset_y", "offset_z")


def point_features(points: torch.Tensor, spec: dict[str, Any]) -> torch.Tensor:
    """(P, len(features)) float32 per-point features of (P, 4) float32 points (x, y, z, intensity).

    ``spec["features"]``: a list of ``{"source": s, "add": a, "divide": d}`` (``add`` 0 and
    ``divide`` 1 by default): ``(column + a) / d`` in float32 for s in x, y, z, intensity; for
    ``offset_x|y|z`` the point's place in its voxel, ``float(p / voxel_size - floor(p / voxel_size) - 0.5)``
    computed in float64 (then ``add`` / ``divide`` in float32).
    """
    vs = spec["voxel_size"]
    vs = [float(vs)] * 3 if isinstance(vs, (int, float)) else [float(v) for v in vs]
    cols = []
    for i, f in enumerate(spec["features"]):
        s = f["source"]
        if s not in _SOURCES:
            raise ValueError(f"[point_features] features[{i}].source: expected one of {_SOURCES}, got {s!r}")
        if s.startswith("offset_"):
            a = "xyz".index(s[-1])
            scaled = points[:, a].double() / vs[a]
            col = (scaled - torch.floor(scaled) - 0.5).float()
        else:
            col = points[:, ("x", "y", "z", "intensity").index(s)]
        add, div = float(f.get("add", 0.0)), float(f.get("divide", 1.0))
        if add != 0.0:
            col = col + add
        if div != 1.0:
            col = col / div
        cols.append(col.float().reshape(-1, 1))
    return torch.cat(cols, 1).contiguous()


def voxelize_points(points: torch.Tensor, spec: dict[str, Any]) -> tuple[SparseTensor, torch.Tensor]:
    """The SparseTensor ``lattice-run`` builds from (P, 4) float32 points, and the (P,) int64 row of
    each point's voxel (to map per-voxel outputs back to points)."""
    xyz = points[:, :3].contiguous()
    feats = point_features(points, spec)
    x = ops.voxelize(xyz, feats, spec["voxel_size"], reduction=spec.get("reduction", "mean"),
                     origin=spec.get("origin", 0.0))
    coords, inverse, _ = ops.sparse_quantize(xyz, spec["voxel_size"], origin=spec.get("origin", 0.0))
    if not torch.equal(coords, x.coords):
        raise AssertionError("[voxelize_points] voxelize and sparse_quantize disagree on the voxel rows")
    return x, inverse


def demo_voxelize_spec(voxel_size: float = 0.1) -> dict[str, Any]:
    """metadata["voxelize"] reproducing ``python -m lattice.demo``'s input features
    (``lattice._demo_data.voxelize_scan``: offset in the voxel, height above the ground plane /
    HEIGHT_SCALE_M, reflectance; mean per voxel)."""
    from ._demo_data import HEIGHT_SCALE_M, SENSOR_HEIGHT_M

    return {"voxel_size": float(voxel_size), "origin": 0.0, "reduction": "mean",
            "features": [{"source": "offset_x"}, {"source": "offset_y"}, {"source": "offset_z"},
                         {"source": "z", "add": SENSOR_HEIGHT_M, "divide": HEIGHT_SCALE_M},
                         {"source": "intensity"}]}
