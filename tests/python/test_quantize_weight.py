"""Packed affine int4/int8 weights: quantize_weight / dequantize_weight / QuantizedWeight
(SEMANTICS.md "Packed affine quantization"; issue 7, quantize/dequantize part).

Hand-computed packed words, the oracle's codes/scales/biases (tests/oracle/quantize_affine.py),
round-trip bounds, zero padding of C_in, validation messages, no mutation, and (when the `mlx`
package is importable) bit-exact agreement with ``mlx.core.quantize``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from lattice.quantize import QuantizedWeight, dequantize_weight, quantize_weight
from oracle.quantize_affine import affine_dequantize_rows, affine_quantize_rows, pack_codes

LAYOUTS = ["linear", "kernel_major", "dense_5d"]


def _u32(t: torch.Tensor) -> np.ndarray:
    """int32 bit patterns -> uint32 values."""
    return t.numpy().view(np.uint32)


def _tiny() -> torch.Tensor:
    """(2, 32) weight, 0.25 * ((j % 16) - 8) and its mirror 0.25 * (7 - j % 16): w_min = -2,
    w_max = 1.75, so edge = w_min, s0 = 3.75/n and the snapped scale is exact."""
    j = torch.arange(32) % 16
    return torch.stack([0.25 * (j - 8), 0.25 * (7 - j)]).to(torch.float32)


# Hand computation, 4 bits: n = 15, s0 = 3.75/15 = 0.25, q0 = rint(-2/0.25) = -8 -> scale = 0.25,
# bias = -2; codes = 4w + 8 = j % 16 (row 0) and 15 - j % 16 (row 1); 8 codes per word, LSB first.
WORDS4 = [[0x76543210, 0xFEDCBA98, 0x76543210, 0xFEDCBA98],
          [0x89ABCDEF, 0x01234567, 0x89ABCDEF, 0x01234567]]
# 8 bits: n = 255, s0 = 3.75/255, q0 = rint(-2/s0) = -136 -> scale = 2/136 = 1/68, bias = -2;
# codes = 68(w + 2) = 17 * (j % 16): words of 4 codes (0,17,34,51) -> 0x33221100, ...
WORDS8_ROW0 = [0x33221100, 0x77665544, 0xBBAA9988, 0xFFEEDDCC] * 2
WORDS8_ROW1 = [0xCCDDEEFF, 0x8899AABB, 0x44556677, 0x00112233] * 2


def test_quantize_weight_tiny_linear_4bit_hand_words():
    q = quantize_weight(_tiny(), bits=4, group_size=32)
    assert q.layout == "linear" and q.shape == (2, 32) and q.packed.dtype == torch.int32
    assert _u32(q.packed).tolist() == WORDS4
    assert q.scales.tolist() == [[0.25], [0.25]] and q.biases.tolist() == [[-2.0], [-2.0]]
    assert torch.equal(dequantize_weight(q), _tiny())  # every value is on the grid


def test_quantize_weight_tiny_linear_8bit_hand_words():
    q = quantize_weight(_tiny(), bits=8, group_size=32)
    assert _u32(q.packed).tolist() == [WORDS8_ROW0, WORDS8_ROW1]
    assert q.scales.tolist() == [[np.float32(2 / 136).item()]] * 2 and q.biases.tolist() == [[-2.0]] * 2


def test_quantize_weight_tiny_spatial_layouts_hand_words():
    w = _tiny()  # (C_out=2, C_in=32)
    qk = quantize_weight(w.t().reshape(1, 32, 2).contiguous(), bits=4)  # kernel_major (K=1, C_in, C_out)
    assert qk.layout == "kernel_major" and tuple(qk.packed.shape) == (1, 4, 2)
    assert _u32(qk.packed)[0].T.tolist() == WORDS4
    assert tuple(qk.scales.shape) == (1, 1, 2)
    qd = quantize_weight(w.reshape(2, 1, 1, 1, 32), bits=4)  # dense_5d (C_out, 1, 1, 1, C_in)
    assert qd.layout == "dense_5d" and qd.shape == (2, 1, 1, 1, 32)
    assert torch.equal(qd.packed, qk.packed) and torch.equal(qd.scales, qk.scales)
    assert torch.equal(dequantize_weight(qd), w.reshape(2, 1, 1, 1, 32))


def _rows(w: torch.Tensor, layout: str) -> np.ndarray:
    """Logical weight -> float64 rows (.., C_in) the oracle quantizes, as a 2-D array."""
    a = w.double().numpy()
    if layout == "dense_5d":
        co, kx, ky, kz, ci = a.shape
        a = a.transpose(1, 2, 3, 4, 0).reshape(kx * ky * kz, ci, co)  # oracle.weight_to_kcc
    if layout != "linear":
        a = a.transpose(0, 2, 1)  # (K, C_out, C_in)
    return a.reshape(-1, a.shape[-1])


def _storage_rows(t: torch.Tensor, layout: str) -> np.ndarray:
    a = t.numpy()
    if layout != "linear":
        a = a.transpose(0, 2, 1)
    return a.reshape(-1, a.shape[-1])


def _weight(rng, layout: str, c_in: int, dtype=torch.float32) -> torch.Tensor:
    shape = {"linear": (6, c_in), "kernel_major": (3, c_in, 5), "dense_5d": (4, 1, 2, 3, c_in)}[layout]
    w = rng.standard_normal(shape) * 0.3 + rng.uniform(-0.2, 0.2)
    return torch.from_numpy(w).to(dtype)


def _oracle(w: torch.Tensor, layout: str, bits: int, g: int, arith=np.float32):
    rows = _rows(w, layout)
    c_in = rows.shape[1]
    pad = -(-c_in // g) * g - c_in
    rows = np.pad(rows, ((0, 0), (0, pad)))
    return affine_quantize_rows(rows, bits, g, arith=arith)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_weight_every_layout_equals_oracle_and_round_trip_within_half_step(rng, layout, bits, group):
    c_in = 2 * group if group < 128 else 136  # 136 pads to 256
    w = _weight(rng, layout, c_in)
    q = quantize_weight(w, bits=bits, group_size=group, layout=layout)
    # codes / scales / biases equal the oracle (float32 arithmetic, as MLX) bit for bit
    codes, s, b = _oracle(w, layout, bits, group)
    np.testing.assert_array_equal(_storage_rows(q.packed, layout).view(np.uint32), pack_codes(codes, bits))
    np.testing.assert_array_equal(_storage_rows(q.scales, layout), s)
    np.testing.assert_array_equal(_storage_rows(q.biases, layout), b)
    # float64 restatement: same scales to float32 rounding, codes within one step where ties move
    codes64, s64, b64 = _oracle(w, layout, bits, group, arith=np.float64)
    np.testing.assert_allclose(s, s64, rtol=1e-6)
    np.testing.assert_allclose(b, b64, rtol=0, atol=0)
    assert np.abs(codes - codes64).max() <= 1 and (codes != codes64).mean() < 1e-2
    # round trip: |w - w_hat| <= |scale|/2 where the code is not clipped, <= |scale| everywhere
    d = dequantize_weight(q)
    assert d.shape == w.shape and d.dtype == torch.float32
    err = np.abs(_rows(w, layout) - _rows(d, layout))
    step = np.repeat(np.abs(s.astype(np.float64)), group, axis=1)[:, :c_in]
    wr = _rows(w, layout)
    t = (wr - np.repeat(b.astype(np.float64), group, axis=1)[:, :c_in]) / np.repeat(s.astype(np.float64), group, axis=1)[:, :c_in]
    inside = (t >= -0.5) & (t <= 2 ** bits - 1 + 0.5)
    tiny = 1e-6 * np.abs(wr).max()
    assert (err[inside] <= step[inside] / 2 + tiny).all(), err[inside].max()
    assert (err <= step + tiny).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_weight_half_dtypes_scales_in_dtype_equal_oracle(rng, dtype, bits):
    w = _weight(rng, "kernel_major", 96, dtype)
    q = quantize_weight(w, bits=bits)
    assert q.group_size == 64 and q.scales.dtype == dtype and q.biases.dtype == dtype
    codes, s, b = _oracle(w.float(), "kernel_major", bits, 64)
    np.testing.assert_array_equal(_storage_rows(q.packed, "kernel_major").view(np.uint32), pack_codes(codes, bits))
    np.testing.assert_array_equal(_storage_rows(q.scales.float(), "kernel_major"),
                                  torch.from_numpy(s).to(dtype).float().numpy())
    d = dequantize_weight(q)
    assert d.dtype == dtype and d.shape == w.shape
    ref = affine_dequantize_rows(codes, _storage_rows(q.scales.float(), "kernel_major"),
                                 _storage_rows(q.biases.float(), "kernel_major"), 64)[:, :96]
    rel = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    np.testing.assert_allclose(_rows(d.float(), "kernel_major"), ref, rtol=rel, atol=1e-6)


def test_quantize_weight_float64_input_gives_float32_scales(rng):
    w = _weight(rng, "linear", 32, torch.float64)
    q = quantize_weight(w)
    assert q.scales.dtype == torch.float32 and dequantize_weight(q).dtype == torch.float32


@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantize_weight_c_in_40_group_32_zero_padded_to_64(rng, layout):
    w = _weight(rng, layout, 40)
    q = quantize_weight(w, bits=4, group_size=32, layout=layout)
    assert q.storage_channels == 64 and q.shape == tuple(w.shape)
    if layout == "linear":
        assert tuple(q.packed.shape) == (6, 8) and tuple(q.scales.shape) == (6, 2)
    elif layout == "kernel_major":
        assert tuple(q.packed.shape) == (3, 8, 5) and tuple(q.scales.shape) == (3, 2, 5)
    else:
        assert tuple(q.packed.shape) == (6, 8, 4) and tuple(q.scales.shape) == (6, 2, 4)
    # the same as quantizing the explicitly zero-padded weight
    axis = 1 if layout == "kernel_major" else -1
    pad_shape = list(w.shape)
    pad_shape[axis] = 24
    wp = torch.cat([w, torch.zeros(pad_shape)], dim=axis)
    qp = quantize_weight(wp, bits=4, group_size=32, layout=layout)
    assert torch.equal(q.packed, qp.packed) and torch.equal(q.scales, qp.scales) and torch.equal(q.biases, qp.biases)
    d = dequantize_weight(q)
    assert d.shape == w.shape
    assert torch.equal(d, dequantize_weight(qp).narrow(axis if axis >= 0 else wp.dim() - 1, 0, 40))


@pytest.mark.parametrize("c_in,expected", [(16, 32), (40, 32), (63, 32), (64, 64), (200, 64)])
def test_quantize_weight_default_group_64_from_c_in_64_else_32(c_in, expected):
    assert quantize_weight(torch.randn(3, c_in)).group_size == expected


def test_quantize_weight_layout_inferred_from_ndim():
    assert quantize_weight(torch.randn(2, 8)).layout == "linear"
    assert quantize_weight(torch.randn(27, 8, 2)).layout == "kernel_major"
    assert quantize_weight(torch.randn(2, 3, 3, 3, 8)).layout == "dense_5d"


def test_quantize_weight_does_not_mutate_input(rng):
    base = _weight(rng, "dense_5d", 40)
    w = base.clone()
    quantize_weight(w, bits=8)
    assert torch.equal(w, base)
    nc = torch.randn(40, 6).t()  # non-contiguous linear view
    keep = nc.clone()
    q = quantize_weight(nc)
    assert torch.equal(nc, keep) and not nc.is_contiguous()
    assert torch.equal(q.packed, quantize_weight(keep.contiguous()).packed)


def test_quantize_weight_exported_from_lattice():
    assert lattice.quantize_weight is quantize_weight
    assert lattice.dequantize_weight is dequantize_weight and lattice.QuantizedWeight is QuantizedWeight


# ---- validation --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(w=[[1.0]]), TypeError, "[quantize_weight] w: expected a torch.Tensor, got list"),
    (dict(w=torch.ones(2, 32, dtype=torch.int32)), TypeError, "[quantize_weight] w: expected a float16, bfloat16, float32 or float64 tensor, got torch.int32"),
    (dict(w=torch.ones(2, 32), bits=3), ValueError, "[quantize_weight] bits: expected 4 or 8, got 3"),
    (dict(w=torch.ones(2, 32), group_size=16), ValueError, "[quantize_weight] group_size: expected 32, 64, 128 or None, got 16"),
    (dict(w=torch.ones(2, 32), layout="dense"), ValueError, "[quantize_weight] layout: expected 'linear', 'kernel_major', 'dense_5d' or None, got 'dense'"),
    (dict(w=torch.ones(2, 2, 2, 32)), ValueError, "[quantize_weight] w: expected 2 (linear), 3 (kernel_major) or 5 (dense_5d) dims, got (2, 2, 2, 32)"),
    (dict(w=torch.ones(2, 32), layout="kernel_major"), ValueError, "[quantize_weight] w: expected a non-empty (K, C_in, C_out) weight for layout 'kernel_major', got (2, 32)"),
    (dict(w=torch.tensor([[1.0, float("nan")]])), ValueError, "[quantize_weight] w: expected finite values, got NaN or inf"),
])
def test_quantize_weight_invalid_argument_raises_message(kwargs, exc, msg):
    with pytest.raises(exc) as e:
        quantize_weight(**kwargs)
    assert str(e.value) == msg


def _fields(**over):
    q = quantize_weight(torch.randn(3, 40), bits=4, group_size=32)
    f = dict(packed=q.packed, scales=q.scales, biases=q.biases, bits=4, group_size=32, layout="linear", shape=(3, 40))
    f.update(over)
    return f


def test_quantized_weight_valid_fields_construct():
    q = QuantizedWeight(**_fields())
    assert q.dtype == torch.float32 and q.storage_channels == 64 and q.nbytes() == 3 * 8 * 4 + 2 * 3 * 2 * 4
    assert "bits=4" in repr(q)


@pytest.mark.parametrize("over,exc,msg", [
    (dict(bits=2), ValueError, "[QuantizedWeight] bits: expected 4 or 8, got 2"),
    (dict(group_size=48), ValueError, "[QuantizedWeight] group_size: expected 32, 64 or 128, got 48"),
    (dict(layout="nchw"), ValueError, "[QuantizedWeight] layout: expected 'linear', 'kernel_major' or 'dense_5d', got 'nchw'"),
    (dict(packed=np.zeros((3, 8))), TypeError, "[QuantizedWeight] packed: expected a torch.Tensor, got ndarray"),
    (dict(packed=torch.zeros(3, 8, dtype=torch.int64)), TypeError, "[QuantizedWeight] packed: expected torch.int32 (uint32 bit patterns), got torch.int64"),
    (dict(scales=torch.zeros(3, 2, dtype=torch.float64), biases=torch.zeros(3, 2, dtype=torch.float64)), TypeError, "[QuantizedWeight] scales: expected float16, float32 or bfloat16, got torch.float64"),
    (dict(biases=torch.zeros(3, 2, dtype=torch.float16)), TypeError, "[QuantizedWeight] biases: expected dtype torch.float32 (the scales' dtype), got torch.float16"),
    (dict(biases=torch.zeros(3, 3)), ValueError, "[QuantizedWeight] biases: expected shape (3, 2) (the scales' shape), got (3, 3)"),
    (dict(shape=(3, 40, 1)), ValueError, "[QuantizedWeight] shape: expected 2 positive ints for layout 'linear', got (3, 40, 1)"),
    (dict(packed=torch.zeros(3, 6, dtype=torch.int32)), ValueError, "[QuantizedWeight] packed: expected storage channels (packed.shape[1]*32/bits = 48) a positive multiple of group_size 32, got 48"),
    (dict(shape=(3, 65)), ValueError, "[QuantizedWeight] shape: expected logical C_in <= storage channels 64, got 65"),
    (dict(shape=(4, 40)), ValueError, "[QuantizedWeight] packed: expected shape (4, 8) for logical shape (4, 40), got (3, 8)"),
    (dict(scales=torch.zeros(3, 1), biases=torch.zeros(3, 1)), ValueError, "[QuantizedWeight] scales: expected shape (3, 2) for logical shape (3, 40), got (3, 1)"),
    (dict(layout="kernel_major", shape=(1, 40, 3)), ValueError, "[QuantizedWeight] scales: expected 3 dims for layout 'kernel_major', got (3, 2)"),
])
def test_quantized_weight_invalid_field_raises_message(over, exc, msg):
    with pytest.raises(exc) as e:
        QuantizedWeight(**_fields(**over))
    assert str(e.value) == msg


def test_dequantize_weight_non_quantized_raises_message():
    with pytest.raises(TypeError) as e:
        dequantize_weight(torch.zeros(2, 2))
    assert str(e.value) == "[dequantize_weight] q: expected a lattice.QuantizedWeight, got Tensor"


# ---- MLX (only where the `mlx` package is installed: pip install "mlx[cpu]") -------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_weight_linear_bit_exact_with_mlx(rng, dtype, bits, group):
    mx = pytest.importorskip("mlx.core")
    w = torch.from_numpy(rng.standard_normal((7, 256)).astype(np.float32) * 0.5 + 0.1).to(dtype)
    q = quantize_weight(w, bits=bits, group_size=group)
    mdt = {torch.float32: mx.float32, torch.float16: mx.float16, torch.bfloat16: mx.bfloat16}[dtype]
    mq, ms, mb = mx.quantize(mx.array(w.float().numpy()).astype(mdt), group_size=group, bits=bits)
    np.testing.assert_array_equal(np.array(mq), _u32(q.packed))
    np.testing.assert_array_equal(np.array(ms.astype(mx.float32)), q.scales.float().numpy())
    np.testing.assert_array_equal(np.array(mb.astype(mx.float32)), q.biases.float().numpy())
