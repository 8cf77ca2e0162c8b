"""Float64 reference convolution, weight layout converters and tolerances.

``Y[o, :] = sum over edges (i, o, k) of X[i, :] @ W[k]  (+ bias)``, with
``W[k]`` of shape ``(C_in, C_out)``. Everything is computed in float64; the
caller rounds inputs to the storage dtype first (:func:`round_to_dtype`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .geometry import as_triple

__all__ = [
    "TOLERANCES",
    "assert_close",
    "conv_backward",
    "conv_forward",
    "round_to_dtype",
    "tolerance",
    "weight_from_kcc",
    "weight_to_kcc",
]

# Relative tolerances per storage / compute dtype (SEMANTICS.md, "Numerics").
TOLERANCES: dict[str, float] = {
    "f64": 1e-12,
    "f32": 1e-5,
    "tf32": 5e-4,
    "f16": 2e-3,
    "bf16": 1e-2,
}

# Absolute floor of the comparison scale (see assert_close).
SCALE_FLOOR: float = 1e-3


def _f64(a: Any) -> np.ndarray:
    """Convert an array-like to a float64 numpy array.

    Duck-types torch tensors (``.detach()``) without importing torch; bf16
    tensors, which numpy cannot hold, go through float32 first (exact).
    """
    if hasattr(a, "detach"):
        a = a.detach().cpu()
        try:
            a = a.numpy()
        except TypeError:  # bfloat16 has no numpy dtype; float32 holds it exactly
            a = a.float().numpy()
    return np.asarray(a, dtype=np.float64)


def _edges(in_idx: Any, out_idx: Any, k_idx: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edge arrays as int64, equal length checked."""
    i = np.asarray(in_idx, dtype=np.int64).reshape(-1)
    o = np.asarray(out_idx, dtype=np.int64).reshape(-1)
    k = np.asarray(k_idx, dtype=np.int64).reshape(-1)
    if not (i.shape == o.shape == k.shape):
        raise ValueError(f"edge arrays differ in length: {i.shape} {o.shape} {k.shape}")
    return i, o, k


def conv_forward(
    x: Any,
    w: Any,
    in_idx: Any,
    out_idx: Any,
    k_idx: Any,
    n_out: int,
    bias: Any = None,
) -> np.ndarray:
    """Sparse convolution over an explicit edge list, in float64.

    Args:
        x: ``(N_in, C_in)`` input features.
        w: ``(K, C_in, C_out)`` kernel-major weight.
        in_idx, out_idx, k_idx: ``(E,)`` edges.
        n_out: number of output rows.
        bias: optional ``(C_out,)``.

    Returns:
        ``(n_out, C_out)`` float64; ``Y[o] = sum_e X[i_e] @ W[k_e]`` (+ bias);
        rows with no edge are 0 (+ bias).
    """
    x64 = _f64(x)
    w64 = _f64(w)
    if x64.ndim != 2 or w64.ndim != 3 or w64.shape[1] != x64.shape[1]:
        raise ValueError(f"shape mismatch: x {x64.shape}, w {w64.shape}")
    i_arr, o_arr, k_arr = _edges(in_idx, out_idx, k_idx)
    y = np.zeros((int(n_out), w64.shape[2]), dtype=np.float64)
    for i, o, k in zip(i_arr, o_arr, k_arr):
        y[o] += x64[i] @ w64[k]
    if bias is not None:
        y += _f64(bias).reshape(1, -1)
    return y


def conv_backward(
    x: Any,
    w: Any,
    dy: Any,
    in_idx: Any,
    out_idx: Any,
    k_idx: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`conv_forward`, in float64.

    Returns ``(dx, dw, db)`` with
    ``dx[i] = sum_e dY[o_e] @ W[k_e]^T`` (shape of x),
    ``dW[k] = sum_e outer(X[i_e], dY[o_e])`` (shape of w),
    ``db = dY.sum(0)``.
    """
    x64 = _f64(x)
    w64 = _f64(w)
    dy64 = _f64(dy)
    if dy64.ndim != 2 or dy64.shape[1] != w64.shape[2]:
        raise ValueError(f"shape mismatch: dy {dy64.shape}, w {w64.shape}")
    i_arr, o_arr, k_arr = _edges(in_idx, out_idx, k_idx)
    dx = np.zeros_like(x64)
    dw = np.zeros_like(w64)
    for i, o, k in zip(i_arr, o_arr, k_arr):
        dx[i] += dy64[o] @ w64[k].T
        dw[k] += np.outer(x64[i], dy64[o])
    db = dy64.sum(axis=0)
    return dx, dw, db


def weight_to_kcc(w: Any) -> np.ndarray:
    """Dense layout ``(C_out, Kx, Ky, Kz, C_in)`` -> kernel-major ``(K, C_in, C_out)``.

    Kernel row ``(x*Ky + y)*Kz + z``: ``wk[(x*Ky+y)*Kz+z, ci, co] == w[co, x, y, z, ci]``.
    """
    a = np.asarray(w)
    if a.ndim != 5:
        raise ValueError(f"expected (C_out, Kx, Ky, Kz, C_in), got shape {a.shape}")
    c_out, kx, ky, kz, c_in = a.shape
    # (Kx, Ky, Kz, C_in, C_out); C-order reshape makes z fastest.
    return np.ascontiguousarray(a.transpose(1, 2, 3, 4, 0)).reshape(kx * ky * kz, c_in, c_out)


def weight_from_kcc(wk: Any, kernel_size: int | Sequence[int]) -> np.ndarray:
    """Inverse of :func:`weight_to_kcc`: ``(K, C_in, C_out)`` -> ``(C_out, Kx, Ky, Kz, C_in)``."""
    a = np.asarray(wk)
    kx, ky, kz = as_triple(kernel_size, "kernel_size")
    if a.ndim != 3 or a.shape[0] != kx * ky * kz:
        raise ValueError(f"expected ({kx * ky * kz}, C_in, C_out), got shape {a.shape}")
    _, c_in, c_out = a.shape
    return np.ascontiguousarray(a.reshape(kx, ky, kz, c_in, c_out).transpose(4, 0, 1, 2, 3))


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (round to nearest, ties to even) and return float64.

    The value is first cast to float32 (numpy rounding), then the low 16 bits
    of the float32 pattern are rounded away: add ``0x7FFF`` plus the lowest
    kept bit, then clear the low 16 bits. Overflow rounds to inf as in IEEE;
    NaN stays NaN.
    """
    f32 = np.ascontiguousarray(a, dtype=np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    lsb = (bits >> np.uint64(16)) & np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + lsb) & np.uint64(0xFFFF0000)
    out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isnan(f32), np.nan, out)


