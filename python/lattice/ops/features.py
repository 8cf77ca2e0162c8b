"""Feature ops: functions of the feature matrix alone. Rows, coordinates and the coordinate
identity (``key``) are unchanged, so relations cached for the input are reused by the output.

They are dense ops on the (N, C) feature matrix — thin wrappers over ``torch.nn.functional``
(autograd and devices are torch's) that check their input is a SparseTensor. They run no lattice
route: ``lattice.explain(op)`` says so (torch's dense kernel on the feature matrix). The one
exception is batch normalisation as :class:`lattice.nn.BatchNorm` runs it:
:func:`lattice.ops.fused_batch_norm` (:mod:`lattice.ops.fused_bn`, route family ``batch_norm``,
optionally with a fused ReLU) is lattice's own op; :func:`batch_norm` here stays torch's.
float16/bfloat16 features on the CPU are computed in float32 and rounded once at the end (torch's CPU kernels do not cover every op in
16-bit, and this matches lattice's f32 accumulation rule); elsewhere torch's own kernels run.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .._device import check_device
from ..tensor import SparseTensor


_LOW = (torch.float16, torch.bfloat16)


def _widen(feats: torch.Tensor) -> bool:
    return feats.dtype in _LOW and not feats.is_cuda


def _wide(t: Optional[torch.Tensor], widen: bool) -> Optional[torch.Tensor]:
    return t.float() if (widen and t is not None) else t


def _map(x: SparseTensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> SparseTensor:
    """x with features fn(feats), 16-bit CPU features computed in float32 and rounded once."""
    f = x.feats
    if _widen(f):
        return x.replace_feats(fn(f.float()).to(f.dtype))
    return x.replace_feats(fn(f))


def _check(op: str, x: Any) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"[{op}] input: expected a lattice.SparseTensor, got {type(x).__name__}")
    return x


def _check_vector(op: str, what: str, v: Any, c: int, device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    """None, or a 1-D tensor of C entries (per-channel parameters and statistics) on ``device``."""
    if v is None:
        return None
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"[{op}] {what}: expected a torch.Tensor of shape (C={c},) or None, got {type(v).__name__}")
    if tuple(v.shape) != (c,):
        raise ValueError(f"[{op}] {what}: expected shape (C={c},), got {tuple(v.shape)}")
    if device is not None:
        check_device(op, what, v, device)
    return v


def _check_number(op: str, what: str, v: Any, expected: str = "a real number",
                  ok: Callable[[float], bool] = lambda f: True) -> float:
    """A real number (not bool, not NaN) accepted by ``ok``; ``expected`` describes the accepted range."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"[{op}] {what}: expected a real number, got {type(v).__name__}")
    f = float(v)
    if f != f or not ok(f):
        raise ValueError(f"[{op}] {what}: expected {expected}, got {v!r}")
    return f


def cat(tensors: Sequence[SparseTensor]) -> SparseTensor:
    """Concatenates features of tensors that share one coordinate identity (same ``key``).

    This is the U-Net skip concatenation: a transposed conv onto the skip's coordinates returns
    the skip's identity, so its features line up row by row. Tensors with different identities
    raise ValueError (align them first, e.g. with :func:`lattice.ops.sparse_cat_aligned`).
    """
    if not tensors:
        raise ValueError("[cat] tensors: expected at least one SparseTensor, got an empty sequence")
    for i, t in enumerate(tensors):
        if not isinstance(t, SparseTensor):
            raise TypeError(f"[cat] tensors[{i}]: expected a lattice.SparseTensor, got {type(t).__name__}")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], start=1):
        if t.key != first.key:
            from .conv import GENERATED

            msg = (f"[cat] tensors[{i}]: expected the coordinate identity of tensors[0] (key {first.key}), "
                   f"got key {t.key} ({len(first)} vs {len(t)} rows)")
            for j, u in ((0, first), (i, t)):
                if u.key in GENERATED:
                    n_in, n_out, op = GENERATED[u.key]
                    other = i if j == 0 else 0
                    msg += (f"; tensors[{j}] comes from {op} (nn.ConvTranspose3d) called without coordinates=, "
                            f"which generated its own {n_out} rows from {n_in} inputs instead of landing on the "
                            f"skip's rows: pass the skip tensor as coordinates= (here tensors[{other}]: "
                            f"up(x, coordinates=skip)), so the output carries the skip's coordinate key "
                            f"(key {tensors[other].key}) (TorchSparse and MinkowskiEngine reuse the encoder's "
                            f"coordinates implicitly)")
                    break
            raise ValueError(msg)
    return first.replace_feats(torch.cat([t.feats for t in tensors], dim=1))


