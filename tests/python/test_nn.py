"""lattice.nn modules: equal to the functional ops they wrap, and composable into a small residual
U-Net block that trains (loss decreases, every parameter gets a gradient, state_dict round trips)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
import oracle
from lattice import nn as lnn
from lattice import ops
from conftest import oracle_relation_for, random_coords


class UNetBlock(torch.nn.Module):
    """subm -> bn -> relu (skip) -> k2s2 down -> subm (+residual) -> transposed up onto the skip
    -> cat with the skip -> linear head; side heads: transposed (generated) and generative up."""

    def __init__(self, c_in: int = 3, c: int = 8) -> None:
        super().__init__()
        self.stem = lnn.SubmConv3d(c_in, c, 3)
        self.bn0 = lnn.BatchNorm(c)
        self.relu = lnn.ReLU()
        self.down = lnn.Conv3d(c, 2 * c, kernel_size=2, stride=2, bias=True)
        self.bn1 = lnn.BatchNorm(2 * c)
        self.mid = lnn.SubmConv3d(2 * c, 2 * c, kernel_size=(3, 1, 3), bias=True)
        self.up = lnn.ConvTranspose3d(2 * c, c, kernel_size=2, stride=2)
        self.head = lnn.Linear(2 * c, 1)
        self.side_up = lnn.ConvTranspose3d(2 * c, 1, kernel_size=3, stride=2, padding=1, bias=True)
        self.side_gen = lnn.GenerativeConvTranspose3d(2 * c, 1, kernel_size=2, stride=2)

    def forward(self, x: lattice.SparseTensor):
        skip = self.relu(self.bn0(self.stem(x)))
        d = self.relu(self.bn1(self.down(skip)))
        m = self.mid(d)
        m = self.relu(m.replace_feats(m.feats + d.feats))  # residual
        u = self.up(m, coordinates=skip)
        assert u.key == skip.key
        y = self.head(ops.cat([skip, u]))
        return y, self.side_up(m), self.side_gen(m)


def _input(rng, n=80, c_in=3):
    c = random_coords(rng, n, batches=2, extent=6, spread=5)
    return lattice.SparseTensor(torch.from_numpy(c), torch.from_numpy(rng.standard_normal((c.shape[0], c_in))).float())


def test_unet_block_sgd_steps_decrease_loss_and_every_parameter_gets_a_gradient(rng):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = UNetBlock()
    x = _input(rng)
    target = torch.from_numpy(rng.standard_normal((len(x), 1))).float()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

    def loss_fn():
        y, side, gen = model(x)
        assert y.key == x.key and tuple(y.feats.shape) == (len(x), 1)
        assert side.stride == (1, 1, 1) and gen.stride == (1, 1, 1)
        return torch.nn.functional.mse_loss(y.feats, target) + 0.1 * side.feats.pow(2).mean() + 0.1 * gen.feats.pow(2).mean()

    losses = []
    for step in range(15):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        if step == 0:
            for name, p in model.named_parameters():
                assert p.grad is not None, f"{name} got no gradient"
                assert torch.isfinite(p.grad).all(), name
                assert p.grad.abs().sum() > 0, f"{name} got an all-zero gradient"
        opt.step()
        losses.append(float(loss))
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses


def test_unet_block_state_dict_round_trip_reproduces_outputs(rng):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        a = UNetBlock()
        torch.manual_seed(2)
        b = UNetBlock()
    x = _input(rng)
    a.train()
    a(x)  # update BatchNorm running statistics
    a.eval()
    b.load_state_dict(a.state_dict())
    b.eval()
    for ya, yb in zip(a(x), b(x)):
        assert torch.equal(ya.feats, yb.feats)
        assert torch.equal(ya.coords, yb.coords)
    assert set(a.state_dict()) == set(b.state_dict())
    assert "bn0.bn.running_mean" in a.state_dict() and "stem.weight" in a.state_dict()
    assert tuple(a.state_dict()["stem.weight"].shape) == (8, 3, 3, 3, 3)


@pytest.mark.parametrize("module, op, kw", [
    (lambda: lnn.SubmConv3d(3, 4, (3, 1, 5), dilation=2, bias=True), "subm_conv3d", dict(dilation=2)),
    (lambda: lnn.Conv3d(3, 4, 3, stride=(2, 1, 2), padding=1), "conv3d", dict(stride=(2, 1, 2), padding=1)),
    (lambda: lnn.Conv3d(3, 4, 2, stride=2, expand=True, bias=True), "conv3d", dict(stride=2, expand=True)),
    (lambda: lnn.ConvTranspose3d(3, 4, 3, stride=1, padding=1), "conv_transpose3d", dict(padding=1)),
    (lambda: lnn.GenerativeConvTranspose3d(3, 4, 2, stride=1, bias=True), "generative_conv_transpose3d", {}),
], ids=["SubmConv3d", "Conv3d", "Conv3d_expand", "ConvTranspose3d", "GenerativeConvTranspose3d"])
def test_nn_conv_module_equals_oracle_with_its_weight(rng, module, op, kw):
    with torch.random.fork_rng():
        torch.manual_seed(3)
        m = module().double()
    coords = random_coords(rng, 30)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.from_numpy(rng.standard_normal((coords.shape[0], 3))))
    y = m(x)
    ks = m.kernel_size
    assert tuple(m.weight.shape) == (4, *ks, 3)
    bound = 1.0 / np.sqrt(3 * np.prod(ks))
    assert float(m.weight.abs().max()) <= bound
    rel = oracle_relation_for(op, coords, ks, **kw)
    wk = oracle.weight_to_kcc(m.weight.detach().numpy())
    bias = None if m.bias is None else m.bias.detach().numpy()
    ref = oracle.conv_forward(x.feats.numpy(), wk, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out, bias)
    np.testing.assert_array_equal(y.coords.numpy(), rel.out_coords)
    oracle.assert_close(y.feats, ref, "f64", type(m).__name__)


def test_nn_conv_transpose3d_with_target_lands_on_target_rows(rng):
    with torch.random.fork_rng():
        torch.manual_seed(4)
        down = lnn.Conv3d(2, 3, 2, stride=2).double()
        up = lnn.ConvTranspose3d(3, 2, 2, stride=2).double()
    coords = random_coords(rng, 30)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.from_numpy(rng.standard_normal((coords.shape[0], 2))))
    d = down(x)
    u = up(d, coordinates=x)
    assert u.key == x.key and u.stride == (1, 1, 1)
    rel = oracle.transposed_relation(d.coords.numpy(), 2, 2, target=coords)
    ref = oracle.conv_forward(d.feats.detach().numpy(), oracle.weight_to_kcc(up.weight.detach().numpy()),
                              rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
    oracle.assert_close(u.feats, ref, "f64", "ConvTranspose3d onto target")


def test_nn_batchnorm_relu_linear_act_on_features_and_keep_identity(rng):
    x = _input(rng, n=40, c_in=4)
    bn, relu, lin = lnn.BatchNorm(4), lnn.ReLU(), lnn.Linear(4, 2)
    y = bn(x)
    assert y.key == x.key
    f = x.feats
    expected = (f - f.mean(0)) / torch.sqrt(f.var(0, unbiased=False) + bn.eps)
    torch.testing.assert_close(y.feats, expected, rtol=1e-5, atol=1e-5)
    r = relu(y)
    assert r.key == x.key and torch.equal(r.feats, y.feats.clamp_min(0))
    o = lin(r)
    assert o.key == x.key and torch.allclose(o.feats, r.feats @ lin.weight.T + lin.bias)
    relu_inplace = lnn.ReLU(inplace=True)
    before = y.feats.clone()
    relu_inplace(y)
    assert torch.equal(y.feats, before), "ReLU(inplace=True) modified the caller's features"


def test_nn_conv_module_rejects_non_positive_channels():
    with pytest.raises(ValueError, match=r"^\[Conv3d\] channels: expected positive in/out channels"):
        lnn.Conv3d(0, 4, 3)


def test_nn_linear_f32_cpu_runs_the_pointwise_route_and_matches_a_float64_matmul(rng, monkeypatch):
    """float32 CPU Linear runs lattice's kernel-1 conv (not torch's BLAS): proved by counting the
    core calls; values and all three gradients agree with a float64 matmul to f32 rounding. The
    float64 module (and any traced call) still runs F.linear: bitwise equal to it."""
    import lattice.autograd as la
    coords = random_coords(rng, 300)
    f64 = torch.from_numpy(rng.standard_normal((coords.shape[0], 37)))
    x = lattice.SparseTensor(torch.from_numpy(coords), f64.float().requires_grad_())
    with torch.random.fork_rng():
        torch.manual_seed(5)
        lin = lnn.Linear(37, 19)
    calls = []
    real = la.core.conv_forward
    monkeypatch.setattr(la.core, "conv_forward", lambda *a: calls.append(1) or real(*a))
    y = lin(x)
    assert calls, "float32 CPU Linear did not run lattice's conv"
    assert y.key == x.key
    w64, b64 = lin.weight.detach().double(), lin.bias.detach().double()
    ref = f64 @ w64.T + b64
    torch.testing.assert_close(y.feats.double(), ref, rtol=1e-5, atol=1e-5)
    g64 = torch.from_numpy(rng.standard_normal(tuple(ref.shape)))
    dx, dw, db = torch.autograd.grad(y.feats, [x.feats, lin.weight, lin.bias], g64.float())
    torch.testing.assert_close(dx.double(), g64 @ w64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), g64.T @ f64, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(db.double(), g64.sum(0), rtol=1e-5, atol=1e-4)
    calls.clear()
    lin64 = lnn.Linear(37, 19).double()
    x64 = lattice.SparseTensor(torch.from_numpy(coords), f64)
    assert torch.equal(lin64(x64).feats, torch.nn.functional.linear(f64, lin64.weight, lin64.bias))
    assert not calls, "float64 Linear should run F.linear"


def test_nn_linear_under_a_torch_function_mode_calls_f_linear(rng):
    """lattice.export traces F.linear through a TorchFunctionMode: with a mode active the f32
    Linear must call it (and give F.linear's exact result)."""
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    coords = random_coords(rng, 50)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.randn(coords.shape[0], 6))
    lin = lnn.Linear(6, 4)
    with Spy():
        y = lin(x)
    assert torch.nn.functional.linear in seen
    assert torch.equal(y.feats, torch.nn.functional.linear(x.feats, lin.weight, lin.bias))


