"""The batch norm op with a residual input: ``relu(bn(x) + residual)`` as one node and one pass
(lattice.ops.fused_batch_norm(..., residual=...), lattice.nn.features.batch_norm_add_relu, the
second batch norm of lattice.models' residual blocks).

* the CPU routes against the float64 oracle (tests/oracle/batch_norm.py, residual added before
  the ReLU; its gradient dy masked by the output);
* the parallel route is bitwise the unfused composition (its batch norm, then torch's add and
  ReLU) in float32 / float64, and the same bits for every thread count;
* a MinkUNet42 training step and inference with the fused blocks are bitwise the unfused ones
  (NN_RESIDUAL_DEVICES empty) on the CPU, and the fused path is what runs;
* bad residuals raise "[op] residual: expected ..., got ...";
* on CUDA the route is bitwise the CPU parallel route (every output, dtype, aligned or not), the
  residual's gradient alone works, and a MinkUNet42 float32 step is bitwise fused and unfused.
"""
from __future__ import annotations

import pytest
import torch

import cuda_admission as adm
import lattice
import lattice.nn as lnn
import oracle
from lattice import models
from lattice.ops import fused_bn as B
from oracle import batch_norm as BO

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _data(n, c, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    pd = B.param_dtype(dtype)
    x = (torch.randn(n, c, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    r = torch.randn(n, c, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(c, generator=g, dtype=torch.float64).to(pd)
    b = (0.3 * torch.randn(c, generator=g, dtype=torch.float64)).to(pd)
    rm = torch.randn(c, generator=g, dtype=torch.float64).to(pd)
    rv = (0.5 + torch.rand(c, generator=g, dtype=torch.float64)).to(pd)
    dy = torch.randn(n, c, generator=g, dtype=torch.float64).to(dtype)
    return x, r, w, b, rm, rv, dy


def _fused(route, x, r, w, b, rm, rv, dy, training, relu):
    xs, rs, ws, bs = (t.clone().requires_grad_() for t in (x, r, w, b))
    y = B.batch_norm_feats(xs, rm, rv, ws, bs, training, 0.1, 1e-5, relu, route=route, residual=rs)
    y.backward(dy)
    return y.detach(), xs.grad, ws.grad, bs.grad, rs.grad


@pytest.mark.parametrize("route", ["parallel", "reference"])
@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("training, relu", [(True, True), (True, False), (False, True)])
def test_cpu_routes_with_a_residual_equal_the_oracle(route, name, training, relu):
    dtype = DTYPES[name]
    x, r, w, b, rm, rv, dy = _data(301, 5, dtype, seed=3)
    rm0, rv0 = rm.clone(), rv.clone()
    y, dx, dw, db, dr = _fused(route, x, r, w, b, rm, rv, dy, training, relu)
    xe, re, dye = x.double().numpy(), r.double().numpy(), dy.double().numpy()
    wn, bnp = w.double().numpy(), b.double().numpy()
    ye, rme, rve, _, _ = BO.batch_norm_forward(xe, wn, bnp, rm0.double().numpy(), rv0.double().numpy(), training, 0.1,
                                               1e-5, relu, residual=re)
    assert y.dtype == dtype and dr.dtype == dtype
    oracle.assert_close(y.double().numpy(), ye, name, "y")
    stat = "f64" if name == "f64" else "f32"
    oracle.assert_close(rm.double().numpy(), rme, stat, "running_mean")
    dxe, dwe, dbe, dre = BO.batch_norm_backward(xe, dye, wn, bnp, rm0.double().numpy(), rv0.double().numpy(),
                                                training, 1e-5, relu, residual=re)
    tol = 5 * oracle.tolerance(name)
    oracle.assert_close(dx.double().numpy(), dxe, name, "dx", rtol=tol)
    oracle.assert_close(dw.double().numpy(), dwe, name, "dweight", rtol=tol)
    oracle.assert_close(db.double().numpy(), dbe, name, "dbias", rtol=tol)
    # dy' is dy or 0 exactly, wherever the fused output and the oracle agree on the sign
    mask = (y.double().numpy() > 0) == (ye > 0) if relu else slice(None)
    assert (dr.double().numpy()[mask] == dre[mask]).all()


@pytest.mark.parametrize("name", ["f32", "f64"])
@pytest.mark.parametrize("training, relu", [(True, True), (True, False), (False, True), (False, False)])
def test_parallel_route_with_a_residual_is_bitwise_the_composition(name, training, relu):
    """In f32 / f64 the parallel route's normalised value is already a rounded Acc, so adding the
    residual in the same pass gives torch's add of the two, bit for bit; the gradients too."""
    dtype = DTYPES[name]
    x, r, w, b, rm, rv, dy = _data(2000, 24, dtype, seed=5)
    rm1, rv1, rm2, rv2 = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    y, dx, dw, db, dr = _fused("parallel", x, r, w, b, rm1, rv1, dy, training, relu)
    xs, rs, ws, bs = (t.clone().requires_grad_() for t in (x, r, w, b))
    yu = B.batch_norm_feats(xs, rm2, rv2, ws, bs, training, 0.1, 1e-5, False, route="parallel") + rs
    if relu:
        yu = torch.relu(yu)
    yu.backward(dy)
    for got, want, what in ((y, yu.detach(), "y"), (dx, xs.grad, "dx"), (dw, ws.grad, "dweight"),
                            (db, bs.grad, "dbias"), (dr, rs.grad, "dresidual"), (rm1, rm2, "running_mean"),
                            (rv1, rv2, "running_var")):
        assert torch.equal(got, want), what


def test_parallel_route_with_a_residual_is_the_same_for_every_thread_count():
    x, r, w, b, rm, rv, dy = _data(5000, 40, torch.float32, seed=8)
    out = []
    old = lattice.get_num_threads()
    try:
        for t in (1, 2, 3):
            lattice.set_num_threads(t)
            out.append(_fused("parallel", x, r, w, b, rm.clone(), rv.clone(), dy, True, True))
    finally:
        lattice.set_num_threads(old)
    for other in out[1:]:
        assert all(torch.equal(a, e) for a, e in zip(out[0], other))


def test_the_callers_tensors_are_not_modified():
    x, r, w, b, rm, rv, dy = _data(100, 6, torch.float32, seed=1)
    copies = [t.clone() for t in (x, r, w, b, dy)]
    _fused("parallel", x, r, w, b, rm, rv, dy, True, True)
    assert all(torch.equal(t, c) for t, c in zip((x, r, w, b, dy), copies))


@pytest.mark.parametrize("bad, exc, msg", [
    (dict(residual="skip"), TypeError, r"^\[fused_batch_norm\] residual: expected a torch.Tensor \(N, C\) or None, "
                                       r"got str$"),
    (dict(residual=torch.randn(6, 3).double()), TypeError,
     r"^\[fused_batch_norm\] residual: expected float32 \(the dtype of the input\), got float64$"),
    (dict(residual=torch.randn(5, 3)), ValueError,
     r"^\[fused_batch_norm\] residual: expected shape \(6, 3\) \(that of the input\), got \(5, 3\)$"),
    (dict(residual=torch.randn(18)), ValueError,
     r"^\[fused_batch_norm\] residual: expected a 2-D \(N, C\) feature matrix, got shape \(18,\)$"),
    (dict(residual=torch.zeros(6, 3, dtype=torch.int32)), TypeError,
     r"^\[fused_batch_norm\] residual: expected float16, bfloat16, float32 or float64 features, got int32$"),
])
def test_bad_residuals_raise_lattice_errors(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        B.batch_norm_feats(torch.randn(6, 3), torch.zeros(3), torch.ones(3), None, None, True, relu=True, **bad)


def _step(monkeypatch, fused, train):
    g = torch.Generator().manual_seed(0)
    rows = torch.unique(torch.randint(0, 20, (400, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(len(rows), 1, dtype=torch.int64), rows], 1).int()
    feats = torch.randn(len(coords), 4, generator=g)
    labels = torch.randint(0, 19, (len(coords),), generator=g)
    torch.manual_seed(0)
    model = models.MinkUNet42(cr=0.125)
    monkeypatch.setattr(B, "NN_RESIDUAL_DEVICES", frozenset({"cpu"}) if fused else frozenset())
    calls = {"residual": 0}
    real = B.BatchNormFunction.apply

    def spy(*args):
        calls["residual"] += args[11] is not None if len(args) > 11 else 0
        return real(*args)

    monkeypatch.setattr(B.BatchNormFunction, "apply", spy)
    model.train(train)
    with torch.set_grad_enabled(train):
        out = model(lattice.SparseTensor(coords, feats))
        if train:
            torch.nn.functional.cross_entropy(out.feats, labels).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()} if train else {}
    return out.feats.detach(), grads, {k: v.clone() for k, v in model.state_dict().items()}, calls["residual"]


@pytest.mark.parametrize("train", [True, False])
def test_minkunet42_with_fused_residual_blocks_is_bitwise_the_unfused_model(monkeypatch, train):
    y1, g1, s1, n1 = _step(monkeypatch, True, train)
    y2, g2, s2, n2 = _step(monkeypatch, False, train)
    n_blocks = sum(isinstance(m, models.blocks.ResidualBlock) for m in models.MinkUNet42(cr=0.125).modules())
    assert n1 == n_blocks > 10 and n2 == 0  # every residual block fused in the first run, none in the second
    assert torch.equal(y1, y2)
    assert g1.keys() == g2.keys() and all(torch.equal(g1[k], g2[k]) for k in g1)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_batch_norm_add_relu_falls_back_with_hooks():
    """A hook on the batch norm: the modules are called as usual (the hook sees bn's output)."""
    bn, relu = lnn.BatchNorm(3), lnn.ReLU()
    seen = []
    bn.register_forward_hook(lambda m, i, o: seen.append(o))
    c = torch.cat([torch.zeros(10, 1, dtype=torch.int32), torch.arange(30, dtype=torch.int32).view(10, 3)], 1)
    x = lattice.SparseTensor(c, torch.randn(10, 3))
    skip = x.replace_feats(torch.randn(10, 3))
    y = lnn.features.batch_norm_add_relu(bn, relu, x, skip)
    assert len(seen) == 1
    torch.testing.assert_close(y.feats, torch.relu(seen[0].feats + skip.feats), rtol=0, atol=0)


def _bits(t):
    t = t.detach().cpu()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32 if t.element_size() == 4 else torch.int64)


@adm.needs_gpu()
@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("n, c, misaligned", [(3000, 32, False), (1000, 37, False), (999, 6, True), (70, 800, False),
                                              (250, 300, True), (2, 256, False)])
def test_cuda_route_with_a_residual_is_bitwise_the_cpu_parallel_route(name, n, c, misaligned):
    """The CUDA route adds the residual in the normalisation pass and writes its gradient in the
    input-gradient pass, in the CPU parallel route's order and arithmetic: the same bits for y, dx,
    dweight, dbias, the residual's gradient and the running statistics; misaligned buffers take
    the one-element kernels."""
    dtype = DTYPES[name]
    x, r, w, b, rm, rv, dy = _data(n, c, dtype, seed=n + c)
    for training, relu in ((True, True), (True, False), (False, True), (False, False)):
        rmp, rvp = rm.clone(), rv.clone()
        want = _fused("parallel", x, r, w, b, rmp, rvp, dy, training, relu)
        if misaligned:  # the residual one element into a buffer: not 16-byte aligned on the device
            buf = torch.empty(n * c + 1, dtype=dtype, device="cuda")
            rc = buf[1:].view(n, c)
            rc.copy_(r)
            assert rc.data_ptr() % 16 != 0
        else:
            rc = r.to("cuda")
        rmc, rvc = rm.clone().to("cuda"), rv.clone().to("cuda")
        xs, ws, bs = (t.to("cuda").requires_grad_() for t in (x, w, b))
        rc.requires_grad_()  # not cloned: the misaligned buffer is what the route reads
        y = B.batch_norm_feats(xs, rmc, rvc, ws, bs, training, 0.1, 1e-5, relu, route="cuda", residual=rc)
        y.backward(dy.to("cuda"))
        got = (y.detach(), xs.grad, ws.grad, bs.grad, rc.grad)
        for g, e, what in zip(got + (rmc, rvc), want + (rmp, rvp),
                              ("y", "dx", "dweight", "dbias", "dresidual", "running_mean", "running_var")):
            assert g.dtype == e.dtype and g.device.type == "cuda", what
            mism = int((_bits(g) != _bits(e)).sum())
            assert mism == 0, f"{what}: {mism} of {e.numel()} elements differ (training={training}, relu={relu})"


@adm.needs_gpu()
def test_cuda_residual_gradient_alone_and_device_errors():
    """Only the residual needs a gradient (x, weight and bias frozen): the input-gradient pass
    writes it without dx; a residual on another device is an error."""
    x, r, w, b, rm, rv, dy = _data(500, 16, torch.float32, seed=2)
    for dev, route in (("cpu", "parallel"), ("cuda", "cuda")):
        rs = r.to(dev).clone().requires_grad_()
        y = B.batch_norm_feats(x.to(dev), rm.to(dev), rv.to(dev), w.to(dev), b.to(dev), True, 0.1, 1e-5, True,
                               route=route, residual=rs)
        y.backward(dy.to(dev))
        if dev == "cpu":
            want = rs.grad
        else:
            assert torch.equal(rs.grad.cpu(), want)
    xc = torch.randn(6, 3, device="cuda")
    with pytest.raises(ValueError, match=r"\[fused_batch_norm\] residual: expected a tensor on cuda:0, got cpu"):
        B.batch_norm_feats(xc, torch.zeros(3, device="cuda"), torch.ones(3, device="cuda"), None, None, True,
                           relu=True, residual=torch.randn(6, 3))


@adm.needs_gpu()
def test_cuda_minkunet42_with_fused_residual_blocks_is_bitwise_the_unfused_model(monkeypatch):
    """On CUDA in training the residual blocks run fused (NN_RESIDUAL_DEVICES holds cuda): a
    float32 step equals the unfused one bit for bit (outputs, every gradient, the state)."""
    def step(fused):
        g = torch.Generator().manual_seed(0)
        rows = torch.unique(torch.randint(0, 20, (400, 3), generator=g), dim=0)
        coords = torch.cat([torch.zeros(len(rows), 1, dtype=torch.int64), rows], 1).int().cuda()
        feats = torch.randn(len(coords), 4, generator=g).cuda()
        labels = torch.randint(0, 19, (len(coords),), generator=g).cuda()
        torch.manual_seed(0)
        model = models.MinkUNet42(cr=0.125).cuda()
        monkeypatch.setattr(B, "NN_RESIDUAL_DEVICES", frozenset({"cuda"}) if fused else frozenset())
        out = model(lattice.SparseTensor(coords, feats))
        torch.nn.functional.cross_entropy(out.feats, labels).backward()
        return out.feats.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, model.state_dict()

    y1, g1, s1 = step(True)
    y2, g2, s2 = step(False)
    assert torch.equal(y1, y2)
    assert all(torch.equal(g1[k], g2[k]) for k in g1)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