def linear(input: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           route: Optional[str] = None) -> SparseTensor:
    """``feats @ weight^T + bias`` per row (``torch.nn.functional.linear``); weight (C_out, C_in).

    ``weight`` may be a ``lattice.QuantizedWeight`` of layout ``linear`` (inference only; routes
    ``fused_dequant_gemm`` / ``cuda_decode_conv`` / ``cuda_dequant_gemm`` / ``dequant_reference``, chosen by ``route`` or
    the route table, see ``lattice.ops.quantized``). A float weight runs torch's dense kernel (``route`` must be None).
    """
    x = _check("linear", input)
    c = x.feats.shape[1]
    from . import quantized as _quantized  # lazy: quantized imports the core
    if _quantized.is_quantized(weight):  # torch.autocast: activations and bias in its dtype (_autocast.py)
        from .._autocast import autocast_dtype, cast
        amp = autocast_dtype(x.feats.device)
        return x.replace_feats(_quantized.linear_forward(cast(x.feats, amp), weight, cast(bias, amp), route))
    if route is not None:
        raise ValueError(f"[linear] route: expected None for a float weight (torch's dense kernel), got {route!r}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"[linear] weight: expected a torch.Tensor of shape (C_out, C_in={c}), got {type(weight).__name__}")
    if weight.dim() != 2 or weight.shape[1] != c:
        raise ValueError(f"[linear] weight: expected shape (C_out, C_in={c}), got {tuple(weight.shape)}")
    check_device("linear", "weight", weight, x.device)
    _check_vector("linear", "bias", bias, int(weight.shape[0]), x.device)
    w = _widen(x.feats)
    return _map(x, lambda f: F.linear(f, _wide(weight, w), _wide(bias, w)))


def relu(input: SparseTensor) -> SparseTensor:
    """``max(feats, 0)`` (never in place: the caller's features are not modified)."""
    x = _check("relu", input)
    return _map(x, F.relu)


def leaky_relu(input: SparseTensor, negative_slope: float = 0.01) -> SparseTensor:
    """``feats`` where positive, ``negative_slope * feats`` elsewhere."""
    x = _check("leaky_relu", input)
    s = _check_number("leaky_relu", "negative_slope", negative_slope)
    return _map(x, lambda f: F.leaky_relu(f, s))


def gelu(input: SparseTensor, approximate: str = "none") -> SparseTensor:
    """GELU of the features; ``approximate``: "none" (erf) or "tanh"."""
    x = _check("gelu", input)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"[gelu] approximate: expected 'none' or 'tanh', got {approximate!r}")
    return _map(x, lambda f: F.gelu(f, approximate=approximate))


def silu(input: SparseTensor) -> SparseTensor:
    """``feats * sigmoid(feats)``."""
    x = _check("silu", input)
    return _map(x, F.silu)


def sigmoid(input: SparseTensor) -> SparseTensor:
    """``1 / (1 + exp(-feats))``."""
    x = _check("sigmoid", input)
    return _map(x, torch.sigmoid)


def tanh(input: SparseTensor) -> SparseTensor:
    """``tanh(feats)``."""
    x = _check("tanh", input)
    return _map(x, torch.tanh)


