"""Packed int4/int8 weights on CUDA (issue 7: ``cuda_dequant_gemm``; issue 19: ``cuda_decode_conv``).

The contract on the device: op(X, Q) on cuda ~= op(X, dequantize_weight(Q)) on the CPU, within
f32 1e-5 / f16 2e-3 / bf16 1e-2 norm-wise and element-wise (``cuda_admission.compare``, which names the
worst row), for every relation kind, both layouts,
bits 4 / 8, groups 32 / 64 / 128, for ``cuda_decode_conv`` (the default on cuda: device decode + the
float conv route, bitwise ``dequant_reference``'s result), ``cuda_dequant_gemm`` (decode inside a SIMT
kernel) and ``dequant_reference``; repeated runs bitwise equal;
``explain()`` of every case equals the admission table (cuda_admission.py) for the device's tier;
mixed devices are a ValueError. Everything here needs a CUDA device and lattice's CUDA backend and
is skipped with "no GPU" otherwise, the only skip (the CPU routes are covered by
test_quantized_ops.py).
"""
from __future__ import annotations

import pytest
import torch

import cuda_admission as adm
import lattice
import lattice.nn as lnn
from lattice import QuantizedWeight, dequantize_weight, quantize_weight


pytestmark = adm.needs_gpu()  # the only skip: "no GPU" (no CUDA device, or lattice built without CUDA)
DEV = torch.device("cuda", 0)

