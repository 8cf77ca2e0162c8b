"""lattice.convert: checkpoints and weights from TorchSparse, SPVNAS, MinkowskiEngine and spconv.

lattice's conv weight is the dense ``(C_out, Kx, Ky, Kz, C_in)`` tensor whose kernel rows are
enumerated x-major, **z fastest** (``row = (x * Ky + y) * Kz + z``, SEMANTICS.md). The libraries:

==================  ===========================  ==========================================
library             weight                       kernel-row order (and offset meaning)
==================  ===========================  ==========================================
TorchSparse 2.x     ``kernel`` (K, C_in, C_out); odd kernel volume: **x fastest**
                    (C_in, C_out) when K = 1     (``[(x, y, z) for z for y for x]``);
                                                 even volume: z fastest (as lattice)
MinkowskiEngine     ``kernel`` (K, C_in, C_out); x fastest for every size
0.5                 (C_in, C_out) for 1x1 s1;
                    ``bias`` (1, C_out)
spconv 2.x          ``weight`` (C_out, K0, K1, K2,  the kernel axes follow the index columns:
(implicit GEMM)     C_in)                        OpenPCDet's (batch, z, y, x) -> K0 = z
spconv 2.x native   (K0, K1, K2, C_out, C_in)    same
spconv 1.x          (K0, K1, K2, C_in, C_out)    same
==================  ===========================  ==========================================

Offsets agree otherwise: odd kernels centred (``k - (K-1)/2``), even kernels indexed ``0..K-1``,
submanifold ``in = out + offset``, strided ``in = stride * out + offset``, transposed
``out = stride * in + offset`` (tests/python/test_convert.py checks each against a dense
``torch.nn.functional.conv3d``). Strided odd kernels: TorchSparse / spconv window
``stride * o - padding + [0, K)`` -> :class:`lattice.models.WindowConv3d`.

State-dict converters (:func:`from_torchsparse`, :func:`from_minkowski`, :func:`from_spconv`) map a
source state_dict onto a lattice model (a module instance, e.g. ``lattice.models.MinkUNet42()``):
the source's convolutions, BatchNorms and linear layers are taken in state_dict order (the order
the source network registers them, which for the networks in :mod:`lattice.models` is the order
of the lattice network) and paired with the lattice model's, each pair checked by kind, kernel size
and channel counts; a mismatch raises ``ValueError`` naming both keys. BatchNorm keys become
``<name>.bn.*``; ME's ``*.bn.*`` and TorchSparse's flat names are both read. The result loads with
``model.load_state_dict(result)`` (strict).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from . import nn as lnn
from ._core import as_triple

__all__ = ["kernel_offsets", "kernel_permutation", "weight_from_kernel_major", "weight_to_kernel_major",
           "weight_from_torchsparse", "weight_from_minkowski", "weight_from_spconv", "from_torchsparse",
           "from_minkowski", "from_spconv", "ORDERS", "SPCONV_LAYOUTS"]

IntOr3 = Union[int, Sequence[int]]
ORDERS = ("lattice", "x_fastest", "z_fastest", "torchsparse", "minkowski")
SPCONV_LAYOUTS = ("v2", "v2_native", "v1")


def _order(kernel_size: tuple[int, int, int], order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"[convert] order: expected one of {ORDERS}, got {order!r}")
    if order == "torchsparse":
        vol = kernel_size[0] * kernel_size[1] * kernel_size[2]
        return "x_fastest" if vol % 2 == 1 else "z_fastest"
    if order == "minkowski":
        return "x_fastest"
    return "z_fastest" if order == "lattice" else order


def kernel_offsets(kernel_size: IntOr3, order: str = "lattice") -> list[tuple[int, int, int]]:
    """The kernel index ``(ix, iy, iz)`` (each in ``0..K-1``) of every kernel row, in ``order``.

    ``lattice`` / ``z_fastest``: ``row = (ix * Ky + iy) * Kz + iz``; ``x_fastest``: ``row = (iz * Ky +
    iy) * Kx + ix``; ``torchsparse``: x fastest for an odd kernel volume, z fastest for an even one;
    ``minkowski``: x fastest.
    """
    k = as_triple(kernel_size, "kernel_size", "kernel_offsets")
    o = _order(k, order)
    grid = itertools.product(range(k[0]), range(k[1]), range(k[2]))  # x-major, z fastest
    rows = list(grid)
    if o == "x_fastest":
        rows = [(x, y, z) for z in range(k[2]) for y in range(k[1]) for x in range(k[0])]
    return rows


def kernel_permutation(kernel_size: IntOr3, src_order: str) -> torch.Tensor:
    """``perm`` (K,) int64 with ``lattice_rows = src_rows[perm]`` (row l of lattice's order is row
    ``perm[l]`` of ``src_order``)."""
    k = as_triple(kernel_size, "kernel_size", "kernel_permutation")
    src = {off: i for i, off in enumerate(kernel_offsets(k, src_order))}
    return torch.tensor([src[off] for off in kernel_offsets(k, "lattice")], dtype=torch.int64)


def weight_from_kernel_major(kernel: torch.Tensor, kernel_size: IntOr3, order: str = "lattice") -> torch.Tensor:
    """(K, C_in, C_out) (or (C_in, C_out) for K = 1) in kernel-row ``order`` -> lattice
    (C_out, Kx, Ky, Kz, C_in)."""
    k = as_triple(kernel_size, "kernel_size", "weight_from_kernel_major")
    vol = k[0] * k[1] * k[2]
    w = kernel.detach()
    if w.dim() == 2:
        w = w.unsqueeze(0)
    if w.dim() != 3 or w.shape[0] != vol:
        raise ValueError(f"[weight_from_kernel_major] kernel: expected shape (K={vol}, C_in, C_out) for kernel_size "
                         f"{k}, got {tuple(kernel.shape)}")
    w = w[kernel_permutation(k, order)]
    return w.permute(2, 0, 1).reshape(w.shape[2], *k, w.shape[1]).contiguous()


def weight_to_kernel_major(weight: torch.Tensor, order: str = "lattice") -> torch.Tensor:
    """lattice (C_out, Kx, Ky, Kz, C_in) -> (K, C_in, C_out) in kernel-row ``order`` (the inverse of
    :func:`weight_from_kernel_major`)."""
    if weight.dim() != 5:
        raise ValueError(f"[weight_to_kernel_major] weight: expected (C_out, Kx, Ky, Kz, C_in), got {tuple(weight.shape)}")
    k = tuple(weight.shape[1:4])
    w = weight.detach().reshape(weight.shape[0], -1, weight.shape[4]).permute(1, 2, 0)  # lattice rows
    inv = torch.empty_like(kernel_permutation(k, order))
    inv[kernel_permutation(k, order)] = torch.arange(inv.numel())
    return w[inv].contiguous()


def weight_from_torchsparse(kernel: torch.Tensor, kernel_size: IntOr3) -> torch.Tensor:
    """A TorchSparse 2.x ``Conv3d.kernel`` -> lattice (C_out, Kx, Ky, Kz, C_in). The same call
    serves ``transposed=True`` convs (TorchSparse keeps (K, C_in, C_out) with the layer's own C_in)."""
    return weight_from_kernel_major(kernel, kernel_size, "torchsparse")


def weight_from_minkowski(kernel: torch.Tensor, kernel_size: IntOr3) -> torch.Tensor:
    """A MinkowskiEngine ``MinkowskiConvolution(Transpose).kernel`` -> lattice (C_out, Kx, Ky, Kz, C_in)."""
    return weight_from_kernel_major(kernel, kernel_size, "minkowski")


def weight_from_spconv(weight: torch.Tensor, layout: str = "v2", axes: str = "zyx") -> torch.Tensor:
    """An spconv conv weight -> lattice (C_out, Kx, Ky, Kz, C_in).

    Args:
        layout: ``"v2"`` (C_out, K0, K1, K2, C_in) (spconv 2.x implicit GEMM, the default
            algorithm), ``"v2_native"`` (K0, K1, K2, C_out, C_in), ``"v1"`` (K0, K1, K2, C_in, C_out).
        axes: which lattice axis each spconv kernel axis is, in order: ``"zyx"`` for OpenPCDet /
            mmdet3d indices ``(batch, z, y, x)``, ``"xyz"`` when the indices were ``(batch, x, y, z)``.
    """
    if layout not in SPCONV_LAYOUTS:
        raise ValueError(f"[weight_from_spconv] layout: expected one of {SPCONV_LAYOUTS}, got {layout!r}")
    if sorted(axes) != ["x", "y", "z"]:
        raise ValueError(f"[weight_from_spconv] axes: expected a permutation of 'xyz', got {axes!r}")
    if weight.dim() != 5:
        raise ValueError(f"[weight_from_spconv] weight: expected a 5-D tensor, got {tuple(weight.shape)}")
    w = weight.detach()
    if layout == "v2_native":
        w = w.permute(3, 0, 1, 2, 4)
    elif layout == "v1":
        w = w.permute(4, 0, 1, 2, 3)
    # w: (C_out, K0, K1, K2, C_in) with K_i along axes[i]
    src = {a: i + 1 for i, a in enumerate(axes)}
    return w.permute(0, src["x"], src["y"], src["z"], 4).contiguous()


# ------------------------------------------------------------------------------------------------
# state dicts
# ------------------------------------------------------------------------------------------------

_BN = ("weight", "bias", "running_mean", "running_var")


def _source_layers(state_dict: Mapping[str, torch.Tensor], library: str) -> list[tuple[str, str, dict]]:
    """(kind, prefix, tensors) in state_dict order; kind: conv, bn, linear."""
    groups: "OrderedDict[str, dict]" = OrderedDict()
    for key, value in state_dict.items():
        prefix, _, leaf = key.rpartition(".")
        groups.setdefault(prefix, {})[leaf] = value
    layers = []
    for prefix, t in groups.items():
        names = set(t)
        if "kernel" in names:
            layers.append(("conv", prefix, t))
        elif {"running_mean", "running_var"} <= names:
            layers.append(("bn", prefix[:-3] if prefix.endswith(".bn") else prefix, t))
        elif library == "spconv" and "weight" in names and t["weight"].dim() == 5:
            layers.append(("conv", prefix, t))
        elif "weight" in names and t["weight"].dim() == 2:
            layers.append(("linear", prefix, t))
        else:
            raise ValueError(f"[from_{library}] state_dict: expected convolution, BatchNorm or linear entries, got "
                             f"{prefix!r} with {sorted(names)}")
    return layers


def _target_layers(model: torch.nn.Module) -> list[tuple[str, str, torch.nn.Module]]:
    convs = (lnn.Conv3d, lnn.SubmConv3d, lnn.ConvTranspose3d, lnn.GenerativeConvTranspose3d)
    out = []
    for name, m in model.named_modules():
        if isinstance(m, convs):
            out.append(("conv", name, m))
        elif isinstance(m, lnn.BatchNorm):
            out.append(("bn", name, m))
        elif isinstance(m, lnn.Linear):
            out.append(("linear", name, m))
    return out


def _convert(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module, library: str,
             conv_weight: Any, ignore: Sequence[str] = ()) -> "OrderedDict[str, torch.Tensor]":
    op = f"from_{library}"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"[{op}] model: expected the lattice target network (a torch.nn.Module, e.g. "
                        f"lattice.models.MinkUNet42()), got {type(model).__name__}")
    if "state_dict" in state_dict and isinstance(state_dict["state_dict"], Mapping):
        state_dict = state_dict["state_dict"]  # a checkpoint dict
    state_dict = OrderedDict((k, v) for k, v in state_dict.items() if not any(k.startswith(p) for p in ignore))
    src = _source_layers(state_dict, library)
    dst = _target_layers(model)
    if len(src) != len(dst):
        raise ValueError(f"[{op}] state_dict: expected {len(dst)} layers (convs, BatchNorms, linear) for "
                         f"{type(model).__name__}, got {len(src)}")
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for (skind, sname, t), (dkind, dname, m) in zip(src, dst):
        where = f"{sname!r} -> {dname!r}"
        if dkind == "bn":
            if skind != "bn":
                raise ValueError(f"[{op}] {where}: expected a BatchNorm, got a {skind}")
            for leaf in _BN:
                v = t[leaf].detach().reshape(-1)
                if v.shape != getattr(m.bn, leaf).shape:
                    raise ValueError(f"[{op}] {where}: expected {leaf} of shape {tuple(getattr(m.bn, leaf).shape)}, "
                                     f"got {tuple(v.shape)}")
                out[f"{dname}.bn.{leaf}"] = v.clone()
            nbt = t.get("num_batches_tracked", torch.tensor(0))
            out[f"{dname}.bn.num_batches_tracked"] = nbt.detach().clone()
            continue
        if dkind == "linear":
            if skind == "linear":
                w = t["weight"].detach()
            elif skind == "conv":  # ME's final 1x1 convolution: kernel (C_in, C_out)
                k = t.get("kernel", t.get("weight")).detach()
                w = k.reshape(-1, k.shape[-1]).t() if library != "spconv" else k.reshape(k.shape[0], -1)
            else:
                raise ValueError(f"[{op}] {where}: expected a linear layer, got a {skind}")
            if w.shape != m.weight.shape:
                raise ValueError(f"[{op}] {where}: expected weight {tuple(m.weight.shape)}, got {tuple(w.shape)}")
            out[f"{dname}.weight"] = w.contiguous().clone()
            if m.bias is not None:
                if "bias" not in t:
                    raise ValueError(f"[{op}] {where}: expected a bias, got none")
                out[f"{dname}.bias"] = t["bias"].detach().reshape(-1).clone()
            continue
        if skind != "conv":
            raise ValueError(f"[{op}] {where}: expected a convolution, got a {skind}")
        w = conv_weight(t, m.kernel_size)
        if w.shape != m.weight.shape:
            raise ValueError(f"[{op}] {where}: expected weight {tuple(m.weight.shape)} (C_out, Kx, Ky, Kz, C_in), "
                             f"got {tuple(w.shape)} after conversion (source {tuple(t.get('kernel', t.get('weight')).shape)})")
        out[f"{dname}.weight"] = w
        if m.bias is not None:
            if "bias" not in t:
                raise ValueError(f"[{op}] {where}: expected a bias, got none")
            out[f"{dname}.bias"] = t["bias"].detach().reshape(-1).clone()
        elif "bias" in t:
            raise ValueError(f"[{op}] {where}: expected no bias (the lattice layer has none), got one")
    return out


