"""Float64 oracle of the feature ops (functions of the (N, C) feature matrix alone).

Imports only numpy (and math); formulas written out for obvious correctness.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "linear", "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus",
    "batch_norm", "layer_norm", "rms_norm",
]


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def linear(x: Any, w: Any, b: Any = None) -> np.ndarray:
    out = _f(x) @ _f(w).T
    return out if b is None else out + _f(b)


def relu(x: Any) -> np.ndarray:
    return np.maximum(_f(x), 0.0)


def leaky_relu(x: Any, slope: float = 0.01) -> np.ndarray:
    v = _f(x)
    return np.where(v > 0, v, slope * v)


def gelu(x: Any, approximate: str = "none") -> np.ndarray:
    v = _f(x)
    if approximate == "tanh":
        return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))


def sigmoid(x: Any) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_f(x)))


def silu(x: Any) -> np.ndarray:
    return _f(x) * sigmoid(x)


def tanh(x: Any) -> np.ndarray:
    return np.tanh(_f(x))


def softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    v = _f(x)
    return np.where(beta * v > threshold, v, np.log1p(np.exp(beta * v)) / beta)


def batch_norm(x: Any, mean: Any = None, var: Any = None, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> np.ndarray:
    """Normalise columns with the given statistics, or with the rows' own (biased variance)."""
    v = _f(x)
    m = v.mean(axis=0) if mean is None else _f(mean)
    s = v.var(axis=0) if var is None else _f(var)
    out = (v - m) / np.sqrt(s + eps)
    if weight is not None:
        out = out * _f(weight)
    if bias is not None:
        out = out + _f(bias)
    return out


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> np.ndarray:
    v = _f(x)
    out = (v - v.mean(axis=1, keepdims=True)) / np.sqrt(v.var(axis=1, keepdims=True) + eps)
    if weight is not None:
        out = out * _f(weight)
    if bias is not None:
        out = out + _f(bias)
    return out


def rms_norm(x: Any, weight: Any = None, eps: float = 1e-6) -> np.ndarray:
    v = _f(x)
    out = v / np.sqrt((v**2).mean(axis=1, keepdims=True) + eps)
    return out if weight is None else out * _f(weight)
