"""Packed affine int4 / int8 weights (SEMANTICS.md "Packed affine quantization").

Weight preprocessing for inference, vectorised in torch (not a hot path).

Rule (MLX ``mlx.core.quantize`` affine mode, ``mlx/backend/cpu/quantized.cpp``), per group of
``G`` consecutive input channels, all arithmetic in float32 (IEEE, round half to even)::

    n      = 2**bits - 1
    w_min, w_max = min / max of the group (zero padding included)
    s0     = max((w_max - w_min) / n, 1e-7)
    if |w_min| > |w_max|:  s0 = +s0, edge = w_min
    else:                  s0 = -s0, edge = w_max      # the scale is NEGATIVE here
    q0     = rint(edge / s0)
    if q0 != 0:  scale = edge / q0, bias = edge       # zero is exactly representable
    else:        scale = s0,        bias = 0
    q      = clip(rint((w - bias) / scale), 0, n)
    w_hat  = scale * q + bias

``scales`` / ``biases`` are stored in the weight's dtype (f16 / bf16 / f32; float64 weights give
float32); codes are computed with the float32 scale/bias (as MLX does). ``32/bits`` codes are
packed per uint32 word, element ``j`` of the word at bits ``[j*bits, (j+1)*bits)`` (LSB first).
torch has no uint32, so the words are a ``torch.int32`` tensor holding the uint32 bit patterns
(``packed.to(torch.int64) & 0xFFFFFFFF`` gives the unsigned values).

Error bound: ``|w - w_hat| <= |scale|/2`` for every element whose unclipped code lies in
``[0, n]``; because of the snapping, the element opposite the edge can clip by up to one step, so
the bound over all elements is ``|scale|`` (before rounding the scale to a 16-bit dtype).

Storage (``C_in_st`` = C_in zero-padded to a multiple of ``G``):

* ``linear`` ``(C_out, C_in)``: packed ``(C_out, C_in_st*bits/32)``, scales/biases
  ``(C_out, C_in_st/G)`` (bit-identical to MLX on the padded matrix);
* ``kernel_major`` ``(K, C_in, C_out)`` and ``dense_5d`` ``(C_out, Kx, Ky, Kz, C_in)``: stored
  kernel-major, packed ``(K, C_in_st*bits/32, C_out)``, scales/biases ``(K, C_in_st/G, C_out)``;
  dense_5d kernel row ``(x*Ky + y)*Kz + z`` (as ``oracle.weight_to_kcc``), the logical layout and
  shape are kept so that :func:`dequantize_weight` restores ``(C_out, Kx, Ky, Kz, C_in)``.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["QuantizedWeight", "quantize_weight", "dequantize_weight", "LAYOUTS"]

LAYOUTS = ("linear", "kernel_major", "dense_5d")
_BITS = (4, 8)
_GROUPS = (32, 64, 128)
_SCALE_DTYPES = (torch.float16, torch.float32, torch.bfloat16)
_EPS = 1e-7  # MLX's lower bound on the unsnapped scale (applied in float32)


def _err(where: str, arg: str, expected: str, got: object, exc: type = ValueError) -> Exception:
    return exc(f"[{where}] {arg}: expected {expected}, got {got}")


def _c_in_axis(layout: str) -> int:
    """Axis of the logical weight that holds C_in."""
    return 1 if layout == "kernel_major" else -1


def _storage_shape(layout: str, logical: tuple[int, ...], c_in_st: int, per_word: int, g: int):
    """(packed shape, scales shape) for a logical weight shape."""
    if layout == "linear":
        c_out = logical[0]
        return (c_out, c_in_st // per_word), (c_out, c_in_st // g)
    if layout == "kernel_major":
        k, c_out = logical[0], logical[2]
    else:  # dense_5d
        k, c_out = logical[1] * logical[2] * logical[3], logical[0]
    return (k, c_in_st // per_word, c_out), (k, c_in_st // g, c_out)


class QuantizedWeight:
    """A packed affine-quantized weight (inference only).

    Attributes:
        packed: ``torch.int32`` tensor holding uint32 bit patterns (see the module docstring).
        scales, biases: float16 / float32 / bfloat16, same shape and dtype.
        bits: 4 or 8.  group_size: 32, 64 or 128.
        layout: ``"linear"``, ``"kernel_major"`` or ``"dense_5d"`` (the logical layout).
        shape: the logical (unpadded) weight shape in ``layout``.

    Raises:
        TypeError / ValueError ``[QuantizedWeight] argument: expected ..., got ...`` on invalid
        fields (checked on construction).
    """

    __slots__ = ("packed", "scales", "biases", "bits", "group_size", "layout", "shape")

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int,
                 group_size: int, layout: str, shape: tuple[int, ...]) -> None:
        self.packed = packed
        self.scales = scales
        self.biases = biases
        self.bits = bits
        self.group_size = group_size
        self.layout = layout
        self.shape = tuple(shape) if isinstance(shape, (tuple, list, torch.Size)) else shape
        self._validate()

    def _validate(self) -> None:
        w = "QuantizedWeight"
        if isinstance(self.bits, bool) or self.bits not in _BITS:
            raise _err(w, "bits", "4 or 8", repr(self.bits))
        if isinstance(self.group_size, bool) or self.group_size not in _GROUPS:
            raise _err(w, "group_size", "32, 64 or 128", repr(self.group_size))
        if self.layout not in LAYOUTS:
            raise _err(w, "layout", "'linear', 'kernel_major' or 'dense_5d'", repr(self.layout))
        for name in ("packed", "scales", "biases"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise _err(w, name, "a torch.Tensor", type(t).__name__, TypeError)
        if self.packed.dtype != torch.int32:
            raise _err(w, "packed", "torch.int32 (uint32 bit patterns)", self.packed.dtype, TypeError)
        if self.scales.dtype not in _SCALE_DTYPES:
            raise _err(w, "scales", "float16, float32 or bfloat16", self.scales.dtype, TypeError)
        if self.biases.dtype != self.scales.dtype:
            raise _err(w, "biases", f"dtype {self.scales.dtype} (the scales' dtype)", self.biases.dtype, TypeError)
        if tuple(self.biases.shape) != tuple(self.scales.shape):
            raise _err(w, "biases", f"shape {tuple(self.scales.shape)} (the scales' shape)", tuple(self.biases.shape))
        ndim = {"linear": 2, "kernel_major": 3, "dense_5d": 5}[self.layout]
        shp = self.shape
        if (not isinstance(shp, tuple) or len(shp) != ndim
                or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shp)):
            raise _err(w, "shape", f"{ndim} positive ints for layout '{self.layout}'", repr(shp))
        per_word = 32 // self.bits
        c_in = shp[_c_in_axis(self.layout)]
        st_dims = 2 if self.layout == "linear" else 3
        if self.scales.dim() != st_dims:
            raise _err(w, "scales", f"{st_dims} dims for layout '{self.layout}'", tuple(self.scales.shape))
        if self.packed.dim() != st_dims:
            raise _err(w, "packed", f"{st_dims} dims for layout '{self.layout}'", tuple(self.packed.shape))
        c_in_st = self.packed.shape[1] * per_word  # packed (.., C_in_st*bits/32, ..) -> axis 1 in both forms
        if c_in_st % self.group_size != 0 or c_in_st == 0:
            raise _err(w, "packed", f"storage channels (packed.shape[1]*32/bits = {c_in_st}) a positive "
                       f"multiple of group_size {self.group_size}", c_in_st)
        if c_in > c_in_st:
            raise _err(w, "shape", f"logical C_in <= storage channels {c_in_st}", c_in)
        pshape, sshape = _storage_shape(self.layout, shp, c_in_st, per_word, self.group_size)
        if tuple(self.packed.shape) != pshape:
            raise _err(w, "packed", f"shape {pshape} for logical shape {shp}", tuple(self.packed.shape))
        if tuple(self.scales.shape) != sshape:
            raise _err(w, "scales", f"shape {sshape} for logical shape {shp}", tuple(self.scales.shape))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype a dequantized weight has (the scales' dtype)."""
        return self.scales.dtype

    @property
    def storage_channels(self) -> int:
        """``C_in_st``: C_in zero-padded to a multiple of the group."""
        return self.packed.shape[1] * (32 // self.bits)

    def nbytes(self) -> int:
        """Bytes of packed words + scales + biases."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.biases))

    def __repr__(self) -> str:
        return (f"QuantizedWeight(layout={self.layout!r}, shape={self.shape}, bits={self.bits}, "
                f"group_size={self.group_size}, dtype={self.dtype})")


# ---- the rule and the packing (the one place they live) ---------------------------------------

def _affine_rows(x: torch.Tensor, bits: int, g: int):
    """MLX affine rule on float32 rows ``(..., C_st)``: codes int64 ``(..., C_st)``, f32 scales and
    biases ``(..., C_st/G)``."""
    n = float(2 ** bits - 1)
    xg = x.reshape(*x.shape[:-1], x.shape[-1] // g, g)
    w_min = xg.amin(dim=-1)
    w_max = xg.amax(dim=-1)
    mask = w_min.abs() > w_max.abs()
    s0 = torch.clamp((w_max - w_min) / n, min=torch.tensor(_EPS, dtype=torch.float32).item())
    s0 = torch.where(mask, s0, -s0)
    edge = torch.where(mask, w_min, w_max)
    q0 = torch.round(edge / s0)  # round half to even == std::rint
    snap = q0 != 0
    scale = torch.where(snap, edge / torch.where(snap, q0, torch.ones_like(q0)), s0)
    bias = torch.where(snap, edge, torch.zeros_like(edge))
    q = torch.round((xg - bias.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp_(0.0, n)
    return q.to(torch.int64).reshape(x.shape), scale, bias


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 codes ``(..., C_st)`` -> int32 words ``(..., C_st*bits/32)``, LSB first."""
    per_word = 32 // bits
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per_word, per_word)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    words = (c << shifts).sum(dim=-1)  # disjoint bit fields: sum == bitwise or
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32)


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words ``(..., W)`` -> int64 codes ``(..., W*32/bits)``."""
    per_word = 32 // bits
    u = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    codes = (u.unsqueeze(-1) >> shifts) & (2 ** bits - 1)
    return codes.reshape(*words.shape[:-1], words.shape[-1] * per_word)


def _to_rows(w: torch.Tensor, layout: str) -> torch.Tensor:
    """Logical weight -> rows with C_in last: linear (C_out, C_in); spatial (K, C_out, C_in)."""
    if layout == "linear":
        return w
    if layout == "dense_5d":
        c_out, kx, ky, kz, c_in = w.shape
        w = w.permute(1, 2, 3, 4, 0).reshape(kx * ky * kz, c_in, c_out)
    return w.transpose(1, 2)


def _from_rows(rows: torch.Tensor, layout: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`_to_rows` (rows already cut to the logical C_in)."""
    if layout == "linear":
        return rows
    kcc = rows.transpose(1, 2)  # (K, C_in, C_out)
    if layout == "kernel_major":
        return kcc
    c_out, kx, ky, kz, c_in = shape
    return kcc.reshape(kx, ky, kz, c_in, c_out).permute(4, 0, 1, 2, 3)