def _bn_pair(c: int, train: bool):
    with torch.random.fork_rng():
        torch.manual_seed(11)
        bn = lnn.BatchNorm(c, momentum=0.3, eps=1e-3)
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
    return bn.train(train)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batch_norm_relu_and_add_relu_equal_the_unfused_modules_bitwise(rng, train):
    """lattice.models' blocks call batch_norm_relu / add_relu (ReLU in place on the fresh batch
    norm output / residual sum). Against relu(bn(x)) and relu(a + b) with twin modules: the same
    values, input / weight / bias gradients and running statistics, bit for bit, in training
    and eval; the caller's features are not modified."""
    coords = random_coords(rng, 400)
    f = torch.from_numpy(rng.standard_normal((coords.shape[0], 24))).float() * 2 + 0.5
    g = torch.from_numpy(rng.standard_normal((coords.shape[0], 24))).float()
    results = []
    for fused in (True, False):
        bn, relu = _bn_pair(24, train), lnn.ReLU()
        xf = f.clone().requires_grad_()
        x = lattice.SparseTensor(torch.from_numpy(coords), xf)
        before = xf.detach().clone()
        y = lnn.features.batch_norm_relu(bn, relu, x) if fused else relu(bn(x))
        z = lnn.features.add_relu(relu, y, x) if fused else relu(y.replace_feats(y.feats + x.feats))
        assert y.key == x.key and z.key == x.key
        grads = torch.autograd.grad((y.feats * g).sum() + (z.feats * g).sum(), [xf, bn.weight, bn.bias])
        assert torch.equal(xf.detach(), before)
        results.append((y.feats.detach(), z.feats.detach(), *grads, bn.running_mean.clone(), bn.running_var.clone(),
                        bn.num_batches_tracked.clone()))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert float(results[0][0].min()) == 0.0 and float((results[0][0] == 0).float().mean()) > 0.05


