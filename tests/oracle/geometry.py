"""Kernel geometry helpers for the float64 numpy oracle.

Contract (SEMANTICS.md, "Kernel geometry"):

- kernel rows are enumerated x-major, z fastest: ``row = (x*Ky + y)*Kz + z``;
- forward / target / submanifold relations use *centered* offsets for odd
  sizes (``-r..r``) and *indexed* offsets (``0..K-1``) for even sizes, times
  dilation, decided per axis;
- transposed / generative relations use indexed offsets on every axis.

This module imports only numpy and is written for obvious correctness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["as_triple", "floor_div", "kernel_offsets", "kernel_volume"]


def as_triple(v: int | Sequence[int], name: str = "value") -> tuple[int, int, int]:
    """Return ``v`` as a tuple of three Python ints.

    ``v`` is either one int (broadcast to all three axes) or a sequence of
    exactly three ints. Booleans and non-integral values raise ValueError.
    """
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{name} must be an int or 3 ints, got bool {v!r}")
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v), int(v))
    items = list(v)
    if len(items) != 3:
        raise ValueError(f"{name} must be an int or 3 ints, got {v!r}")
    out: list[int] = []
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise ValueError(f"{name} must contain ints, got {v!r}")
        out.append(int(item))
    return (out[0], out[1], out[2])


def floor_div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    """Integer division rounding toward minus infinity (Python ``//``).

    Works element-wise on int arrays (computed in int64): ``floor_div(-1, 2)
    == -1``, ``floor_div(-3, 2) == -2``. ``b`` must be non-zero.
    """
    a64 = np.asarray(a, dtype=np.int64)
    b64 = np.asarray(b, dtype=np.int64)
    if np.any(b64 == 0):
        raise ZeroDivisionError("floor_div by zero")
    # Spelled out rather than relying on np.floor_divide, so the rule is
    # visible: truncate toward zero, then step down when the signs differ and
    # the division was inexact.
    q = np.abs(a64) // np.abs(b64)
    q = np.where((a64 < 0) != (b64 < 0), -q, q)
    inexact = q * b64 != a64
    q = np.where(inexact & ((a64 < 0) != (b64 < 0)), q - 1, q)
    return q.astype(np.int64)


def kernel_volume(kernel_size: int | Sequence[int]) -> int:
    """Number of kernel rows ``Kx*Ky*Kz``."""
    kx, ky, kz = as_triple(kernel_size, "kernel_size")
    return kx * ky * kz


def kernel_offsets(
    kernel_size: int | Sequence[int],
    dilation: int | Sequence[int] = 1,
    centered: bool = True,
) -> np.ndarray:
    """Kernel offsets as a ``(K, 3)`` int64 array, row ``(x*Ky + y)*Kz + z``.

    If ``centered``: per axis, an odd size gives ``(idx - size//2)*dilation``
    and an even size gives ``idx*dilation``. If not ``centered`` (transposed /
    generative relations): ``idx*dilation`` on every axis.
    """
    size = as_triple(kernel_size, "kernel_size")
    dil = as_triple(dilation, "dilation")
    if min(size) < 1:
        raise ValueError(f"kernel_size must be >= 1, got {size}")
    if min(dil) < 1:
        raise ValueError(f"dilation must be >= 1, got {dil}")

    def axis_offset(idx: int, axis: int) -> int:
        if centered and size[axis] % 2 == 1:
            return (idx - size[axis] // 2) * dil[axis]
        return idx * dil[axis]

    rows: list[tuple[int, int, int]] = []
    for x in range(size[0]):
        for y in range(size[1]):
            for z in range(size[2]):
                rows.append((axis_offset(x, 0), axis_offset(y, 1), axis_offset(z, 2)))
    return np.array(rows, dtype=np.int64).reshape(len(rows), 3)
