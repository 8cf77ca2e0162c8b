"""Public diagnostics: which route runs for a call and why, and what this build can do."""
from __future__ import annotations

from typing import Any

import torch

from ._core import as_tensor, core, threads_settled_by_user, to_core
from .ops import conv as _conv
from .ops import point_voxel as _point_voxel
from .ops import pool as _pool
from .ops import algebra as _algebra
from .ops import fused_bn as _batch_norm
from .ops import coords as _coords
from .ops import quantized as _quantized

_KIND = {
    "conv3d": lambda kw: "target" if kw.get("coordinates") is not None else "forward",
    "subm_conv3d": lambda kw: "submanifold",
    "conv_transpose3d": lambda kw: "transposed_target" if kw.get("coordinates") is not None else "transposed",
    "generative_conv_transpose3d": lambda kw: "generative",
}

# Feature ops (lattice.ops.features): torch's dense kernels on the feature matrix, no lattice route
# (lattice.ops.fused_batch_norm, the batch norm lattice.nn.BatchNorm runs, has its route table).
FEATURE_OPS = ("relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "linear", "batch_norm",
               "layer_norm", "rms_norm", "dropout")


class FeatureOpExplanation:
    """``lattice.explain`` of a feature op: it runs no lattice route (``chosen`` is None, ``rows``
    empty) but torch's dense kernel on the (N, C) feature matrix; rows and coordinate identity are
    unchanged."""

    __slots__ = ("op",)
    chosen = None
    rows = ()

    def __init__(self, op: str) -> None:
        self.op = op

    def __str__(self) -> str:
        return (f"{self.op}: no lattice route; runs torch's dense kernel on the (N, C) feature matrix, "
                f"rows and coordinate identity unchanged")

    __repr__ = __str__


def explain(op: str, *args: Any, pass_: str = "forward", **kwargs: Any) -> Any:
    """The route decision for ``op`` called with these arguments, without running it.

    ``lattice.explain("subm_conv3d", x, w, kernel_size=3)`` takes exactly the arguments of
    ``lattice.ops.subm_conv3d``; ``pass_`` picks "forward", "input_grad" or "weight_grad".
    The result prints as a table: the chosen route and every other route with its verdict and,
    when rejected, the reason. Attributes: ``chosen``, ``rows``, ``problem``, ``caps``.
    Feature ops (``relu``, ``linear``, ``batch_norm``, ...) give a :class:`FeatureOpExplanation`
    saying they run torch's dense kernel on the feature matrix (no lattice route).
    """
    if op in _KIND:
        if len(args) < 2:
            raise TypeError(f"[explain] args: expected the op's (input, weight, ...) arguments, got {len(args)} values")
        x, weight = args[0], args[1]  # a positional bias (args[2]) does not change the decision
        kw = dict(kwargs)
        kw.pop("bias", None)
        if _quantized.is_quantized(weight):  # packed weight: the "quantized" route table (forward only)
            route = kw.pop("route", None)
            p = _conv.plan(op, _KIND[op](kw), x, weight, **kw)
            return _quantized.explain_conv(p, x.feats, weight, route)
        p = _conv.plan(op, _KIND[op](kw), x, weight, **kw)
        return core.explain_conv(p, to_core(x.feats), to_core(weight), pass_)
    if op == "linear" and len(args) >= 2 and _quantized.is_quantized(args[1]):
        return _quantized.explain_linear(args[0].feats, args[1], kwargs.get("route"))
    if op == "sparse_quantize":
        return core.explain_quantize(to_core(as_tensor(args[0], "points", op)))
    if op in _point_voxel.EXPLAINED:
        return _point_voxel.explain(op, *args, pass_=pass_, **kwargs)
    if op in _pool.POOL_OPS:
        return _pool.explain_pool(op, args, kwargs, pass_)
    if op in _algebra.EXPLAINED:
        return _algebra.explain(op, *args, pass_=pass_, **kwargs)
    if op == "fused_batch_norm":
        return _batch_norm.explain(args[0] if args else kwargs.get("input"), training=bool(kwargs.get("training", False)),
                                   relu=bool(kwargs.get("relu", False)), pass_=pass_)
    if op in _coords.EXPLAINED:
        return _coords.explain(op, *args, **kwargs)
    if op in FEATURE_OPS:
        return FeatureOpExplanation(op)
    known = ", ".join(sorted([*_KIND, "sparse_quantize", *_point_voxel.EXPLAINED, *_pool.POOL_OPS,
                              *_algebra.EXPLAINED, *_coords.EXPLAINED, *FEATURE_OPS, "fused_batch_norm"]))
    raise ValueError(f"[explain] op: expected one of {known}, got {op!r}")


def backend_info() -> str:
    """Build flags, CPU threads/ISA/BLAS and the CUDA status and tier, as text."""
    from . import _host_memory

    heap = ("keeps freed large blocks (set at import; LATTICE_HOST_MALLOC=default turns it off)"
            if _host_memory.host_malloc_tuned() else "glibc defaults")
    return core.backend_info() + f"  torch: {torch.__version__}\n  host heap: {heap}\n"


def device_caps() -> dict:
    """The capabilities the route layer sees, as a dict (cpu: threads/isa/blas, cuda: built/sm/tier/...)."""
    return core.device_caps()


def get_num_threads() -> int:
    """CPU threads lattice's own kernels use (independent of ``torch.get_num_threads()``)."""
    return int(core.get_num_threads())


def set_num_threads(n: int) -> None:
    """Sets the CPU threads lattice's kernels use. Default: LATTICE_NUM_THREADS, else
    OMP_NUM_THREADS, else the CPUs this process may use (its affinity mask, capped by a cgroup CPU
    quota such as ``docker --cpus``); 1 inside a torch DataLoader worker unless
    LATTICE_NUM_THREADS is set or the worker calls this. Results do not depend on the count."""
    core.set_num_threads(int(n))
    threads_settled_by_user()
