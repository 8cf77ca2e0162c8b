"""Feature-only modules: rows and coordinate identity unchanged (dense ops on the (N, C) feature
matrix, see :mod:`lattice.ops.features`).

:class:`BatchNorm` (and :func:`batch_norm_relu`, with the ReLU fused) runs lattice's batch norm op
(:func:`lattice.ops.fused_batch_norm`, route family ``batch_norm``: one autograd node, CPU threads
and deterministic sums) whenever that is exactly what its ``torch.nn.BatchNorm1d`` child would
compute (:func:`_lattice_batch_norm`), torch's module otherwise;
``lattice.ops.fused_bn.USE_LATTICE_BATCH_NORM = False`` turns the lattice path off.

Batch normalisation and ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: :class:`BatchNorm` is a
thin module around a ``torch.nn.BatchNorm1d`` child named ``bn`` (state_dict entries
``bn.weight``, ``bn.bias``, ``bn.running_mean`` ..., as MinkowskiEngine's; checkpoints with the
flat names of the earlier BatchNorm1d subclass still load). torch's conversion replaces every ``_BatchNorm`` it
finds with a plain ``torch.nn.SyncBatchNorm``, which only accepts tensors; because the replaced
module is the child, the lattice module around it keeps handing it the feature matrix, so a
converted model still takes SparseTensors and synchronises statistics exactly like torch does for
(N, C) inputs — on CUDA only: DistributedDataParallel refuses a CPU module that contains a
``torch.nn.SyncBatchNorm``. :func:`convert_sync_batchnorm` does the conversion for every device:
it yields :class:`SyncBatchNorm` modules (a BatchNorm whose child is a :class:`SyncBatchNorm1d`,
a ``_BatchNorm`` that synchronises like torch's but is not a ``torch.nn.SyncBatchNorm`` instance,
so DDP accepts it on CPU / gloo too; same state_dict names).

When no synchronisation is needed (eval mode, or a single process without an initialised process
group) a SyncBatchNorm child runs as plain batch norm, also on CPU: torch >= 2 does this itself,
torch 1.x refuses CPU input even then, so the lattice module takes that path directly.

Synchronised training (training mode, an initialised process group of more than one process):
CUDA features go through torch's own ``SyncBatchNorm.forward`` (NCCL). torch has no synchronised batch
norm for CPU tensors (``SyncBatchNorm expected input tensor to be on GPU``), so for CPU features
(gloo) the lattice module runs :class:`_CpuSyncBatchNorm`, the same computation as torch's CUDA
one: every rank all-gathers ``(count, mean, M2)`` per channel and combines them in rank order
(Chan's parallel variance, so every rank gets bitwise the same statistics and a rank with 0 rows
takes part), normalises with the global statistics, updates the running statistics with the
global unbiased variance, and in backward all-gathers ``sum(dy)`` and ``sum(dy * x_hat)`` so the
input gradient is that of the loss summed over all ranks (the weight and bias gradients stay
local: DistributedDataParallel averages them). Every rank must run every such layer the same
number of times, in forward and backward, as with torch's.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .._autocast import autocast_dtype
from .._device import check_device
from ..ops import fused_bn as bn_ops
from ..ops import conv as conv_ops
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


def _gather_rows(t: torch.Tensor, group: Any) -> torch.Tensor:
    """(world, *t.shape): ``t`` of every rank of ``group``, in rank order."""
    parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts)


class _CpuSyncBatchNorm(torch.autograd.Function):
    """Batch norm of (N, C) CPU features with statistics over every rank of ``group`` (see the
    module docstring). Computed in float32 for 16-bit features, in the feature dtype otherwise."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor], eps: float,
                factor: float, group: Any) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        xs = x.to(acc)
        n_local = xs.shape[0]
        mean_local = xs.sum(0) / max(n_local, 1)
        m2_local = (xs - mean_local).square().sum(0)
        count = torch.full((1,), float(n_local), dtype=acc)
        stats = _gather_rows(torch.cat([count, mean_local, m2_local]), group)  # (world, 1 + 2C)
        c = xs.shape[1]
        counts, means, m2s = stats[:, 0], stats[:, 1:1 + c], stats[:, 1 + c:]
        n = float(counts.sum())
        if n <= 1:
            raise ValueError(f"[SyncBatchNorm] input: expected more than 1 row over all ranks in training, "
                             f"got {int(n)}")
        mean = (counts[:, None] * means).sum(0) / n  # rank order: the same bits on every rank
        m2 = (m2s + counts[:, None] * (means - mean).square()).sum(0)
        var = m2 / n
        invstd = torch.rsqrt(var + eps)
        xhat = (xs - mean) * invstd
        y = xhat if weight is None else xhat * weight.to(acc)
        if bias is not None:
            y = y + bias.to(acc)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1.0 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
                running_var.mul_(1.0 - factor).add_((m2 / (n - 1)).to(running_var.dtype), alpha=factor)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n, ctx.group, ctx.has_bias = n, group, bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        xhat, invstd, weight = ctx.saved_tensors
        g = dy.to(xhat.dtype)
        sum_dy, sum_dy_xhat = g.sum(0), (g * xhat).sum(0)
        c = xhat.shape[1]
        # always communicate (even if no input gradient is needed): every rank's collectives must match
        total = _gather_rows(torch.cat([sum_dy, sum_dy_xhat]), ctx.group).sum(0)
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        dx = scale * (g - total[:c] / ctx.n - xhat * (total[c:] / ctx.n))
        dw = sum_dy_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = sum_dy.to(dy.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx.to(dy.dtype), dw, db, None, None, None, None, None


def _cpu_sync_batch_norm(bn: torch.nn.SyncBatchNorm, feats: torch.Tensor) -> torch.Tensor:
    """torch's ``SyncBatchNorm.forward`` bookkeeping (num_batches_tracked, momentum None =
    cumulative average, untracked statistics) around :class:`_CpuSyncBatchNorm`."""
    if feats.dim() != 2 or feats.shape[1] != bn.num_features:
        raise ValueError(f"[SyncBatchNorm] input: expected features of shape (N, {bn.num_features}), "
                         f"got {tuple(feats.shape)}")
    factor = 0.0 if bn.momentum is None else float(bn.momentum)
    if bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else float(bn.momentum)
    track = bn.track_running_stats
    group = bn.process_group or torch.distributed.group.WORLD
    return _CpuSyncBatchNorm.apply(feats, bn.weight, bn.bias, bn.running_mean if track else None,
                                   bn.running_var if track else None, float(bn.eps), factor, group)


def _sync_forward(bn: torch.nn.Module, feats: torch.Tensor) -> torch.Tensor:
    """The forward of a synchronised batch norm ``bn`` (a torch ``SyncBatchNorm`` or a
    :class:`SyncBatchNorm1d`) on (N, C) features: torch's on CUDA, lattice's synchronised CPU batch
    norm when a CPU run needs synchronisation, plain batch norm otherwise (torch >= 2 falls back
    the same way; torch 1.x would raise "expected input tensor to be on GPU")."""
    if feats.is_cuda:
        return torch.nn.SyncBatchNorm.forward(bn, feats)  # type: ignore[arg-type]
    if _needs_sync(bn):
        return _cpu_sync_batch_norm(bn, feats)
    return torch.nn.modules.batchnorm._BatchNorm.forward(bn, feats)


class SyncBatchNorm1d(torch.nn.modules.batchnorm._BatchNorm):
    """The child of :class:`SyncBatchNorm`: a ``_BatchNorm`` over (N, C) features with torch's
    ``SyncBatchNorm`` arguments (``process_group``) whose statistics are synchronised in training
    (see the module docstring).

    It is deliberately *not* a ``torch.nn.SyncBatchNorm`` instance: DistributedDataParallel
    refuses any module containing one unless the module is on a GPU ("SyncBatchNorm layers only
    work with GPU modules"), which would rule out gloo / CPU training. On CUDA it runs torch's
    ``SyncBatchNorm.forward`` itself.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    _check_input_dim = torch.nn.SyncBatchNorm._check_input_dim
    _check_non_zero_input_channels = torch.nn.SyncBatchNorm._check_non_zero_input_channels

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        return _sync_forward(self, input)

    @classmethod
    def from_batch_norm(cls, module: torch.nn.modules.batchnorm._BatchNorm, process_group: Any = None) -> "SyncBatchNorm1d":
        """A SyncBatchNorm1d sharing ``module``'s parameters, buffers and train/eval mode (what
        ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does for one layer)."""
        out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                  process_group)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
        out.process_group = process_group if process_group is not None else getattr(module, "process_group", None)
        return out.train(module.training)


def _cpu_autocast_api() -> Any:
    """torch's "is CPU autocast on" without the deprecated API where the new one exists (chosen
    once: _autocast.autocast_dtype tries the new API per call, which raises on torch < 2.4)."""
    try:
        torch.is_autocast_enabled("cpu")  # type: ignore[call-arg]
        return lambda: torch.is_autocast_enabled("cpu")  # type: ignore[call-arg]
    except TypeError:
        return torch.is_autocast_cpu_enabled


_cpu_autocast_enabled = _cpu_autocast_api()


def _is_compiling_api() -> Any:
    """Whether dynamo (torch.compile) is tracing the caller: its graphs keep torch's batch norm
    (lattice's core call would be a graph break inside every layer; lattice._compile)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):  # torch >= 2.3
        return compiler.is_compiling
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is not None and hasattr(dynamo, "is_compiling"):  # torch 2.0 .. 2.2
        return dynamo.is_compiling
    return lambda: False  # torch 1.13: no dynamo


_is_compiling = _is_compiling_api()


def _lattice_batch_norm(bn: torch.nn.Module, feats: torch.Tensor) -> Optional[tuple]:
    """The (weight, bias, running_mean, running_var, num_batches_tracked) of ``bn`` when lattice's
    batch norm op (:func:`lattice.ops.fused_batch_norm`, route family ``batch_norm``) computes
    exactly what ``bn(feats)`` would, else None: the switch
    :data:`lattice.ops.fused_bn.USE_LATTICE_BATCH_NORM` on; ``bn`` exactly a
    ``torch.nn.BatchNorm1d`` (not a SyncBatchNorm, not a subclass) with running statistics and a
    momentum (None: torch's cumulative average), called plainly (no hooks, no tracing by
    lattice.export or torch.compile: their graphs keep torch's batch norm); (N, C)
    features of a float dtype on the CPU or a CUDA device with C = num_features; parameters and
    running statistics float32 (float64 for float64 features) on the features' device; no CPU
    autocast (under CUDA autocast torch's batch norm runs in the input's dtype with float32
    parameters, as this op). Every other case (wrong shapes and devices included, whose errors
    the torch path raises) returns None. Reads the module's dicts directly: this runs per layer
    and step, and Module.__getattr__ costs ~0.5 us a lookup."""
    if not bn_ops.USE_LATTICE_BATCH_NORM or type(bn) is not torch.nn.BatchNorm1d:
        return None
    d = bn.__dict__
    if d["momentum"] is None or not d["track_running_stats"]:
        return None
    params, buffers = d["_parameters"], d["_buffers"]
    w, b = params["weight"], params["bias"]
    rm, rv = buffers["running_mean"], buffers["running_var"]
    if rm is None or rv is None or feats.dim() != 2 or feats.shape[1] != d["num_features"]:
        return None
    dtype, device = feats.dtype, feats.device
    if dtype not in bn_ops._FEATURE_DTYPES or \
            device.type not in (bn_ops.NN_DEVICES if d["training"] else bn_ops.NN_EVAL_DEVICES):
        return None
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    for t in (w, b, rm, rv):
        if t is not None and (t.dtype != acc or t.device != device):
            return None
    if not (rm.is_contiguous() and rv.is_contiguous()):  # updated in place through DLPack
        return None
    if device.type == "cpu" and _cpu_autocast_enabled():
        return None
    if _is_compiling() or not _plain_call(bn):
        return None
    return w, b, rm, rv, buffers.get("num_batches_tracked")


def _lattice_batch_norm_forward(bn: torch.nn.BatchNorm1d, state: tuple, feats: torch.Tensor, relu: bool,
                                op: str, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``bn(feats)`` (then ReLU) through lattice's op, ``state`` from :func:`_lattice_batch_norm`;
    ``num_batches_tracked`` counts as torch's."""
    w, b, rm, rv, tracked = state
    d = bn.__dict__
    training = d["training"]
    if training and tracked is not None:
        tracked.add_(1)
    return bn_ops.BatchNormFunction.apply(feats, w, b, rm, rv, training, float(d["momentum"]), float(d["eps"]), relu,
                                          op, None, residual)


def _run_batch_norm(bn: torch.nn.Module, feats: torch.Tensor, op: str = "BatchNorm") -> torch.Tensor:
    state = _lattice_batch_norm(bn, feats)
    if state is not None:
        return _lattice_batch_norm_forward(bn, state, feats, False, op)
    _check_batch_norm_input(bn, feats, op)
    return _torch_batch_norm(bn, feats)


def _check_batch_norm_input(bn: torch.nn.Module, feats: torch.Tensor, op: str) -> None:
    if feats.shape[1] != bn.num_features:  # torch would say "running_mean should contain C elements not ..."
        raise ValueError(f"[{op}] input: expected features with C={bn.num_features} channels ({op}({bn.num_features})), "
                         f"got {feats.shape[1]} channels (shape {tuple(feats.shape)})")
    for what in ("weight", "bias", "running_mean", "running_var"):
        check_device(op, what, getattr(bn, what, None), feats.device)


def _torch_batch_norm(bn: torch.nn.Module, feats: torch.Tensor) -> torch.Tensor:
    if isinstance(bn, torch.nn.SyncBatchNorm) and not feats.is_cuda:
        # a child converted by torch's convert_sync_batchnorm: lattice's CPU path (DDP refuses a
        # CPU module holding a torch SyncBatchNorm, but a process group without DDP works)
        return _sync_forward(bn, feats)
    return bn(feats)


class BatchNorm(torch.nn.Module):
    """Batch normalisation over the rows of ``feats`` (N, C): batch statistics in training, running
    statistics in eval — ``torch.nn.BatchNorm1d`` (the child ``bn``) on the feature matrix.

    Arguments are those of ``torch.nn.BatchNorm1d``; ``weight``, ``bias``, ``running_mean``,
    ``running_var``, ``eps``, ``momentum`` ... read through to the child. See the module docstring for
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``. The computation is lattice's batch norm op
    when that equals the child's (:func:`_lattice_batch_norm`), else the child itself.
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
    across the processes of the group in distributed training (torch's for CUDA features,
    lattice's for CPU features / gloo, see the module docstring), plain batch norm otherwise."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        torch.nn.Module.__init__(self)
        self.bn = SyncBatchNorm1d(num_features, eps, momentum, affine, track_running_stats, process_group,
                                  device=device, dtype=dtype)

    @classmethod
    def from_batch_norm(cls, module: BatchNorm, process_group: Any = None) -> "SyncBatchNorm":
        """A SyncBatchNorm sharing ``module``'s parameters and buffers (and its train/eval mode)."""
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        out.bn = SyncBatchNorm1d.from_batch_norm(module.bn, process_group)
        out.train(module.training)
        return out

    process_group = property(lambda self: self.bn.process_group)


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


def _lattice_linear(x: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether :class:`Linear` runs as lattice's kernel-1 submanifold conv (the pointwise route):
    float32 CPU features, weight and bias, shapes valid, and nobody tracing torch functions
    (lattice.export's TorchFunctionMode must see ``F.linear``) or autocasting."""
    f = x.feats
    if f.is_cuda or f.dtype != torch.float32 or f.dim() != 2 or weight.dtype != torch.float32:
        return False
    if weight.device != f.device or weight.dim() != 2 or f.shape[1] != weight.shape[1]:
        return False
    if bias is not None and (bias.dtype != torch.float32 or bias.device != f.device or
                             tuple(bias.shape) != (weight.shape[0],)):
        return False
    if torch.overrides._is_torch_function_mode_enabled() or autocast_dtype(f.device) is not None:
        return False
    return True


class Linear(torch.nn.Linear):
    """``feats @ W^T + b`` per row (``torch.nn.Linear`` on the feature matrix).

    float32 CPU features run as a kernel-1 submanifold conv (lattice's pointwise route: the
    fused f32 kernels on lattice's threads, the same matmul up to rounding) instead of torch's
    BLAS: Debian's torch calls OpenBLAS's own thread pool, which competed with lattice's threads
    (MinkUNet42's classifier backward took 0.05-1.9 s on the 2-core machine; docs/performance.md,
    "Issue 17: the phases outside the GEMMs, the pointwise route and Linear"). Every other case,
    and lattice.export's tracing, runs ``F.linear``.
    """

    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        _check("Linear", x)
        if _lattice_linear(x, self.weight, self.bias):
            w = self.weight.view(self.weight.shape[0], 1, 1, 1, self.weight.shape[1])
            return conv_ops.subm_conv3d(x, w, self.bias, kernel_size=1)
        return ops.linear(x, self.weight, self.bias)


class ReLU(torch.nn.Module):
    """max(feats, 0)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace  # accepted for API parity; the caller's features are never modified

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("ReLU", x)
        return ops.relu(x)


def _plain_call(*modules: torch.nn.Module) -> bool:
    """True when calling these modules' ``forward`` directly is indistinguishable from calling
    the modules: no forward (pre-)hooks on them or globally, no instance-level ``forward`` (what
    lattice.export's tracer installs), and no TorchFunctionMode watching torch calls."""
    from torch.nn.modules import module as _m
    if _m._global_forward_hooks or _m._global_forward_pre_hooks:
        return False
    if torch.overrides._is_torch_function_mode_enabled():
        return False
    return all(not m._forward_hooks and not m._forward_pre_hooks and "forward" not in m.__dict__ for m in modules)


def batch_norm_relu(bn: torch.nn.Module, relu: torch.nn.Module, x: SparseTensor) -> SparseTensor:
    """``relu(bn(x))`` for lattice.models' blocks. When ``bn`` is a lattice :class:`BatchNorm`
    (or :class:`SyncBatchNorm`) and ``relu`` a :class:`ReLU`, both called plainly (no hooks, no
    tracing), the ReLU runs in place on the batch norm's output: that tensor is fresh (torch's
    batch norm allocates it and nobody else has seen it) and batch norm's backward does not read
    it, so the values and gradients are those of ``relu(bn(x))`` exactly, minus one allocation and
    one pass over the features (issue 17: -25 to -35% of the pair's forward on kitti-sized
    matrices). When lattice's batch norm op applies (:func:`_lattice_batch_norm`: a plain
    BatchNorm1d child, float features on CPU or CUDA, ...) batch norm and ReLU are one lattice
    autograd node instead (route family ``batch_norm``: the ReLU fused into the normalisation
    kernel, its backward masking dy by the saved output). Otherwise the two modules are called as
    usual."""
    if type(bn) in (BatchNorm, SyncBatchNorm) and type(relu) is ReLU and _plain_call(bn, relu):
        _check("ReLU", x)
        feats = x.feats
        child = bn.__dict__["_modules"]["bn"]
        state = _lattice_batch_norm(child, feats)
        if state is not None:  # one fused node: batch norm and ReLU
            return x.replace_feats(_lattice_batch_norm_forward(child, state, feats, True, type(bn).__name__))
        _check_batch_norm_input(child, feats, type(bn).__name__)
        return x.replace_feats(torch.relu_(_torch_batch_norm(child, feats)))
    return relu(bn(x))


def batch_norm_add_relu(bn: torch.nn.Module, relu: torch.nn.Module, x: SparseTensor, skip: SparseTensor) -> SparseTensor:
    """``relu(bn(x) + skip)`` for lattice.models' residual blocks (the coordinates of ``x``, the
    rows of ``skip`` added row by row, as :func:`add_relu`). Where lattice's batch norm op applies
    (as in :func:`batch_norm_relu`) on a device of
    :data:`lattice.ops.fused_bn.NN_RESIDUAL_DEVICES`, the batch norm, the sum and the ReLU are one
    lattice autograd node and one pass over the features (the sum made before rounding, so within
    one rounding of the three ops); otherwise ``add_relu(relu, bn(x), skip)``."""
    if type(bn) in (BatchNorm, SyncBatchNorm) and type(relu) is ReLU and _plain_call(bn, relu):
        feats, other = x.feats, skip.feats
        if feats.device.type in bn_ops.NN_RESIDUAL_DEVICES and other.shape == feats.shape and \
                other.dtype == feats.dtype and other.device == feats.device:
            _check(type(bn).__name__, x)
            child = bn.__dict__["_modules"]["bn"]
            state = _lattice_batch_norm(child, feats)
            if state is not None:
                return x.replace_feats(_lattice_batch_norm_forward(child, state, feats, True, type(bn).__name__,
                                                                   residual=other))
    return add_relu(relu, bn(x), skip)


def add_relu(relu: torch.nn.Module, a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """``relu(a + b)`` on the features of ``a`` (the residual sum of lattice.models' blocks), with
    the ReLU in place on the fresh sum when ``relu`` is a plainly called :class:`ReLU` (the sum's
    backward does not read it); otherwise ``relu`` is called on the sum."""
    if type(relu) is ReLU and _plain_call(relu):
        return a.replace_feats(torch.relu_(a.feats + b.feats))
    return relu(a.replace_feats(a.feats + b.feats))


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
