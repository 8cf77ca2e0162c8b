"""Quantized execution of packed int4/int8 weights (SEMANTICS.md "Packed affine quantization";
issue 7): linear and every convolution kind with a QuantizedWeight, both routes
(fused_dequant_gemm, dequant_reference), f32/f16/bf16 activations, the inference-only modules,
lattice.nn.quantize, weight bytes, explain() and the validation messages.

The contract checked everywhere: op(X, Q) == op(X, dequantize_weight(Q).to(X.dtype)) within
float32 accumulation tolerance (the float op is lattice's own float route on the dequantized
weight, itself checked against the float64 oracle in test_conv_oracle.py).
"""
from __future__ import annotations

import copy

import pytest
import torch

import lattice
import lattice.nn as lnn
from lattice import QuantizedWeight, dequantize_weight, quantize_weight
from lattice.ops import quantized as Q
from lattice.routes import route_names

ROUTES = route_names("quantized", device="cpu")  # ["fused_dequant_gemm", "dequant_reference"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# relation kind -> (op, kernel size, kwargs, input: "fine" or "coarse", target: None / "fine" / "coarse")
KINDS = {
    "submanifold": ("subm_conv3d", 3, {}, "fine", None),
    "forward": ("conv3d", 2, {"stride": 2}, "fine", None),
    "target": ("conv3d", 3, {"stride": 2, "padding": 1}, "fine", "coarse"),
    "transposed": ("conv_transpose3d", 2, {"stride": 2}, "coarse", None),
    "transposed_target": ("conv_transpose3d", 3, {"stride": 2, "padding": 1}, "coarse", "fine"),
    "generative": ("generative_conv_transpose3d", 2, {"stride": 2}, "coarse", None),
}
C_IN, C_OUT = 40, 24  # C_in not a multiple of any group: exercises the zero padding