def test_batch_norm_relu_with_hooks_or_tracing_calls_the_modules(rng):
    """A forward hook on either module, or a TorchFunctionMode (lattice.export's tracer), makes
    batch_norm_relu / add_relu call the modules themselves: the hooks run, and the mode sees
    F.batch_norm and F.relu (the calls the exporter turns into nodes)."""
    coords = random_coords(rng, 60)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.randn(coords.shape[0], 5))
    bn, relu = _bn_pair(5, False), lnn.ReLU()
    fired = []
    h = relu.register_forward_hook(lambda m, i, o: fired.append("relu"))
    out = lnn.features.batch_norm_relu(bn, relu, x)
    lnn.features.add_relu(relu, out, x)
    h.remove()
    assert fired == ["relu", "relu"]
    h = bn.register_forward_pre_hook(lambda m, i: fired.append("bn"))
    lnn.features.batch_norm_relu(bn, relu, x)
    h.remove()
    assert fired[-1] == "bn"
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Spy():
        y = lnn.features.batch_norm_relu(bn, relu, x)
        lnn.features.add_relu(relu, y, x)
    assert torch.nn.functional.batch_norm in seen
    assert seen.count(torch.nn.functional.relu) == 2


def test_nn_linear_under_cpu_autocast_follows_torch_linear(rng):
    """Inside torch.autocast("cpu", bfloat16) a float32 Linear takes torch's F.linear (autocast's
    rule for linear: bfloat16 output), not lattice's float32 pointwise conv."""
    coords = random_coords(rng, 50)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.randn(coords.shape[0], 8))
    lin = lnn.Linear(8, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
        want = torch.nn.functional.linear(x.feats, lin.weight, lin.bias)
    assert y.feats.dtype == torch.bfloat16 == want.dtype
    assert torch.equal(y.feats, want)
