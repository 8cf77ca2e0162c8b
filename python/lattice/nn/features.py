"""Feature-only modules: rows and coordinate identity unchanged (dense ops on the (N, C) feature
matrix, see :mod:`lattice.ops.features`).

Batch normalisation and ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: :class:`BatchNorm` is a
thin module around a ``torch.nn.BatchNorm1d`` child named ``bn`` (state_dict entries
``bn.weight``, ``bn.bias``, ``bn.running_mean`` ..., as MinkowskiEngine's; checkpoints with the
flat names of the earlier BatchNorm1d subclass still load). torch's conversion replaces every ``_BatchNorm`` it
finds with a plain ``torch.nn.SyncBatchNorm``, which only accepts tensors; because the replaced
module is the child, the lattice module around it keeps handing it the feature matrix, so a
converted model still takes SparseTensors and synchronises statistics exactly like torch does for
(N, C) inputs. :func:`convert_sync_batchnorm` does the same conversion but yields
:class:`SyncBatchNorm` modules (a BatchNorm whose child is a ``torch.nn.SyncBatchNorm``).

When no synchronisation is needed (eval mode, or a single process without an initialised process
group) a SyncBatchNorm child runs as plain batch norm, also on CPU: torch >= 2 does this itself,
torch 1.x refuses CPU input even then, so the lattice module takes that path directly.
Synchronised training needs what torch's SyncBatchNorm needs (CUDA features, an initialised
process group).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .._device import check_device
from ..ops import features as ops
from ..tensor import SparseTensor


def _check(op: str, x: Any) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"[{op}] input: expected a lattice.SparseTensor, got {type(x).__name__}")
    return x


def _needs_sync(bn: torch.nn.SyncBatchNorm) -> bool:
    """What torch's SyncBatchNorm.forward decides: synchronise only when training with batch
    statistics in an initialised process group of more than one process."""
    if not bn.training:
        return False
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    group = bn.process_group or torch.distributed.group.WORLD
    return torch.distributed.get_world_size(group) > 1


def _run_batch_norm(bn: torch.nn.Module, feats: torch.Tensor, op: str = "BatchNorm") -> torch.Tensor:
    for what in ("weight", "bias", "running_mean", "running_var"):
        check_device(op, what, getattr(bn, what, None), feats.device)
    if isinstance(bn, torch.nn.SyncBatchNorm) and not feats.is_cuda and not _needs_sync(bn):
        # Plain batch norm with the SyncBatchNorm's own parameters and buffers (torch >= 2 falls
        # back the same way; torch 1.x would raise "expected input tensor to be on GPU").
        return torch.nn.modules.batchnorm._BatchNorm.forward(bn, feats)
    return bn(feats)


class BatchNorm(torch.nn.Module):
    """Batch normalisation over the rows of ``feats`` (N, C): batch statistics in training, running
    statistics in eval — ``torch.nn.BatchNorm1d`` (the child ``bn``) on the feature matrix.

    Arguments are those of ``torch.nn.BatchNorm1d``; ``weight``, ``bias``, ``running_mean``,
    ``running_var``, ``eps``, ``momentum`` ... read through to the child. See the module docstring for
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.bn: torch.nn.Module = torch.nn.BatchNorm1d(num_features, eps, momentum, affine, track_running_stats,
                                                        device=device, dtype=dtype)

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check(type(self).__name__, x)
        return x.replace_feats(_run_batch_norm(self.bn, x.feats, type(self).__name__))

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any, **kwargs: Any) -> None:
        # Checkpoints written when BatchNorm was a BatchNorm1d subclass name the entries without
        # "bn."; they load into the child.
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            old, new = prefix + name, prefix + "bn." + name
            if old in state_dict and new not in state_dict:
                state_dict[new] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    num_features = property(lambda self: self.bn.num_features)
    eps = property(lambda self: self.bn.eps)
    momentum = property(lambda self: self.bn.momentum)
    affine = property(lambda self: self.bn.affine)
    track_running_stats = property(lambda self: self.bn.track_running_stats)
    weight = property(lambda self: self.bn.weight)
    bias = property(lambda self: self.bn.bias)
    running_mean = property(lambda self: self.bn.running_mean)
    running_var = property(lambda self: self.bn.running_var)
    num_batches_tracked = property(lambda self: self.bn.num_batches_tracked)


