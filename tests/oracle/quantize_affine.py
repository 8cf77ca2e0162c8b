"""Reference packed affine quantization (SEMANTICS.md "Packed affine quantization"), numpy only.

Restates MLX's affine rule per group of ``group_size`` values along the last axis of a 2-D
array (rows = output channels, already zero-padded)::

    n = 2**bits - 1;  s0 = max((w_max - w_min)/n, 1e-7)
    |w_min| > |w_max| -> s0 = +s0, edge = w_min   else s0 = -s0, edge = w_max
    q0 = rint(edge/s0);  q0 != 0 -> scale = edge/q0, bias = edge   else scale = s0, bias = 0
    q = clip(rint((w - bias)/scale), 0, n)

``arith`` is the arithmetic dtype: float64 (default, the oracle) or float32 (MLX's own arithmetic,
which the library reproduces bit for bit). Packing: ``32/bits`` codes per uint32, element ``j`` at
bit ``j*bits``, written here with an explicit Python loop over the word's elements.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["affine_quantize_rows", "pack_codes", "unpack_words", "affine_dequantize_rows"]


def affine_quantize_rows(w: Any, bits: int, group_size: int, arith: Any = np.float64):
    """Rows ``(R, C)`` (C a multiple of group_size) -> codes ``(R, C)`` int64, scales and biases
    ``(R, C/group_size)`` in ``arith``."""
    a = np.asarray(w).astype(arith)
    if a.ndim != 2 or a.shape[1] % group_size:
        raise ValueError(f"expected (R, C) with C a multiple of {group_size}, got {a.shape}")
    n = arith(2 ** bits - 1)
    eps = arith(np.float32(1e-7))
    r, c = a.shape
    codes = np.zeros((r, c), dtype=np.int64)
    scales = np.zeros((r, c // group_size), dtype=arith)
    biases = np.zeros((r, c // group_size), dtype=arith)
    for i in range(r):
        for gi in range(c // group_size):
            grp = a[i, gi * group_size:(gi + 1) * group_size]
            lo, hi = grp.min(), grp.max()
            s = max(arith((hi - lo) / n), eps)
            if abs(lo) > abs(hi):
                edge = lo
            else:
                edge, s = hi, arith(-s)
            q0 = np.rint(arith(edge / s))
            b = arith(0)
            if q0 != 0:
                s, b = arith(edge / q0), edge
            q = np.clip(np.rint(((grp - b) / s).astype(arith)), 0, n)
            codes[i, gi * group_size:(gi + 1) * group_size] = q.astype(np.int64)
            scales[i, gi], biases[i, gi] = s, b
    return codes, scales, biases


def pack_codes(codes: Any, bits: int) -> np.ndarray:
    """Codes ``(R, C)`` -> uint32 words ``(R, C*bits/32)``, LSB first."""
    c = np.asarray(codes, dtype=np.uint64)
    per = 32 // bits
    out = np.zeros((c.shape[0], c.shape[1] // per), dtype=np.uint64)
    for j in range(per):
        out |= c[:, j::per] << np.uint64(j * bits)
    return out.astype(np.uint32)


def unpack_words(words: Any, bits: int) -> np.ndarray:
    """uint32 words ``(R, W)`` -> codes ``(R, W*32/bits)`` int64."""
    u = np.asarray(words).astype(np.uint32).astype(np.int64)
    per = 32 // bits
    out = np.zeros((u.shape[0], u.shape[1] * per), dtype=np.int64)
    for j in range(per):
        out[:, j::per] = (u >> (j * bits)) & (2 ** bits - 1)
    return out


def affine_dequantize_rows(codes: Any, scales: Any, biases: Any, group_size: int) -> np.ndarray:
    """float64 ``scale*q + bias`` for rows of codes."""
    s = np.repeat(np.asarray(scales, dtype=np.float64), group_size, axis=1)
    b = np.repeat(np.asarray(biases, dtype=np.float64), group_size, axis=1)
    return np.asarray(codes, dtype=np.float64) * s + b


def _self_test() -> None:
    # One group of 32: w = (j - 10)/10, j = 0..31 -> w_min = -1, w_max = 2.1, 4 bits.
    w = ((np.arange(32) - 10) / 10.0).reshape(1, 32)
    codes, s, b = affine_quantize_rows(w, 4, 32)
    # s0 = -3.1/15; edge = 2.1; q0 = rint(2.1 / -0.20667) = -10 -> scale = -0.21, bias = 2.1
    assert np.isclose(s[0, 0], -0.21) and np.isclose(b[0, 0], 2.1), (s, b)
    assert codes[0, 31] == 0 and codes[0, 10] == 10 and codes[0, 0] == 15, codes  # w=0 -> exactly 10
    assert affine_dequantize_rows(codes, s, b, 32)[0, 10] == 0.0
    words = pack_codes(np.arange(16).reshape(1, 16) % 16, 4)
    assert words.tolist() == [[0x76543210, 0xFEDCBA98]], [hex(x) for x in words[0]]
    assert pack_codes(np.array([[1, 2, 3, 255]]), 8).tolist() == [[0xFF030201]]
    rng = np.random.default_rng(0)
    for bits in (4, 8):
        c = rng.integers(0, 2 ** bits, size=(3, 64))
        assert (unpack_words(pack_codes(c, bits), bits) == c).all()
    # all-zero group: scale = -1e-7, bias = 0, codes 0
    c0, s0, b0 = affine_quantize_rows(np.zeros((1, 32)), 8, 32)
    assert (c0 == 0).all() and b0[0, 0] == 0 and s0[0, 0] < 0


if __name__ == "__main__":
    _self_test()
    print("ok")
