"""Feature ops and their modules: equal to the float64 oracle, rows and coordinate identity kept,
validation messages; SyncBatchNorm conversion (torch's and lattice's) on models built from
lattice.nn modules."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
import oracle
from lattice import nn as lnn
from lattice import ops
from oracle import features as FO
from conftest import random_coords


def _x(rng, n=30, c=4, dtype=torch.float64):
    coords = random_coords(rng, n)
    return lattice.SparseTensor(torch.from_numpy(coords), torch.from_numpy(rng.standard_normal((len(coords), c)) * 2).to(dtype))


ACTIVATIONS = [
    ("relu", {}, FO.relu),
    ("leaky_relu", {"negative_slope": 0.2}, lambda v: FO.leaky_relu(v, 0.2)),
    ("gelu", {}, FO.gelu),
    ("gelu", {"approximate": "tanh"}, lambda v: FO.gelu(v, "tanh")),
    ("silu", {}, FO.silu),
    ("sigmoid", {}, FO.sigmoid),
    ("tanh", {}, FO.tanh),
    ("softplus", {"beta": 2.0, "threshold": 3.0}, lambda v: FO.softplus(v, 2.0, 3.0)),
]


@pytest.mark.parametrize("name, kw, ref", ACTIVATIONS, ids=[f"{a[0]}{a[1]}" for a in ACTIVATIONS])
def test_activation_equals_oracle_and_keeps_identity(rng, name, kw, ref):
    x = _x(rng)
    y = getattr(ops, name)(x, **kw)
    assert y.key == x.key and torch.equal(y.coords, x.coords)
    oracle.assert_close(y.feats, ref(x.feats.numpy()), "f64", name)


@pytest.mark.parametrize("dtype_name, dtype", [("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_activations_low_precision_equal_oracle(rng, dtype_name, dtype):
    x = _x(rng, dtype=dtype)
    xin = oracle.round_to_dtype(x.feats, dtype_name)
    for name, kw, ref in ACTIVATIONS:
        oracle.assert_close(getattr(ops, name)(x, **kw).feats, ref(xin), dtype_name, name)


@pytest.mark.parametrize("dtype_name, dtype", [("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_linear_and_norms_low_precision_equal_oracle(rng, dtype_name, dtype):
    x = _x(rng, dtype=dtype)
    xin = oracle.round_to_dtype(x.feats, dtype_name)
    w = torch.from_numpy(rng.standard_normal((3, 4))).to(dtype)
    v = torch.from_numpy(rng.standard_normal(4)).to(dtype)
    y = ops.linear(x, w, v[:3])
    assert y.feats.dtype == dtype
    oracle.assert_close(y.feats, FO.linear(xin, oracle.round_to_dtype(w, dtype_name), oracle.round_to_dtype(v[:3], dtype_name)),
                        dtype_name, "linear")
    vr = oracle.round_to_dtype(v, dtype_name)
    oracle.assert_close(ops.layer_norm(x, v, v).feats, FO.layer_norm(xin, vr, vr), dtype_name, "layer_norm")
    mean, var = torch.zeros(4, dtype=dtype), torch.ones(4, dtype=dtype)
    y = ops.batch_norm(x, mean, var, v, v, training=True, momentum=1.0)
    oracle.assert_close(y.feats, FO.batch_norm(xin, weight=vr, bias=vr), dtype_name, "batch_norm")
    oracle.assert_close(mean, xin.mean(0), dtype_name, "running_mean updated in place")


def test_linear_equals_oracle(rng):
    x = _x(rng)
    w = torch.from_numpy(rng.standard_normal((3, 4)))
    b = torch.from_numpy(rng.standard_normal(3))
    y = ops.linear(x, w, b)
    assert y.key == x.key
    oracle.assert_close(y.feats, FO.linear(x.feats.numpy(), w.numpy(), b.numpy()), "f64", "linear")
    oracle.assert_close(ops.linear(x, w).feats, FO.linear(x.feats.numpy(), w.numpy()), "f64", "linear no bias")


def test_batch_norm_training_uses_row_statistics_and_updates_running_stats(rng):
    x = _x(rng)
    mean, var = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    w, b = torch.full((4,), 2.0, dtype=torch.float64), torch.full((4,), 0.5, dtype=torch.float64)
    y = ops.batch_norm(x, mean, var, w, b, training=True, momentum=0.5, eps=1e-5)
    f = x.feats.numpy()
    oracle.assert_close(y.feats, FO.batch_norm(f, weight=w.numpy(), bias=b.numpy()), "f64", "train")
    np.testing.assert_allclose(mean.numpy(), 0.5 * f.mean(0))
    np.testing.assert_allclose(var.numpy(), 0.5 + 0.5 * f.var(0, ddof=1))
    y = ops.batch_norm(x, mean, var)  # eval: running statistics
    oracle.assert_close(y.feats, FO.batch_norm(f, mean.numpy(), var.numpy()), "f64", "eval")
    assert y.key == x.key


def test_layer_norm_and_rms_norm_equal_oracle(rng):
    x = _x(rng)
    w = torch.from_numpy(rng.standard_normal(4))
    b = torch.from_numpy(rng.standard_normal(4))
    f = x.feats.numpy()
    oracle.assert_close(ops.layer_norm(x, w, b).feats, FO.layer_norm(f, w.numpy(), b.numpy()), "f64", "layer_norm")
    oracle.assert_close(ops.rms_norm(x, w, eps=1e-6).feats, FO.rms_norm(f, w.numpy(), 1e-6), "f64", "rms_norm")
    eps = torch.finfo(torch.float64).eps
    oracle.assert_close(ops.rms_norm(x).feats, FO.rms_norm(f, None, eps), "f64", "rms_norm default eps")


@pytest.mark.parametrize("dtype_name, dtype", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_rms_norm_low_precision_equals_oracle(rng, dtype_name, dtype):
    x = _x(rng, dtype=dtype)
    w = torch.from_numpy(rng.standard_normal(4)).to(dtype)
    y = ops.rms_norm(x, w, eps=1e-5)
    assert y.feats.dtype == dtype
    ref = FO.rms_norm(oracle.round_to_dtype(x.feats, dtype_name), oracle.round_to_dtype(w, dtype_name), 1e-5)
    oracle.assert_close(y.feats, ref, dtype_name, "rms_norm")


def test_rms_norm_gradcheck_f64(rng):
    x = _x(rng, n=10, c=3)
    f = x.feats.clone().requires_grad_(True)
    w = torch.from_numpy(rng.standard_normal(3)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: ops.rms_norm(x.replace_feats(a), b, eps=1e-3).feats, (f, w))


def test_dropout_zeroes_and_scales_in_training_and_is_identity_in_eval(rng):
    x = _x(rng, n=200, c=8)
    torch.manual_seed(0)
    y = ops.dropout(x, 0.25, training=True)
    kept = y.feats != 0
    assert 0.6 < float(kept.double().mean()) < 0.9 and y.key == x.key
    torch.testing.assert_close(y.feats[kept], x.feats[kept] / 0.75)
    assert torch.equal(ops.dropout(x, 0.25, training=False).feats, x.feats)
    assert torch.equal(ops.dropout(x, 0.0).feats, x.feats)


# ---- modules -----------------------------------------------------------------------------------


MODULES = [
    (lambda: lnn.ReLU(), lambda x: ops.relu(x)),
    (lambda: lnn.LeakyReLU(0.3), lambda x: ops.leaky_relu(x, 0.3)),
    (lambda: lnn.GELU("tanh"), lambda x: ops.gelu(x, "tanh")),
    (lambda: lnn.SiLU(), lambda x: ops.silu(x)),
    (lambda: lnn.Sigmoid(), lambda x: ops.sigmoid(x)),
    (lambda: lnn.Tanh(), lambda x: ops.tanh(x)),
    (lambda: lnn.Softplus(0.5, 10.0), lambda x: ops.softplus(x, 0.5, 10.0)),
]


@pytest.mark.parametrize("make, fn", MODULES, ids=["ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softplus"])
def test_activation_module_equals_functional(rng, make, fn):
    x = _x(rng)
    y = make()(x)
    assert y.key == x.key and torch.equal(y.feats, fn(x).feats)


def test_norm_and_linear_modules_equal_functional_and_train(rng):
    x = _x(rng)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ln, rms, lin = lnn.LayerNorm(4).double(), lnn.RMSNorm(4, eps=1e-6).double(), lnn.Linear(4, 2).double()
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(rms.weight)
    assert torch.equal(ln(x).feats, ops.layer_norm(x, ln.weight, ln.bias).feats)
    assert torch.equal(rms(x).feats, ops.rms_norm(x, rms.weight, 1e-6).feats)
    assert torch.equal(lin(x).feats, ops.linear(x, lin.weight, lin.bias).feats)
    lin(rms(ln(x))).feats.sum().backward()
    for m in (ln, rms, lin):
        assert all(p.grad is not None for p in m.parameters())
    assert lnn.RMSNorm(3, elementwise_affine=False).weight is None
    assert "4, eps=1e-06" in repr(rms)


def test_dropout_module_follows_train_and_eval(rng):
    x = _x(rng, n=100)
    d = lnn.Dropout(0.5)
    assert (d(x).feats == 0).any()
    d.eval()
    assert torch.equal(d(x).feats, x.feats)


def test_batchnorm_module_matches_batchnorm1d_and_exposes_its_state(rng):
    x = _x(rng)
    bn = lnn.BatchNorm(4).double()
    ref = torch.nn.BatchNorm1d(4).double()
    torch.testing.assert_close(bn(x).feats, ref(x.feats))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    assert bn.num_features == 4 and bn.eps == 1e-5 and bn.momentum == 0.1 and bn.affine
    assert int(bn.num_batches_tracked) == 1 and bn.weight is bn.bn.weight and bn.bias is bn.bn.bias
    assert set(bn.state_dict()) == {"bn." + k for k in ref.state_dict()}
    bn.eval()
    ref.eval()
    torch.testing.assert_close(bn(x).feats, ref(x.feats))


def test_batchnorm_loads_checkpoints_with_the_flat_names_of_the_earlier_layout(rng):
    old = torch.nn.BatchNorm1d(4).double()
    old(_x(rng).feats)
    bn = lnn.BatchNorm(4).double()
    bn.load_state_dict(old.state_dict())  # strict: every entry found
    torch.testing.assert_close(bn.running_mean, old.running_mean)
    model = torch.nn.Sequential(lnn.BatchNorm(4).double())
    model.load_state_dict({"0." + k: v for k, v in old.state_dict().items()})
    torch.testing.assert_close(model[0].running_var, old.running_var)


class _Block(torch.nn.Module):
    """Only lattice modules on the feature path (subm conv -> BatchNorm -> ReLU -> Linear -> BatchNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = lnn.SubmConv3d(4, 6, 3)
        self.bn = lnn.BatchNorm(6)
        self.act = lnn.ReLU()
        self.head = torch.nn.Sequential(lnn.Linear(6, 3), lnn.BatchNorm(3))

    def forward(self, x: lattice.SparseTensor) -> lattice.SparseTensor:
        return self.head(self.act(self.bn(self.conv(x))))


def _trained_block(rng):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        m = _Block().double()
    x = _x(rng)
    m.train()
    m(x)  # running statistics
    m.eval()
    return m, x


def test_torch_convert_sync_batchnorm_output_runs_forward_in_eval_on_cpu(rng):
    m, x = _trained_block(rng)
    expected = m(x).feats
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(m)
    assert [type(mod).__name__ for mod in converted.modules()].count("SyncBatchNorm") == 2
    assert isinstance(converted.bn, lnn.BatchNorm) and isinstance(converted.bn.bn, torch.nn.SyncBatchNorm)
    converted.eval()  # torch's conversion does not carry the eval flag over to the new children
    y = converted(x)
    assert y.key == x.key
    torch.testing.assert_close(y.feats, expected)


def test_torch_convert_sync_batchnorm_single_process_training_runs_as_batch_norm_on_cpu(rng):
    x = _x(rng)
    bn = lnn.BatchNorm(4).double()
    ref = torch.nn.BatchNorm1d(4).double()
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(bn)
    torch.testing.assert_close(converted(x).feats, ref(x.feats))
    torch.testing.assert_close(converted.running_var, ref.running_var)


def test_lattice_convert_sync_batchnorm_yields_sync_modules_sharing_state(rng):
    m, x = _trained_block(rng)
    expected = m(x).feats
    weight = m.bn.weight
    converted = lnn.convert_sync_batchnorm(m)
    assert isinstance(converted.bn, lnn.SyncBatchNorm) and isinstance(converted.head[1], lnn.SyncBatchNorm)
    assert converted.bn.weight is weight and not converted.bn.training and not converted.bn.bn.training
    torch.testing.assert_close(converted(x).feats, expected)  # still in eval mode: no call to .eval() needed
    assert lnn.convert_sync_batchnorm(converted.bn) is converted.bn


def test_lattice_convert_sync_batchnorm_converts_plain_torch_batch_norms_too():
    model = torch.nn.Sequential(lnn.BatchNorm(2), torch.nn.BatchNorm1d(2).eval())
    converted = lnn.convert_sync_batchnorm(model)
    assert isinstance(converted[0], lnn.SyncBatchNorm) and type(converted[1]) is torch.nn.SyncBatchNorm
    assert not converted[1].training


def test_sync_batchnorm_module_constructed_directly_runs_on_cpu(rng):
    x = _x(rng)
    sbn = lnn.SyncBatchNorm(4).double()
    ref = torch.nn.BatchNorm1d(4).double()
    torch.testing.assert_close(sbn(x).feats, ref(x.feats))
    sbn.eval()
    ref.eval()
    torch.testing.assert_close(sbn(x).feats, ref(x.feats))


# ---- validation: one test per branch -----------------------------------------------------------


@pytest.mark.parametrize("name", ["linear", "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus",
                                  "batch_norm", "layer_norm", "rms_norm", "dropout"])
def test_feature_op_rejects_a_non_sparse_input(name):
    args = {"linear": (torch.ones(1, 1),), "batch_norm": (None, None)}.get(name, ())
    with pytest.raises(TypeError, match=rf"^\[{name}\] input: expected a lattice.SparseTensor, got Tensor$"):
        getattr(ops, name)(torch.ones(2, 1), *args)


@pytest.mark.parametrize("module", [lnn.ReLU(), lnn.LeakyReLU(), lnn.GELU(), lnn.SiLU(), lnn.Sigmoid(), lnn.Tanh(),
                                    lnn.Softplus(), lnn.Dropout(), lnn.BatchNorm(1), lnn.SyncBatchNorm(1), lnn.LayerNorm(1),
                                    lnn.RMSNorm(1), lnn.Linear(1, 1)], ids=lambda m: type(m).__name__)
def test_feature_module_rejects_a_non_sparse_input(module):
    with pytest.raises(TypeError, match=rf"^\[{type(module).__name__}\] input: expected a lattice.SparseTensor, got Tensor$"):
        module(torch.ones(2, 1))


def test_linear_rejects_a_weight_of_the_wrong_shape(rng):
    with pytest.raises(ValueError, match=r"^\[linear\] weight: expected shape \(C_out, C_in=4\), got \(3, 5\)$"):
        ops.linear(_x(rng), torch.ones(3, 5, dtype=torch.float64))


def test_linear_rejects_a_weight_that_is_not_a_tensor(rng):
    with pytest.raises(TypeError, match=r"^\[linear\] weight: expected a torch.Tensor of shape \(C_out, C_in=4\), got list$"):
        ops.linear(_x(rng), [[1.0] * 4])


def test_linear_rejects_a_bias_of_the_wrong_shape(rng):
    with pytest.raises(ValueError, match=r"^\[linear\] bias: expected shape \(C=3,\), got \(4,\)$"):
        ops.linear(_x(rng), torch.ones(3, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64))


def test_leaky_relu_rejects_a_non_number_slope(rng):
    with pytest.raises(TypeError, match=r"^\[leaky_relu\] negative_slope: expected a real number, got str$"):
        ops.leaky_relu(_x(rng), "0.1")


def test_gelu_rejects_an_unknown_approximation(rng):
    with pytest.raises(ValueError, match=r"^\[gelu\] approximate: expected 'none' or 'tanh', got 'fast'$"):
        ops.gelu(_x(rng), "fast")


def test_softplus_rejects_a_non_positive_beta(rng):
    with pytest.raises(ValueError, match=r"^\[softplus\] beta: expected a positive value, got 0$"):
        ops.softplus(_x(rng), beta=0)


def test_softplus_rejects_a_nan_threshold(rng):
    with pytest.raises(ValueError, match=r"^\[softplus\] threshold: expected a real number, got nan$"):
        ops.softplus(_x(rng), threshold=float("nan"))


def test_batch_norm_rejects_statistics_of_the_wrong_shape(rng):
    with pytest.raises(ValueError, match=r"^\[batch_norm\] running_mean: expected shape \(C=4,\), got \(3,\)$"):
        ops.batch_norm(_x(rng), torch.zeros(3), torch.ones(4))


def test_batch_norm_rejects_statistics_that_are_not_tensors(rng):
    with pytest.raises(TypeError, match=r"^\[batch_norm\] weight: expected a torch.Tensor of shape \(C=4,\) or None, got list$"):
        ops.batch_norm(_x(rng), None, None, [1.0] * 4, training=True)


def test_batch_norm_in_eval_needs_running_statistics(rng):
    with pytest.raises(ValueError, match=r"^\[batch_norm\] running_var: expected running statistics when training=False, got None$"):
        ops.batch_norm(_x(rng), torch.zeros(4, dtype=torch.float64), None)


def test_batch_norm_rejects_a_momentum_outside_0_1(rng):
    with pytest.raises(ValueError, match=r"^\[batch_norm\] momentum: expected a value in \[0, 1\], got 1.5$"):
        ops.batch_norm(_x(rng), None, None, training=True, momentum=1.5)


def test_batch_norm_rejects_a_non_positive_eps(rng):
    with pytest.raises(ValueError, match=r"^\[batch_norm\] eps: expected a positive value, got 0.0$"):
        ops.batch_norm(_x(rng), None, None, training=True, eps=0.0)


def test_layer_norm_rejects_a_weight_of_the_wrong_shape(rng):
    with pytest.raises(ValueError, match=r"^\[layer_norm\] weight: expected shape \(C=4,\), got \(2,\)$"):
        ops.layer_norm(_x(rng), torch.ones(2, dtype=torch.float64))


def test_layer_norm_rejects_a_bias_of_the_wrong_shape(rng):
    with pytest.raises(ValueError, match=r"^\[layer_norm\] bias: expected shape \(C=4,\), got \(5,\)$"):
        ops.layer_norm(_x(rng), None, torch.ones(5, dtype=torch.float64))


def test_layer_norm_rejects_a_non_positive_eps(rng):
    with pytest.raises(ValueError, match=r"^\[layer_norm\] eps: expected a positive value, got -1$"):
        ops.layer_norm(_x(rng), eps=-1)


def test_rms_norm_rejects_a_weight_of_the_wrong_shape(rng):
    with pytest.raises(ValueError, match=r"^\[rms_norm\] weight: expected shape \(C=4,\), got \(1,\)$"):
        ops.rms_norm(_x(rng), torch.ones(1, dtype=torch.float64))


def test_rms_norm_rejects_a_negative_eps(rng):
    with pytest.raises(ValueError, match=r"^\[rms_norm\] eps: expected a value >= 0, got -0.1$"):
        ops.rms_norm(_x(rng), eps=-0.1)


def test_dropout_rejects_a_probability_outside_0_1(rng):
    with pytest.raises(ValueError, match=r"^\[dropout\] p: expected a probability in \[0, 1\], got 1.5$"):
        ops.dropout(_x(rng), 1.5)
    with pytest.raises(TypeError, match=r"^\[dropout\] p: expected a real number, got bool$"):
        ops.dropout(_x(rng), True)


def test_explain_feature_ops_names_torchs_dense_kernel_without_a_route(rng):
    x = _x(rng)
    for op in ("relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "linear", "batch_norm",
               "layer_norm", "rms_norm", "dropout"):
        e = lattice.explain(op, x)
        assert e.chosen is None and e.op == op
        assert str(e) == (f"{op}: no lattice route; runs torch's dense kernel on the (N, C) feature matrix, "
                          f"rows and coordinate identity unchanged")
        assert repr(e) == str(e)