class SyncBatchNorm(BatchNorm):
    """:class:`BatchNorm` whose child is a ``torch.nn.SyncBatchNorm``: statistics are synchronised
    across processes in distributed training (CUDA), plain batch norm otherwise."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        torch.nn.Module.__init__(self)
        self.bn = torch.nn.SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats, process_group,
                                         device=device, dtype=dtype)

    @classmethod
    def from_batch_norm(cls, module: BatchNorm, process_group: Any = None) -> "SyncBatchNorm":
        """A SyncBatchNorm sharing ``module``'s parameters and buffers (and its train/eval mode)."""
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        out.bn = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module.bn, process_group)
        out.train(module.training)
        return out


def convert_sync_batchnorm(module: torch.nn.Module, process_group: Any = None) -> torch.nn.Module:
    """Every :class:`BatchNorm` in ``module`` -> :class:`SyncBatchNorm` (sharing parameters, buffers
    and train/eval mode); every other torch ``_BatchNorm`` -> ``torch.nn.SyncBatchNorm`` (torch's own
    conversion). Returns the converted module (``module`` itself unless it is a batch norm)."""
    if isinstance(module, BatchNorm):
        return module if isinstance(module, SyncBatchNorm) else SyncBatchNorm.from_batch_norm(module, process_group)
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, process_group))
    return module


class LayerNorm(torch.nn.LayerNorm):
    """Normalises each row of ``feats`` over its C channels (``torch.nn.LayerNorm(C)``)."""

    def __init__(self, num_features: int, eps: float = 1e-5, elementwise_affine: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(num_features, eps, elementwise_affine, device=device, dtype=dtype)

    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        _check("LayerNorm", x)
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.Module):
    """``feats / sqrt(mean(feats^2 over C) + eps) * weight`` per row (``eps`` default: the dtype's
    machine epsilon, as ``torch.nn.RMSNorm``)."""

    def __init__(self, num_features: int, eps: Optional[float] = None, elementwise_affine: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("RMSNorm", x)
        return ops.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class Linear(torch.nn.Linear):
    """``feats @ W^T + b`` per row (``torch.nn.Linear`` on the feature matrix)."""

    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        _check("Linear", x)
        return ops.linear(x, self.weight, self.bias)


class ReLU(torch.nn.Module):
    """max(feats, 0)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace  # accepted for API parity; the caller's features are never modified

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("ReLU", x)
        return ops.relu(x)


class LeakyReLU(torch.nn.Module):
    """``feats`` where positive, ``negative_slope * feats`` elsewhere."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace  # accepted for API parity; never in place

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("LeakyReLU", x)
        return ops.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(torch.nn.Module):
    """GELU of the features (``approximate``: "none" or "tanh")."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("GELU", x)
        return ops.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(torch.nn.Module):
    """``feats * sigmoid(feats)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace  # accepted for API parity; never in place

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("SiLU", x)
        return ops.silu(x)


class Sigmoid(torch.nn.Module):
    """``1 / (1 + exp(-feats))``."""

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("Sigmoid", x)
        return ops.sigmoid(x)


class Tanh(torch.nn.Module):
    """``tanh(feats)``."""

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("Tanh", x)
        return ops.tanh(x)


class Softplus(torch.nn.Module):
    """``log(1 + exp(beta * feats)) / beta``, linear above ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("Softplus", x)
        return ops.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Dropout(torch.nn.Module):
    """Zeroes feature elements with probability ``p`` in training (scaling the rest by 1/(1-p));
    the identity in eval. Rows are never dropped."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p = p
        self.inplace = inplace  # accepted for API parity; never in place

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("Dropout", x)
        return ops.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