def round_to_dtype(a: Any, dtype_name: str) -> np.ndarray:
    """Round values to a storage dtype and return them as float64.

    ``'f64'``, ``'f32'``, ``'f16'``: numpy casting (round to nearest even).
    ``'tf32'``: storage is float32, so same as ``'f32'``.
    ``'bf16'``: see :func:`_round_bf16`.
    """
    x = _f64(a)
    if dtype_name == "f64":
        return x.copy()
    if dtype_name in ("f32", "tf32"):
        return x.astype(np.float32).astype(np.float64)
    if dtype_name == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)
    if dtype_name == "bf16":
        return _round_bf16(x)
    raise ValueError(f"unknown dtype name {dtype_name!r}; expected one of {sorted(TOLERANCES)}")


def tolerance(dtype_name: str) -> float:
    """Relative tolerance for a dtype name (f64, f32, tf32, f16, bf16)."""
    try:
        return TOLERANCES[dtype_name]
    except KeyError:
        raise ValueError(
            f"unknown dtype name {dtype_name!r}; expected one of {sorted(TOLERANCES)}"
        ) from None


def assert_close(
    actual: Any,
    expected: Any,
    dtype_name: str,
    what: str = "",
    *,
    rtol: float | None = None,
) -> None:
    """Compare a route's output with the oracle; raise AssertionError on failure.

    Rule (element-wise, for every element)::

        |a - e| <= tol * max(|e|, scale)
        scale    = max(mean(|expected|), SCALE_FLOOR)      # SCALE_FLOOR = 1e-3

    ``tol`` is :func:`tolerance` of ``dtype_name`` unless ``rtol`` is given.
    Large elements are checked relatively; elements much smaller than the
    typical output magnitude (e.g. sums that cancel) are checked against the
    mean magnitude of the reference; an all-zero or tiny reference is checked
    with absolute tolerance ``tol * 1e-3``.

    Shapes must match exactly (an empty array matches an empty array of the
    same shape). Non-finite values must match exactly in position and value
    (NaN matches NaN, +inf matches +inf).
    """
    label = f"{what}: " if what else ""
    tol = tolerance(dtype_name) if rtol is None else float(rtol)
    a = _f64(actual)
    e = _f64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{label}shape mismatch: actual {a.shape} vs expected {e.shape}")
    if e.size == 0:
        return

    a_fin = np.isfinite(a)
    e_fin = np.isfinite(e)
    bad_nonfinite = (a_fin != e_fin) | (
        ~a_fin & ~e_fin & ~((np.isnan(a) & np.isnan(e)) | (a == e))
    )
    if np.any(bad_nonfinite):
        idx = tuple(int(v) for v in np.argwhere(bad_nonfinite)[0])
        raise AssertionError(
            f"{label}non-finite mismatch at {idx}: actual {a[idx]!r}, expected {e[idx]!r}"
        )

    both = a_fin & e_fin
    if not np.any(both):
        return
    scale = max(float(np.mean(np.abs(e[both]))), SCALE_FLOOR)
    allowed = tol * np.maximum(np.abs(e), scale)
    err = np.abs(np.where(both, a, 0.0) - np.where(both, e, 0.0))
    ratio = err / allowed
    worst_flat = int(np.argmax(ratio))
    if ratio.reshape(-1)[worst_flat] > 1.0:
        idx = tuple(int(v) for v in np.unravel_index(worst_flat, a.shape))
        n_bad = int(np.count_nonzero(ratio > 1.0))
        raise AssertionError(
            f"{label}{n_bad} of {a.size} elements out of tolerance ({dtype_name}, "
            f"tol={tol:g}, scale={scale:g}); worst at {idx}: actual {a[idx]!r}, "
            f"expected {e[idx]!r}, |a-e|={err[idx]:.3e}, allowed={allowed[idx]:.3e}, "
            f"ratio={ratio[idx]:.3g}"
        )