def _coords(n: int, side: int, seed: int, batches: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(-side, side, (n, 3), generator=g)
    b = torch.randint(0, batches, (n, 1), generator=g)
    return torch.unique(torch.cat([b, c], 1), dim=0).to(torch.int32)


def _tensors(c_in: int, n: int = 160, seed: int = 0):
    """A fine tensor (stride 1) and its stride-2 coarse tensor, features N(0, 1) float32."""
    fine_c = _coords(n, 5, seed)
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


def _call(kind: str, x: lattice.SparseTensor, w, bias=None, route=None, fine=None, coarse=None):
    op, k, kw, _, tgt = KINDS[kind]
    kw = dict(kw)
    if isinstance(w, torch.Tensor) and w.dim() == 3 or isinstance(w, QuantizedWeight) and w.layout == "kernel_major":
        kw["kernel_size"] = k
    if tgt is not None:
        kw["coordinates"] = fine if tgt == "fine" else coarse
    if route is not None:
        kw["route"] = route
    return getattr(lattice.ops, op)(x, w, bias, **kw)


def _tol(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def _close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """|y - ref| <= tol * max|ref| elementwise (tol: output rounding of the dtype; f32: accumulation)."""
    scale = max(float(ref.float().abs().max()), 1e-6)
    err = float((y.float() - ref.float()).abs().max())
    assert err <= _tol(dtype) * scale, (err, scale, dtype)


# ---- the contract: every relation kind x layout x bits x group, both routes, three dtypes ---------


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("layout", ["dense_5d", "kernel_major"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_quantized_conv_equals_float_conv_on_dequantized_weight(kind, layout, bits, group):
    fine, coarse = _tensors(C_IN, seed=hash((kind, layout)) % 1000)
    _, k, _, src, _ = KINDS[kind]
    w = _weight(layout, k, C_IN, C_OUT, seed=bits * 1000 + group)
    q = quantize_weight(w, bits=bits, group_size=group, layout=layout)
    bias = torch.randn(C_OUT, generator=torch.Generator().manual_seed(5))
    for dtype in DTYPES:
        x = (fine if src == "fine" else coarse)
        x = x.replace_feats(x.feats.to(dtype))
        ref = _call(kind, x, dequantize_weight(q).to(dtype), bias.to(dtype), fine=fine, coarse=coarse)
        outs = {}
        for route in ROUTES:
            y = _call(kind, x, q, bias.to(dtype), route=route, fine=fine, coarse=coarse)
            assert y.feats.dtype == dtype and y.feats.shape == ref.feats.shape
            assert torch.equal(y.coords, ref.coords) and y.stride == ref.stride
            _close(y.feats, ref.feats, dtype)
            outs[route] = y.feats
        _close(outs["fused_dequant_gemm"], outs["dequant_reference"], dtype)
        # the weight the fused route multiplies by is the dequantized one: with one tile the order
        # of the sums is that of gather_gemm_scatter, so f32 results agree to the last bits
        if dtype == torch.float32:
            assert torch.allclose(outs["fused_dequant_gemm"], outs["dequant_reference"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_quantized_conv_with_16bit_scales_and_f32_activations(scale_dtype):
    fine, _ = _tensors(C_IN, seed=3)
    w = _weight("dense_5d", 3, C_IN, C_OUT, seed=4).to(scale_dtype)
    q = quantize_weight(w, bits=4)
    assert q.dtype == scale_dtype
    ref = lattice.ops.subm_conv3d(fine, dequantize_weight(q).float())
    for route in ROUTES:
        _close(lattice.ops.subm_conv3d(fine, q, route=route).feats, ref.feats, torch.float32)


def test_quantized_conv_many_tiles_chunks_and_threads_match_dequant_reference():
    """C_in * C_out above one tile (several C_in tiles), thousands of edges (several chunks), and
    the same bits for 1 and 2 threads."""
    c_in, c_out = 200, 600
    coords = _coords(3000, 9, seed=7, batches=1)
    x = lattice.SparseTensor(coords, torch.randn(coords.shape[0], c_in, generator=torch.Generator().manual_seed(8)))
    w = _weight("kernel_major", 3, c_in, c_out, seed=9)
    q = quantize_weight(w, bits=4, group_size=32)
    ref = lattice.ops.subm_conv3d(x, dequantize_weight(q), kernel_size=3)
    threads = lattice.get_num_threads()
    try:
        lattice.set_num_threads(1)
        y1 = lattice.ops.subm_conv3d(x, q, kernel_size=3, route="fused_dequant_gemm").feats
        lattice.set_num_threads(2)
        y2 = lattice.ops.subm_conv3d(x, q, kernel_size=3, route="fused_dequant_gemm").feats
    finally:
        lattice.set_num_threads(threads)
    assert torch.equal(y1, y2)
    _close(y1, ref.feats, torch.float32)


def test_quantized_pointwise_identity_relation_and_empty_input():
    fine, _ = _tensors(C_IN, seed=11)
    w = _weight("dense_5d", 1, C_IN, C_OUT, seed=12)
    q = quantize_weight(w, bits=8)
    ref = lattice.ops.subm_conv3d(fine, dequantize_weight(q))
    for route in ROUTES:
        _close(lattice.ops.subm_conv3d(fine, q, route=route).feats, ref.feats, torch.float32)
    empty = lattice.SparseTensor(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, C_IN))
    for route in ROUTES:
        y = lattice.ops.subm_conv3d(empty, quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 1)), route=route)
        assert y.feats.shape == (0, C_OUT)


def test_fused_route_decodes_exactly_the_dequantized_weight():
    """The core's decoder (what dequant_reference multiplies by) equals dequantize_weight bit for bit."""
    for layout, shape in (("linear", (24, 40)), ("kernel_major", (8, 40, 24)), ("dense_5d", (24, 2, 2, 2, 40))):
        for bits in (4, 8):
            w = torch.randn(*shape, generator=torch.Generator().manual_seed(bits))
            q = quantize_weight(w, bits=bits, layout=layout)
            d = dequantize_weight(q)
            kcc = {"linear": lambda t: t.t().unsqueeze(0), "kernel_major": lambda t: t,
                   "dense_5d": lambda t: t.permute(1, 2, 3, 4, 0).reshape(8, 40, 24)}[layout](d)
            for dtype in DTYPES:
                assert torch.equal(Q.dequantize_kernel_major(q, dtype), kcc.to(dtype)), (layout, bits, dtype)


# ---- linear -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_linear_equals_float_linear_on_dequantized_weight(bits, group):
    fine, _ = _tensors(C_IN, seed=21)
    w = torch.randn(C_OUT, C_IN, generator=torch.Generator().manual_seed(22))
    b = torch.randn(C_OUT, generator=torch.Generator().manual_seed(23))
    q = quantize_weight(w, bits=bits, group_size=group)
    for dtype in DTYPES:
        x = fine.replace_feats(fine.feats.to(dtype))
        ref = lattice.ops.linear(x, dequantize_weight(q).to(dtype), b.to(dtype))
        outs = []
        for route in ROUTES:
            y = lattice.ops.linear(x, q, b.to(dtype), route=route)
            assert y.key == x.key and y.feats.dtype == dtype
            _close(y.feats, ref.feats, dtype)
            outs.append(y.feats)
        _close(outs[0], outs[1], dtype)


def test_quantized_linear_many_rows_threads_bitwise_equal():
    coords = _coords(6000, 20, seed=31, batches=1)
    x = lattice.SparseTensor(coords, torch.randn(coords.shape[0], 96))
    q = quantize_weight(torch.randn(200, 96), bits=4)
    threads = lattice.get_num_threads()
    try:
        lattice.set_num_threads(1)
        y1 = lattice.ops.linear(x, q).feats
        lattice.set_num_threads(2)
        y2 = lattice.ops.linear(x, q).feats
    finally:
        lattice.set_num_threads(threads)
    assert torch.equal(y1, y2)
    _close(y1, torch.nn.functional.linear(x.feats, dequantize_weight(q)), torch.float32)


# ---- explain ----------------------------------------------------------------------------------------


def test_explain_lists_both_quantized_routes_and_forced_route():
    fine, _ = _tensors(C_IN, seed=41)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 42), bits=4)
    e = lattice.explain("subm_conv3d", fine, q)
    assert [r["route"] for r in e.rows] == ["cuda_decode_conv", "fused_dequant_gemm", "cuda_dequant_gemm",
                                            "dequant_reference"]
    assert e.chosen == "fused_dequant_gemm" and all(r["admitted"] for r in e.rows if r["route"] in ROUTES)
    assert "runs on cuda" in e.rows[0]["reason"] and "runs on cuda" in e.rows[2]["reason"]  # CPU data: the CUDA routes are listed, rejected
    assert "int4 weight" in str(e) and "dequant_reference" in str(e)
    e2 = lattice.explain("subm_conv3d", fine, q, route="dequant_reference")
    assert e2.chosen == "dequant_reference"
    ql = quantize_weight(torch.randn(C_OUT, C_IN), bits=8)
    el = lattice.explain("linear", fine, ql)
    assert el.chosen == "fused_dequant_gemm" and len(el.rows) == 4
    # float64 activations: only dequant_reference is admitted
    x64 = fine.replace_feats(fine.feats.double())
    e64 = lattice.explain("subm_conv3d", x64, q)
    assert e64.chosen == "dequant_reference"
    assert "float64" in [r for r in e64.rows if r["route"] == "fused_dequant_gemm"][0]["reason"]
    y = lattice.ops.subm_conv3d(x64, q)
    _close(y.feats, lattice.ops.subm_conv3d(x64, dequantize_weight(q).double()).feats, torch.float32)


def test_explain_dequant_reference_shows_the_float_route_it_runs_next():
    """explain() is the whole decision: dequant_reference decodes W and then runs a float conv
    route; that second choice is the explanation's next stage (the conv table, with its reasons),
    and the other quantized routes, which run no float route, have no stage."""
    fine, _ = _tensors(C_IN, seed=45)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 46), bits=4)
    assert lattice.explain("subm_conv3d", fine, q).stages == []
    e = lattice.explain("subm_conv3d", fine, q, route="dequant_reference")
    (stage,) = e.stages
    assert [r["route"] for r in stage.rows] == route_names("conv")
    expected = lattice.explain("subm_conv3d", fine, dequantize_weight(q), kernel_size=3).chosen
    assert stage.chosen == expected and stage.chosen in route_names("conv", device="cpu")
    assert "pointwise_matmul" in str(e).split("then:")[1] and "needs kernel volume 1, got 27" in str(e)
    ql = quantize_weight(torch.randn(C_OUT, C_IN), bits=8)
    (lin,) = lattice.explain("linear", fine, ql, route="dequant_reference").stages
    assert lin.chosen == "pointwise_matmul"  # linear's float route: the identity relation of volume 1