def from_torchsparse(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module, *,
                     ignore: Sequence[str] = ("point_transforms.",)) -> "OrderedDict[str, torch.Tensor]":
    """A TorchSparse 2.x (or SPVNAS) state_dict -> a state_dict for the lattice ``model``
    (``MinkUNet42`` for SPVNAS ``MinkUNet`` / ``SparseResUNet42`` + classifier, ``SparseResNet21D``).
    A TorchSparse ``SparseResUNet42`` has no classifier: load with ``strict=False`` or add the
    classifier's entries. Kernel rows are permuted by :func:`weight_from_torchsparse`. Keys starting
    with a prefix in ``ignore`` are skipped (default: SPVNAS MinkUNet's ``point_transforms``, a
    point branch its MinkUNet registers but never runs)."""
    return _convert(state_dict, model, "torchsparse", lambda t, k: weight_from_torchsparse(t["kernel"], k), ignore)


def from_minkowski(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """A MinkowskiEngine 0.5 state_dict -> a state_dict for the lattice ``model`` (``MinkUNet34`` for
    the ME examples' MinkUNet34C, ``MinkUNet18(channels=...)`` for MinkUNet18A / B / D). ``*.bn.*`` BatchNorm keys,
    ``final`` 1x1 conv -> the ``classifier`` Linear (kernel transposed, bias (1, C) flattened)."""
    return _convert(state_dict, model, "minkowski", lambda t, k: weight_from_minkowski(t["kernel"], k))


def from_spconv(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module, *, layout: str = "v2",
                axes: str = "zyx") -> "OrderedDict[str, torch.Tensor]":
    """An spconv (OpenPCDet / mmdet3d) state_dict -> a state_dict for the lattice ``model``
    (``VoxelBackBone8x`` for OpenPCDet's ``backbone_3d``: pass ``{k[len("backbone_3d."):]: v ...}``).
    ``layout`` / ``axes`` as :func:`weight_from_spconv` (spconv 2.x default: ``"v2"``, ``"zyx"``);
    with ``axes="zyx"`` spconv's kernel tuples are reversed (its (3, 1, 1) is lattice's (1, 1, 3))."""
    return _convert(state_dict, model, "spconv", lambda t, k: weight_from_spconv(t["weight"], layout, axes))
