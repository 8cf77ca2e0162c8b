"""Float64 oracle of batch normalisation (+ ReLU) over the rows of an (N, C) feature matrix:
torch.nn.BatchNorm1d's semantics, written out with numpy (imports only numpy).

Training: per channel mean and biased variance of the rows normalise; the running statistics
become (1 - momentum) * running + momentum * batch, with the unbiased variance (N / (N - 1)).
Eval: the running statistics normalise. Then ReLU when ``relu``.
Backward (training): dx = gamma * invstd * (dy' - mean(dy') - xhat * mean(dy' * xhat)); eval:
dx = gamma * invstd * dy'; dgamma = sum(dy' * xhat), dbeta = sum(dy'); dy' = dy where y > 0
(relu) else dy. With a ``residual`` r: y = relu(bn(x) + r), dy' masked by that y, and the
residual's gradient is dy'.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["batch_norm_forward", "batch_norm_backward"]


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _stats(x: np.ndarray, running_mean: Optional[Any], running_var: Optional[Any], training: bool, eps: float):
    if training:
        mean = x.mean(axis=0)
        var = ((x - mean) ** 2).mean(axis=0)  # biased, two-pass
    else:
        mean, var = _f(running_mean), _f(running_var)
    return mean, var, 1.0 / np.sqrt(var + eps)


def batch_norm_forward(x: Any, weight: Any = None, bias: Any = None, running_mean: Any = None, running_var: Any = None,
                       training: bool = True, momentum: float = 0.1, eps: float = 1e-5, relu: bool = False,
                       residual: Any = None):
    """(y, new_running_mean, new_running_var, mean, invstd); the running statistics are returned
    updated (training) or unchanged (eval), None when not given. ``residual`` (N, C) is added
    before the ReLU."""
    v = _f(x)
    n, c = v.shape
    mean, var, invstd = _stats(v, running_mean, running_var, training, eps)
    g = np.ones(c) if weight is None else _f(weight)
    b = np.zeros(c) if bias is None else _f(bias)
    y = (v - mean) * invstd * g + b
    if residual is not None:
        y = y + _f(residual)
    if relu:
        y = np.maximum(y, 0.0)
    rm = None if running_mean is None else _f(running_mean).copy()
    rv = None if running_var is None else _f(running_var).copy()
    if training and rm is not None:
        rm = (1.0 - momentum) * rm + momentum * mean
        rv = (1.0 - momentum) * rv + momentum * var * (n / (n - 1))
    return y, rm, rv, mean, invstd


def batch_norm_backward(x: Any, dy: Any, weight: Any = None, bias: Any = None, running_mean: Any = None,
                        running_var: Any = None, training: bool = True, eps: float = 1e-5, relu: bool = False,
                        residual: Any = None):
    """(dx, dweight, dbias) of the forward's output at these inputs; with ``residual``,
    (dx, dweight, dbias, dresidual)."""
    v, d = _f(x), _f(dy)
    n, c = v.shape
    mean, _, invstd = _stats(v, running_mean, running_var, training, eps)
    g = np.ones(c) if weight is None else _f(weight)
    xhat = (v - mean) * invstd
    if relu:
        b = np.zeros(c) if bias is None else _f(bias)
        pre = xhat * g + b + (0.0 if residual is None else _f(residual))
        d = np.where(pre > 0.0, d, 0.0)
    dbias = d.sum(axis=0)
    dweight = (d * xhat).sum(axis=0)
    if training:
        dx = g * invstd * (d - d.mean(axis=0) - xhat * (d * xhat).mean(axis=0))
    else:
        dx = g * invstd * d
    if residual is not None:
        return dx, dweight, dbias, d
    return dx, dweight, dbias