def test_force_route_environment_variable(monkeypatch):
    fine, _ = _tensors(C_IN, seed=43)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 44), bits=4)
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "quantized:dequant_reference")
    assert lattice.explain("subm_conv3d", fine, q).chosen == "dequant_reference"
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "dequant_reference")  # no family prefix
    assert lattice.explain("subm_conv3d", fine, q).chosen == "dequant_reference"
    w = _weight("dense_5d", 3, C_IN, C_OUT, 44)
    assert lattice.explain("subm_conv3d", fine, w).chosen  # the conv family is left alone


# ---- modules and lattice.nn.quantize -------------------------------------------------------------


def _float_modules():
    torch.manual_seed(0)
    return {
        "subm": lnn.SubmConv3d(C_IN, C_OUT, 3, bias=True),
        "conv": lnn.Conv3d(C_IN, C_OUT, 2, stride=2, bias=True),
        "tr": lnn.ConvTranspose3d(C_IN, C_OUT, 2, stride=2, bias=True),
        "gen": lnn.GenerativeConvTranspose3d(C_IN, C_OUT, 2, stride=2),
        "lin": lnn.Linear(C_IN, C_OUT),
    }


QUANT_TYPES = {"subm": lnn.QuantizedSubmConv3d, "conv": lnn.QuantizedConv3d, "tr": lnn.QuantizedConvTranspose3d,
               "gen": lnn.QuantizedGenerativeConvTranspose3d, "lin": lnn.QuantizedLinear}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("name", list(QUANT_TYPES))