def _rows_to_storage(t: torch.Tensor, layout: str) -> torch.Tensor:
    """(C_out, X) stays; spatial (K, C_out, X) -> (K, X, C_out)."""
    return t if layout == "linear" else t.transpose(1, 2)


def quantize_weight(w: torch.Tensor, bits: int = 4, group_size: Optional[int] = None,
                    layout: Optional[str] = None) -> QuantizedWeight:
    """Quantize a float weight to packed affine int4 / int8 (MLX's affine rule, module docstring).

    Args:
        w: float16 / bfloat16 / float32 / float64 weight: ``linear`` ``(C_out, C_in)``,
            ``kernel_major`` ``(K, C_in, C_out)`` or ``dense_5d`` ``(C_out, Kx, Ky, Kz, C_in)``.
            Not modified.
        bits: 4 or 8.
        group_size: 32, 64 or 128; default 64 when C_in >= 64, else 32.
        layout: one of the above; default from ``w.dim()`` (2 -> linear, 3 -> kernel_major,
            5 -> dense_5d).

    Returns:
        A :class:`QuantizedWeight`; C_in is zero-padded to a multiple of the group.

    Raises:
        TypeError / ValueError ``[quantize_weight] argument: expected ..., got ...``.
    """
    op = "quantize_weight"
    if not isinstance(w, torch.Tensor):
        raise _err(op, "w", "a torch.Tensor", type(w).__name__, TypeError)
    if w.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise _err(op, "w", "a float16, bfloat16, float32 or float64 tensor", w.dtype, TypeError)
    if isinstance(bits, bool) or bits not in _BITS:
        raise _err(op, "bits", "4 or 8", repr(bits))
    if layout is None:
        layout = {2: "linear", 3: "kernel_major", 5: "dense_5d"}.get(w.dim())
        if layout is None:
            raise _err(op, "w", "2 (linear), 3 (kernel_major) or 5 (dense_5d) dims", tuple(w.shape))
    if layout not in LAYOUTS:
        raise _err(op, "layout", "'linear', 'kernel_major', 'dense_5d' or None", repr(layout))
    ndim = {"linear": 2, "kernel_major": 3, "dense_5d": 5}[layout]
    names = {"linear": "(C_out, C_in)", "kernel_major": "(K, C_in, C_out)",
             "dense_5d": "(C_out, Kx, Ky, Kz, C_in)"}[layout]
    if w.dim() != ndim or w.numel() == 0:
        raise _err(op, "w", f"a non-empty {names} weight for layout '{layout}'", tuple(w.shape))
    if not bool(torch.isfinite(w).all()):
        raise _err(op, "w", "finite values", "NaN or inf")
    c_in = w.shape[_c_in_axis(layout)]
    if group_size is None:
        group_size = 64 if c_in >= 64 else 32
    if isinstance(group_size, bool) or group_size not in _GROUPS:
        raise _err(op, "group_size", "32, 64, 128 or None", repr(group_size))
    out_dtype = torch.float32 if w.dtype == torch.float64 else w.dtype

    rows = _to_rows(w.detach().to("cpu", torch.float32), layout)  # new tensor: w is never mutated
    c_in_st = -(-c_in // group_size) * group_size
    if c_in_st != c_in:
        rows = torch.nn.functional.pad(rows, (0, c_in_st - c_in))
    codes, scale, bias = _affine_rows(rows.contiguous(), bits, group_size)
    packed = _rows_to_storage(_pack(codes, bits), layout).contiguous()
    scales = _rows_to_storage(scale.to(out_dtype), layout).contiguous()
    biases = _rows_to_storage(bias.to(out_dtype), layout).contiguous()
    return QuantizedWeight(packed, scales, biases, bits, group_size, layout, tuple(w.shape))


def dequantize_weight(q: QuantizedWeight) -> torch.Tensor:
    """The float weight ``scale*code + bias`` in q's logical layout and shape, dtype ``q.dtype``.

    Computed in float32 from the stored scales/biases, then rounded to ``q.dtype``.
    """
    if not isinstance(q, QuantizedWeight):
        raise _err("dequantize_weight", "q", "a lattice.QuantizedWeight", type(q).__name__, TypeError)
    g = q.group_size
    packed = _rows_to_storage(q.packed, q.layout)  # back to rows: (.., W) with words last
    scales = _rows_to_storage(q.scales, q.layout).to(torch.float32)
    biases = _rows_to_storage(q.biases, q.layout).to(torch.float32)
    codes = _unpack(packed, q.bits).to(torch.float32)
    cg = codes.reshape(*codes.shape[:-1], codes.shape[-1] // g, g)
    rows = (cg * scales.unsqueeze(-1) + biases.unsqueeze(-1)).reshape(codes.shape)
    c_in = q.shape[_c_in_axis(q.layout)]
    rows = rows[..., :c_in]
    return _from_rows(rows, q.layout, q.shape).to(q.dtype).contiguous()