ROUTES = ["cuda_decode_conv", "cuda_dequant_gemm", "dequant_reference"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# relation kind -> (op, kernel size, kwargs, input: "fine" or "coarse", target: None / "fine" / "coarse")
KINDS = {
    "submanifold": ("subm_conv3d", 3, {}, "fine", None),
    "identity": ("subm_conv3d", 1, {}, "fine", None),
    "forward": ("conv3d", 2, {"stride": 2}, "fine", None),
    "target": ("conv3d", 3, {"stride": 2, "padding": 1}, "fine", "coarse"),
    "transposed": ("conv_transpose3d", 2, {"stride": 2}, "coarse", None),
    "transposed_target": ("conv_transpose3d", 3, {"stride": 2, "padding": 1}, "coarse", "fine"),
    "generative": ("generative_conv_transpose3d", 2, {"stride": 2}, "coarse", None),
}
C_IN, C_OUT = 40, 70  # neither a multiple of a group nor of the 64-channel tile


def _coords(n: int, side: int, seed: int, batches: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(-side, side, (n, 3), generator=g)
    b = torch.randint(0, batches, (n, 1), generator=g)
    return torch.unique(torch.cat([b, c], 1), dim=0).to(torch.int32)


def _tensors(c_in: int, n: int = 300, seed: int = 0):
    """A fine tensor (stride 1) and its stride-2 coarse tensor on the CPU, features N(0, 1) f32."""
    fine_c = _coords(n, 6, seed)
    g = torch.Generator().manual_seed(seed + 1)
    fine = lattice.SparseTensor(fine_c, torch.randn(fine_c.shape[0], c_in, generator=g))
    probe = lattice.ops.conv3d(fine, torch.zeros(1, 2, 2, 2, c_in), stride=2)
    coarse = lattice.SparseTensor(probe.coords, torch.randn(probe.coords.shape[0], c_in, generator=g), stride=2)
    return fine, coarse


def _weight(layout: str, k: int, c_in: int, c_out: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if layout == "dense_5d":
        return torch.randn(c_out, k, k, k, c_in, generator=g) / (k ** 1.5 * c_in) ** 0.5
    return torch.randn(k ** 3, c_in, c_out, generator=g) / (k ** 1.5 * c_in) ** 0.5


def _to(q: QuantizedWeight, device) -> QuantizedWeight:
    return QuantizedWeight(q.packed.to(device), q.scales.to(device), q.biases.to(device), q.bits, q.group_size,
                           q.layout, q.shape)


def _call(kind: str, x, w, bias=None, route=None, fine=None, coarse=None):
    op, k, kw, _, tgt = KINDS[kind]
    kw = dict(kw)
    if isinstance(w, torch.Tensor) and w.dim() == 3 or isinstance(w, QuantizedWeight) and w.layout == "kernel_major":
        kw["kernel_size"] = k
    if tgt is not None:
        kw["coordinates"] = fine if tgt == "fine" else coarse
    if route is not None:
        kw["route"] = route
    return getattr(lattice.ops, op)(x, w, bias, **kw)


def _close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    """y (may live on the device) against ref, norm-wise and element-wise at the dtype's tolerance."""
    assert y.shape == ref.shape, (what, tuple(y.shape), tuple(ref.shape))
    assert bool(torch.isfinite(y.detach().cpu()).all()), what
    problems = adm.compare(y, ref, TOL_NAME[dtype])
    assert not problems, f"{what}: " + "; ".join(problems)


def _check_admission(kind: str, x, w, route=None, fine=None, coarse=None) -> str:
    """explain() of a quantized call against the table (geometry: linear or the relation kind);
    with ``route`` forced, the forced verdict. Returns the route that runs."""
    key = adm.dtype_key(x.feats.dtype)
    tier = adm.device_tier()
    if kind == "linear":
        explain = lambda **kw: lattice.explain("linear", x, w, **kw)  # noqa: E731
        geometry = "linear"
    else:
        op, k, kw0, _, tgt = KINDS[kind]
        kw0 = dict(kw0)
        if w.layout == "kernel_major":
            kw0["kernel_size"] = k
        if tgt is not None:
            kw0["coordinates"] = fine if tgt == "fine" else coarse
        explain = lambda **kw: lattice.explain(op, x, w, **kw0, **kw)  # noqa: E731
        geometry = "submanifold" if kind == "identity" else kind
    chosen = adm.assert_explanation(explain(), "quantized", "forward", key, geometry, tier)
    if route is None:
        assert chosen is not None
        return chosen
    want = adm.verdict("quantized", route, "forward", key, geometry, tier)
    adm.assert_forced_explanation(explain(route=route), route, want)
    assert want == adm.ADMITTED, f"{route} is rejected for {kind} {key}: extend the test for rejections"
    return route


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("layout", ["dense_5d", "kernel_major"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_quantized_conv_matches_cpu_float_conv_on_dequantized_weight(kind, layout, bits, group):
    fine, coarse = _tensors(C_IN, seed=hash((kind, layout)) % 1000)
    _, k, _, src, _ = KINDS[kind]
    q = quantize_weight(_weight(layout, k, C_IN, C_OUT, seed=bits * 1000 + group), bits=bits, group_size=group,
                        layout=layout)
    qd = _to(q, DEV)
    bias = torch.randn(C_OUT, generator=torch.Generator().manual_seed(5))
    fine_d, coarse_d = fine.to(DEV), coarse.to(DEV)
    for dtype in DTYPES:
        x = fine if src == "fine" else coarse
        x = x.replace_feats(x.feats.to(dtype))
        xd = x.to(DEV)
        ref = _call(kind, x, dequantize_weight(q).to(dtype), bias.to(dtype), fine=fine, coarse=coarse)
        assert _check_admission(kind, xd, qd, fine=fine_d, coarse=coarse_d) == "cuda_decode_conv"
        for route in ROUTES:
            _check_admission(kind, xd, qd, route, fine=fine_d, coarse=coarse_d)
            y = _call(kind, xd, qd, bias.to(dtype).to(DEV), route=route, fine=fine_d, coarse=coarse_d)
            assert y.feats.device == xd.feats.device and y.feats.dtype == dtype
            assert torch.equal(y.coords.cpu(), ref.coords) and y.stride == ref.stride
            _close(y.feats, ref.feats, dtype, f"{kind} {layout} int{bits} g{group} {dtype} {route}")
        # the default route on cuda decodes the weight and runs the float route: deterministic, and
        # bitwise dequant_reference's result (the same decoder, the same float route after it)
        y1 = _call(kind, xd, qd, None, fine=fine_d, coarse=coarse_d).feats
        y2 = _call(kind, xd, qd, None, route="cuda_decode_conv", fine=fine_d, coarse=coarse_d).feats
        y3 = _call(kind, xd, qd, None, route="dequant_reference", fine=fine_d, coarse=coarse_d).feats
        assert torch.equal(y1, y2) and torch.equal(y1, y3)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_cuda_quantized_conv_with_16bit_scales(scale_dtype):
    fine, _ = _tensors(C_IN, seed=3)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, seed=4).to(scale_dtype), bits=4)
    assert q.dtype == scale_dtype
    ref = lattice.ops.subm_conv3d(fine, dequantize_weight(q).float())
    for route in ROUTES:
        _close(lattice.ops.subm_conv3d(fine.to(DEV), _to(q, DEV), route=route).feats, ref.feats, torch.float32)


def test_cuda_quantized_many_rows_and_channels():
    """Several row and channel tiles, many offsets per tile, C_in above one group and tile."""
    c_in, c_out = 200, 150
    coords = _coords(6000, 12, seed=7, batches=1)
    x = lattice.SparseTensor(coords, torch.randn(coords.shape[0], c_in, generator=torch.Generator().manual_seed(8)))
    for bits in (4, 8):
        q = quantize_weight(_weight("dense_5d", 3, c_in, c_out, seed=9 + bits), bits=bits, group_size=64)
        ref = lattice.ops.subm_conv3d(x, dequantize_weight(q))
        y = lattice.ops.subm_conv3d(x.to(DEV), _to(q, DEV))
        _close(y.feats, ref.feats, torch.float32)
        assert torch.equal(y.feats, lattice.ops.subm_conv3d(x.to(DEV), _to(q, DEV)).feats)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
def test_cuda_quantized_linear(dtype, bits):
    fine, _ = _tensors(C_IN, seed=21)
    w = torch.randn(C_OUT, C_IN, generator=torch.Generator().manual_seed(22)) / C_IN ** 0.5
    bias = torch.randn(C_OUT, generator=torch.Generator().manual_seed(23))
    for group in (32, 64, 128):
        q = quantize_weight(w, bits=bits, group_size=group)
        x = fine.replace_feats(fine.feats.to(dtype))
        ref = torch.nn.functional.linear(x.feats.double(), dequantize_weight(q).to(dtype).double(),
                                         bias.to(dtype).double())
        for route in ROUTES:
            _check_admission("linear", x.to(DEV), _to(q, DEV), route)
            y = lattice.ops.linear(x.to(DEV), _to(q, DEV), bias.to(dtype).to(DEV), route=route)
            assert y.feats.device.type == "cuda" and y.feats.dtype == dtype
            _close(y.feats, ref, dtype, f"linear int{bits} g{group} {dtype} {route}")
        y1 = lattice.ops.linear(x.to(DEV), _to(q, DEV)).feats
        assert torch.equal(y1, lattice.ops.linear(x.to(DEV), _to(q, DEV)).feats)


def test_cuda_explain_names_the_route():
    fine, _ = _tensors(C_IN, seed=41)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 42), bits=4)
    xd, qd = fine.to(DEV), _to(q, DEV)
    e = lattice.explain("subm_conv3d", xd, qd)
    assert e.chosen == "cuda_decode_conv"
    assert [r["route"] for r in e.rows] == ["cuda_decode_conv", "fused_dequant_gemm", "cuda_dequant_gemm",
                                            "dequant_reference"]
    assert "implicit_gemm_sm80" in str(e) or "gather_gemm_scatter" in str(e)  # the float stage after the decode
    assert "runs on cpu" in [r for r in e.rows if r["route"] == "fused_dequant_gemm"][0]["reason"]
    assert lattice.explain("subm_conv3d", xd, qd, route="dequant_reference").chosen == "dequant_reference"
    ql = _to(quantize_weight(torch.randn(C_OUT, C_IN), bits=8), DEV)
    assert lattice.explain("linear", xd, ql).chosen == "cuda_decode_conv"
    # CPU data never takes the CUDA route
    assert lattice.explain("subm_conv3d", fine, q).chosen == "fused_dequant_gemm"
    # float64 on cuda: no quantized route (float64 runs on cpu): the table's rejections, and the call
    # raises UnsupportedError; forcing either CUDA route raises the documented ValueError
    x64 = xd.replace_feats(xd.feats.double())
    tier = adm.device_tier()
    assert adm.assert_explanation(lattice.explain("subm_conv3d", x64, qd), "quantized", "forward", "f64",
                                  "submanifold", tier) is None
    adm.assert_no_route_raises(lambda: lattice.ops.subm_conv3d(x64, qd), "subm_conv3d")
    for route in ROUTES:
        want = adm.verdict("quantized", route, "forward", "f64", "submanifold", tier)
        adm.assert_forced_call_raises(lambda: lattice.ops.subm_conv3d(x64, qd, route=route), "subm_conv3d", route, want)


@pytest.mark.parametrize("n", adm.PARTIAL_TILE_NS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_quantized_partial_row_tiles(n, dtype):
    """Exactly 128k+1 / 128k+127 rows (1 and 63 past a multiple of the 64-row tile of
    cuda_dequant_gemm): linear and a 3x3x3 submanifold conv, both routes, against the CPU float op
    on the dequantized weight, element-wise (a wrong last tile fails even when the norm passes)."""
    g = torch.Generator().manual_seed(n)
    coords = _coords(4 * n, 9, seed=n, batches=2)[:n]
    assert coords.shape[0] == n
    x = lattice.SparseTensor(coords, torch.randn(n, C_IN, generator=g).to(dtype))
    w_lin = torch.randn(C_OUT, C_IN, generator=g) / C_IN ** 0.5
    w_conv = _weight("dense_5d", 3, C_IN, C_OUT, seed=n + 1)
    for bits in (4, 8):
        q_lin, q_conv = quantize_weight(w_lin, bits=bits), quantize_weight(w_conv, bits=bits)
        ref_lin = torch.nn.functional.linear(x.feats.double(), dequantize_weight(q_lin).to(dtype).double())
        ref_conv = lattice.ops.subm_conv3d(x, dequantize_weight(q_conv).to(dtype)).feats
        xd = x.to(DEV)
        for route in ROUTES:
            _check_admission("linear", xd, _to(q_lin, DEV), route)
            _close(lattice.ops.linear(xd, _to(q_lin, DEV), route=route).feats, ref_lin, dtype,
                   f"linear N={n} int{bits} {dtype} {route}")
            _check_admission("submanifold", xd, _to(q_conv, DEV), route)
            _close(lattice.ops.subm_conv3d(xd, _to(q_conv, DEV), route=route).feats, ref_conv, dtype,
                   f"subm_conv3d N={n} int{bits} {dtype} {route}")


def test_cuda_mixed_devices_are_value_errors():
    fine, _ = _tensors(C_IN, seed=51)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 52), bits=4)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a tensor on cuda:0, got cpu"):
        lattice.ops.subm_conv3d(fine.to(DEV), q)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a tensor on cpu, got cuda:0"):
        lattice.ops.subm_conv3d(fine, _to(q, DEV))
    mixed = QuantizedWeight(q.packed.to(DEV), q.scales, q.biases.to(DEV), q.bits, q.group_size, q.layout, q.shape)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a tensor on cuda:0, got cpu"):
        lattice.ops.subm_conv3d(fine.to(DEV), mixed)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] bias: expected a tensor on cuda:0, got cpu"):
        lattice.ops.subm_conv3d(fine.to(DEV), _to(q, DEV), torch.zeros(C_OUT))
    ql = quantize_weight(torch.randn(C_OUT, C_IN), bits=4)
    with pytest.raises(ValueError, match=r"\[linear\] weight: expected a tensor on cuda:0, got cpu"):
        lattice.ops.linear(fine.to(DEV), ql)


def test_cuda_quantized_modules_and_dequantize_on_device():
    torch.manual_seed(0)
    model = torch.nn.Sequential(lnn.SubmConv3d(C_IN, 32, 3), lnn.Conv3d(32, 24, 2, stride=2))
    qmodel = lnn.quantize(model, bits=8)
    fine, _ = _tensors(C_IN, seed=61)
    with torch.no_grad():
        ref = qmodel(fine)
        qmodel.to(DEV)
        y = qmodel(fine.to(DEV))
    assert torch.equal(y.coords.cpu(), ref.coords)
    _close(y.feats, ref.feats, torch.float32)
    # the device decoder gives the CPU decoder's bits
    from lattice.ops import quantized as Q
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 62), bits=4)
    for dtype in DTYPES:
        assert torch.equal(Q.dequantize_kernel_major(_to(q, DEV), dtype).cpu(), Q.dequantize_kernel_major(q, dtype))