def test_module_from_float_equals_float_module_with_dequantized_weight(name, bits):
    fine, coarse = _tensors(C_IN, seed=51)
    fm = _float_modules()[name]
    qm = QUANT_TYPES[name].from_float(fm, bits=bits, group_size=32)
    assert isinstance(qm.weight, QuantizedWeight) and qm.weight.bits == bits
    ref_m = copy.deepcopy(fm)
    with torch.no_grad():
        ref_m.weight.copy_(dequantize_weight(qm.weight))
    x = coarse if name in ("tr", "gen") else fine
    with torch.no_grad():
        _close(qm(x).feats, ref_m(x).feats, torch.float32)
    assert set(qm.state_dict()) >= {"packed", "scales", "biases"}
    assert "int" in repr(qm)


def test_module_half_converts_scales_and_runs_f16():
    fine, _ = _tensors(C_IN, seed=52)
    qm = lnn.QuantizedSubmConv3d.from_float(_float_modules()["subm"], bits=4).half()
    assert qm.scales.dtype == torch.float16 and qm.packed.dtype == torch.int32 and qm.bias.dtype == torch.float16
    x = fine.replace_feats(fine.feats.half())
    ref = lattice.ops.subm_conv3d(x, dequantize_weight(qm.weight), qm.bias)
    _close(qm(x).feats, ref.feats, torch.float16)


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = lnn.SubmConv3d(4, 32, 3)
        self.bn = lnn.BatchNorm(32)
        self.down = lnn.Conv3d(32, 64, 2, stride=2)
        self.up = lnn.ConvTranspose3d(64, 32, 2, stride=2)
        self.blocks = torch.nn.Sequential(lnn.SubmConv3d(32, 32, 3), lnn.ReLU())
        self.head = lnn.Linear(32, 5)

    def forward(self, x):
        y = lattice.ops.relu(self.bn(self.a(x)))
        z = self.up(self.down(y), y)
        return self.head(self.blocks(z))


@pytest.mark.parametrize("bits", [4, 8])
def test_nn_quantize_converts_every_eligible_module_in_place(bits):
    torch.manual_seed(1)
    model = _Small().eval()
    coords = _coords(300, 6, seed=61)
    x = lattice.SparseTensor(coords, torch.randn(coords.shape[0], 4))
    with torch.no_grad():
        ref = model(x).feats
    before = lnn.weight_bytes_report(model)
    q = lnn.quantize(copy.deepcopy(model), bits=bits)
    kinds = {type(m).__name__ for m in q.modules()}
    assert {"QuantizedSubmConv3d", "QuantizedConv3d", "QuantizedConvTranspose3d", "QuantizedLinear"} <= kinds
    assert not kinds & {"SubmConv3d", "Conv3d", "ConvTranspose3d", "Linear"}
    assert type(q.bn).__name__ == "BatchNorm"
    after = lnn.weight_bytes_report(q)
    assert after["layers"] < before["layers"] * (0.45 if bits == 8 else 0.3)
    assert after["other"] == before["other"] and lnn.weight_bytes(q) == after["total"]
    # the same as the float model with every conv / linear weight replaced by its dequantized one
    deq = copy.deepcopy(model)
    for (n1, m1), (n2, m2) in zip(deq.named_modules(), q.named_modules()):
        assert n1 == n2
        if hasattr(m2, "packed"):
            with torch.no_grad():
                m1.weight.copy_(dequantize_weight(m2.weight))
    with torch.no_grad():
        y = q(x).feats
        _close(y, deq(x).feats, torch.float32)
    err = float((y - ref).abs().max() / ref.abs().max())
    assert err < (0.05 if bits == 8 else 0.5)
    m = _Small()
    assert lnn.quantize(m) is m