def softplus(input: SparseTensor, beta: float = 1.0, threshold: float = 20.0) -> SparseTensor:
    """``log(1 + exp(beta * feats)) / beta``, linear above ``threshold`` (``beta > 0``)."""
    x = _check("softplus", input)
    b = _check_number("softplus", "beta", beta, "a positive value", lambda f: f > 0)
    t = _check_number("softplus", "threshold", threshold)
    return _map(x, lambda f: F.softplus(f, b, t))


def batch_norm(
    input: SparseTensor,
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> SparseTensor:
    """Batch normalisation over the rows (``torch.nn.functional.batch_norm`` on the (N, C) matrix).

    ``training=True`` normalises with the statistics of these rows (biased variance) and updates
    the running statistics in place when given; ``training=False`` uses ``running_mean`` /
    ``running_var`` (required then).
    """
    op = "batch_norm"
    x = _check(op, input)
    c = x.feats.shape[1]
    for what, v in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        _check_vector(op, what, v, c, x.device)
    if not training and (running_mean is None or running_var is None):
        missing = "running_mean" if running_mean is None else "running_var"
        raise ValueError(f"[{op}] {missing}: expected running statistics when training=False, got None")
    m = _check_number(op, "momentum", momentum, "a value in [0, 1]", lambda f: 0 <= f <= 1)
    e = _check_number(op, "eps", eps, "a positive value", lambda f: f > 0)
    if not _widen(x.feats):
        return x.replace_feats(F.batch_norm(x.feats, running_mean, running_var, weight, bias, bool(training), m, e))
    # 16-bit on the CPU: float32 math; running statistics of another dtype are updated through
    # float32 copies written back in place.
    stats = [s if s is None or s.dtype == torch.float32 else s.float() for s in (running_mean, running_var)]
    y = F.batch_norm(x.feats.float(), stats[0], stats[1], _wide(weight, True), _wide(bias, True), bool(training), m, e)
    with torch.no_grad():
        for original, wide in zip((running_mean, running_var), stats):
            if original is not None and wide is not original:
                original.copy_(wide)
    return x.replace_feats(y.to(x.feats.dtype))


def layer_norm(input: SparseTensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> SparseTensor:
    """Normalises each row over its C channels (``torch.nn.functional.layer_norm`` with shape (C,))."""
    op = "layer_norm"
    x = _check(op, input)
    c = x.feats.shape[1]
    _check_vector(op, "weight", weight, c, x.device)
    _check_vector(op, "bias", bias, c, x.device)
    e = _check_number(op, "eps", eps, "a positive value", lambda f: f > 0)
    w = _widen(x.feats)
    return _map(x, lambda f: F.layer_norm(f, (c,), _wide(weight, w), _wide(bias, w), e))


def rms_norm(input: SparseTensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None) -> SparseTensor:
    """``feats / sqrt(mean(feats^2 over C) + eps) * weight`` per row.

    ``eps`` defaults to ``torch.finfo(dtype).eps`` (as ``torch.nn.RMSNorm``); float16/bfloat16 are
    computed in float32 and rounded once.
    """
    op = "rms_norm"
    x = _check(op, input)
    c = x.feats.shape[1]
    _check_vector(op, "weight", weight, c, x.device)
    f = x.feats
    e = torch.finfo(f.dtype).eps if eps is None else _check_number(op, "eps", eps, "a value >= 0", lambda f: f >= 0)
    acc = f.float() if f.dtype in (torch.float16, torch.bfloat16) else f
    y = acc * torch.rsqrt(acc.pow(2).mean(dim=1, keepdim=True) + e)
    if weight is not None:
        y = y * weight.to(y.dtype)
    return x.replace_feats(y.to(f.dtype))


def dropout(input: SparseTensor, p: float = 0.5, training: bool = True) -> SparseTensor:
    """Zeroes each feature element with probability ``p`` and scales the rest by ``1 / (1 - p)``
    (torch's RNG); the identity when ``training=False``. Rows are never dropped."""
    op = "dropout"
    x = _check(op, input)
    q = _check_number(op, "p", p, "a probability in [0, 1]", lambda f: 0 <= f <= 1)
    return _map(x, lambda f: F.dropout(f, q, bool(training)))
