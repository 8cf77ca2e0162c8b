"""``torch.compile`` support (torch >= 2.0): lattice's core calls run outside dynamo's graphs.

lattice's ops call the C++ core through pybind11 and DLPack (coordinate sets, relations, the
convolution / pooling kernels inside ``torch.autograd.Function``\\ s). Dynamo cannot trace those
calls: left alone it stops at each one deep inside lattice's Python (``plan``, ``_run``,
``ConvFunction.forward``, ...), compiles dozens of small frames, re-guards them per layer and
hits its recompile limit (a MinkUNet18 took 48 s to compile with ``aot_eager``, 144 s with
inductor). :func:`install` (run when lattice is imported, on a torch that has ``torch.compile``)
marks every lattice op that reaches the core with ``torch.compiler.disable``: dynamo calls it as
one opaque step (a graph break) and compiles the torch code between the ops (BatchNorm, ReLU,
residual adds, ``Linear``, losses), forward and backward. The ops and their autograd are
lattice's own, so the results equal eager lattice (up to the reordering of float sums the
compiled torch code may do).

What stays eager (one graph break each): every function of ``lattice.ops`` except the
element-wise feature functions (``relu``, ``batch_norm``, ``layer_norm``, ...), and
``SparseTensor`` construction from coordinates (it builds a core coordinate set;
``replace_feats`` does not and is traced). Not done: the
ops as ``torch.library`` custom ops, which would let dynamo keep one graph (their outputs' row
counts depend on the coordinates, and the relation cache is keyed by coordinate identity: both
need a redesign of how plans cross the op boundary). On torch without ``torch.compile`` (1.13)
nothing is changed.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch

# lattice.ops functions that are plain torch code on the features: left for dynamo to compile
_TRACEABLE = {"relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "batch_norm", "layer_norm",
              "rms_norm", "dropout"}

_installed = False


def available() -> bool:
    """Whether this torch has ``torch.compile`` (and so dynamo)."""
    return hasattr(torch, "compile")


def _disable(fn: Callable[..., Any]) -> Callable[..., Any]:
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "disable"):  # torch >= 2.1
        wrapped = compiler.disable(fn)
    else:  # torch 2.0
        import torch._dynamo as dynamo

        wrapped = dynamo.disable(fn)
    functools.update_wrapper(wrapped, fn)
    wrapped.__lattice_compile_disabled__ = fn  # type: ignore[attr-defined]
    return wrapped


def install() -> list[str]:
    """Marks lattice's core-calling ops as dynamo-opaque (see the module docstring); idempotent.
    Every lattice module that holds one of those functions by name gets the wrapped one, so calls
    from ``lattice.nn`` and ``lattice.models`` go through it too. Returns the names wrapped."""
    global _installed
    if _installed or not available():
        return []
    from . import ops
    originals: dict[int, Callable[..., Any]] = {}
    wrapped: dict[int, Callable[..., Any]] = {}
    names = []
    for name in ops.__all__:
        fn = getattr(ops, name)
        if name in _TRACEABLE or not callable(fn) or isinstance(fn, type):
            continue
        originals[id(fn)] = fn
        wrapped[id(fn)] = _disable(fn)
        names.append(name)
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "lattice" or mod_name.startswith("lattice.")):
            continue
        for attr, value in list(vars(mod).items()):
            if callable(value) and id(value) in wrapped and originals[id(value)] is value:
                setattr(mod, attr, wrapped[id(value)])
    # modules whose forward is one core op: opaque as a whole (their frames are not compiled and
    # re-guarded per weight shape; the module call is the graph break)
    from . import nn as lnn

    for name in ("SubmConv3d", "Conv3d", "ConvTranspose3d", "GenerativeConvTranspose3d", "MaxPool3d", "AvgPool3d",
                 "SumPool3d", "GlobalAvgPool", "GlobalMaxPool", "GlobalSumPool", "PoolTranspose3d",
                 "TrilinearUpsample3d", "QuantizedConv3d", "QuantizedSubmConv3d", "QuantizedConvTranspose3d",
                 "QuantizedGenerativeConvTranspose3d", "QuantizedLinear"):
        cls = getattr(lnn, name, None)
        if cls is not None and "forward" in vars(cls):
            cls.forward = _disable(vars(cls)["forward"])
            names.append(f"nn.{name}.forward")
    for cls in {c for c in (getattr(lnn, n, None) for n in ("MaxPool3d", "GlobalAvgPool")) if c is not None}:
        for base in cls.__mro__[1:]:  # the shared forward of the pooling bases
            if base.__module__.startswith("lattice.") and "forward" in vars(base) and \
                    not hasattr(vars(base)["forward"], "__lattice_compile_disabled__"):
                base.forward = _disable(vars(base)["forward"])
                names.append(f"nn.{base.__name__}.forward")
    # a SparseTensor built from coordinates creates a core coordinate set (replace_feats does not)
    from . import tensor

    tensor._coordinate_set_of = _disable(tensor._coordinate_set_of)
    _installed = True
    return names