def test_backward_through_packed_weight_raises_inference_only_error():
    fine, _ = _tensors(C_IN, seed=71)
    q = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 72), bits=4)
    x = fine.replace_feats(fine.feats.clone().requires_grad_(True))
    y = lattice.ops.subm_conv3d(x, q)
    with pytest.raises(RuntimeError, match=r"\[subm_conv3d\] weight: expected a float weight for training, got a "
                                           r"QuantizedWeight \(packed weights are inference-only; dequantize_weight\(\)"):
        y.feats.sum().backward()
    qm = lnn.QuantizedLinear.from_float(lnn.Linear(C_IN, 3))
    with pytest.raises(RuntimeError, match=r"\[linear\] weight: expected a float weight for training"):
        qm(x).feats.sum().backward()
    with torch.no_grad():  # inference under no_grad never builds a graph
        assert not lattice.ops.subm_conv3d(x, q).feats.requires_grad


# ---- validation ---------------------------------------------------------------------------------


def test_quantized_validation_errors():
    fine, _ = _tensors(C_IN, seed=81)
    q5 = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 82), bits=4)
    qk = quantize_weight(_weight("kernel_major", 3, C_IN, C_OUT, 83), bits=4)
    ql = quantize_weight(torch.randn(C_OUT, C_IN), bits=4)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a QuantizedWeight with layout 'kernel_major' "
                                         r"or 'dense_5d', got layout 'linear'"):
        lattice.ops.subm_conv3d(fine, ql, kernel_size=3)
    with pytest.raises(ValueError, match=r"\[linear\] weight: expected a QuantizedWeight with layout 'linear', got "
                                         r"layout 'dense_5d'"):
        lattice.ops.linear(fine, q5)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] kernel_size: expected a kernel size"):
        lattice.ops.subm_conv3d(fine, qk)
    with pytest.raises(ValueError, match=r"\[conv3d\] weight: expected logical shape \(8, C_in=40, C_out\), got "
                                         r"\(27, 40, 24\)"):
        lattice.ops.conv3d(fine, qk, kernel_size=2, stride=2)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a QuantizedWeight of logical shape "
                                         r"\(C_out, 5, 5, 5, C_in\)"):
        lattice.ops.subm_conv3d(fine, q5, kernel_size=5)
    narrow = fine.replace_feats(fine.feats[:, :16].contiguous())
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected logical shape \(C_out, 3, 3, 3, C_in=16\), "
                                         r"got \(24, 3, 3, 3, 40\)"):
        lattice.ops.subm_conv3d(narrow, q5)
    with pytest.raises(ValueError, match=r"\[linear\] weight: expected logical shape \(C_out, C_in=16\), got \(24, 40\)"):
        lattice.ops.linear(narrow, ql)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] route: expected one of 'cuda_decode_conv', 'fused_dequant_gemm', "
                                         r"'cuda_dequant_gemm', 'dequant_reference', got 'reference'$"):
        lattice.ops.subm_conv3d(fine, q5, route="reference")
    with pytest.raises(ValueError, match=r"\[linear\] route: expected None for a float weight"):
        lattice.ops.linear(fine, torch.randn(C_OUT, C_IN), route="fused_dequant_gemm")
    with pytest.raises(TypeError, match=r"\[subm_conv3d\] bias: expected float32 \(the dtype of feats\), got float16"):
        lattice.ops.subm_conv3d(fine, q5, torch.zeros(C_OUT, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"\[linear\] bias: expected shape \(C_out=24,\), got \(3,\)"):
        lattice.ops.linear(fine, ql, torch.zeros(3))
    with pytest.raises(TypeError, match=r"\[subm_conv3d\] weight: expected a torch.Tensor or a lattice.QuantizedWeight"):
        lattice.ops.subm_conv3d(fine, [1, 2, 3], kernel_size=3)
    # a QuantizedWeight whose fields were changed after construction is checked again by the core
    bad = quantize_weight(_weight("dense_5d", 3, C_IN, C_OUT, 84), bits=4)
    bad.scales = bad.scales[:, :1].contiguous()
    bad.biases = bad.biases[:, :1].contiguous()
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected scales of shape \(27, 2, 24\), got "
                                         r"\(27, 1, 24\)"):
        lattice.ops.subm_conv3d(fine, bad)
    with pytest.raises(TypeError, match=r"\[QuantizedSubmConv3d.from_float\] module: expected a lattice.nn.SubmConv3d"):
        lnn.QuantizedSubmConv3d.from_float(lnn.Conv3d(4, 4, 2))
    with pytest.raises(ValueError, match=r"\[quantize\] bits: expected 4 or 8, got 3"):
        lnn.quantize(_Small(), bits=3)
    with pytest.raises(TypeError, match=r"\[quantize\] model: expected a torch.nn.Module"):
        lnn.quantize("model")
