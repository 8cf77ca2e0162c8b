"""torch.compile on lattice networks (issue 14), where torch has it (torch >= 2.0).

What each test proves:

* ``test_compiled_minkunet_trains_like_eager`` (``aot_eager``: dynamo + AOTAutograd, no code
  generation): ``torch.compile(lattice.models.MinkUNet18)`` in train mode gives the eager
  forward's logits and, after the same loss, the eager gradients of every parameter (lattice's
  ops run as opaque steps between the compiled torch code, see lattice/_compile.py; the compiled
  graphs hold BatchNorm, ReLU, residual adds, cat, the classifier and the loss), and a second
  call reuses the compiled code with the same result;
* ``test_inductor_compiled_network_matches_eager`` (the default backend, inductor, which
  generates C++ / Triton code for the torch parts): a small network with a strided conv, a
  transposed conv onto the skip, a residual add, cat, BatchNorm in eval mode and a Linear head,
  forward within float32 rounding of eager (inductor fuses and reorders the element-wise math);
* ``test_compile_support_is_installed_only_where_torch_compiles``: on a torch with
  ``torch.compile`` the core-calling ops are marked for dynamo (``torch.compiler.disable``) and
  still compute the same values as the unwrapped functions; on torch 1.13 nothing is wrapped (runs
  on every torch, so CI checks the 1.13 side).

The first two are skipped, with that reason, on a torch without ``torch.compile`` (Debian's 1.13
in CI); run them with torch 2.x, e.g. on the GPU machine (torch 2.11).
"""
from __future__ import annotations

import copy

import pytest
import torch

import lattice
from lattice import _compile, models
from lattice import nn as lnn
from lattice.models import ConvBlock, ResidualBlock

needs_compile = pytest.mark.skipif(not hasattr(torch, "compile"),
                                   reason=f"torch {torch.__version__} has no torch.compile (torch >= 2.0)")


def _input(n: int = 2500, extent: int = 20, seed: int = 1) -> lattice.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(2):
        c = torch.unique(torch.randint(0, extent, (n // 2, 3), generator=g), dim=0)
        rows.append(torch.cat([torch.full((len(c), 1), b), c], 1))
    coords = torch.cat(rows).int()
    return lattice.SparseTensor(coords, torch.randn(coords.shape[0], 4, generator=g))


@needs_compile
def test_compiled_minkunet_trains_like_eager(monkeypatch) -> None:
    # the compiled graphs hold torch's batch norm (lattice.nn.features._lattice_batch_norm leaves
    # it to dynamo); eager runs it too, so both sum in the same order (lattice's own batch norm op
    # is compared with torch's in test_batch_norm.py)
    monkeypatch.setattr(lattice.ops.fused_bn, "USE_LATTICE_BATCH_NORM", False)
    x = _input()
    torch.manual_seed(0)
    eager = models.MinkUNet18(4, 5, cr=0.25).train()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    target = torch.randint(0, 5, (len(x),), generator=torch.Generator().manual_seed(2))

    def step(net):
        out = net(x)
        loss = torch.nn.functional.cross_entropy(out.feats, target)
        loss.backward()
        return out.feats.detach(), float(loss)

    ref, ref_loss = step(eager)
    got, got_loss = step(compiled)
    assert got.shape == (len(x), 5)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    assert abs(got_loss - ref_loss) <= 1e-6 * abs(ref_loss)
    n = 0
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
        n += 1
    assert n > 40  # every conv, BatchNorm and the classifier
    again, _ = step(compiled)  # compiled code reused (and BatchNorm statistics moved as in eager)
    assert again.shape == ref.shape and torch.isfinite(again).all()


class _Small(torch.nn.Module):
    """stem -> strided conv -> residual block -> transposed conv onto the stem -> cat -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvBlock(lnn.SubmConv3d(4, 8, 3))
        self.down = ConvBlock(lnn.Conv3d(8, 16, 2, stride=2))
        self.res = ResidualBlock(16, 16)
        self.up = ConvBlock(lnn.ConvTranspose3d(16, 8, 2, stride=2))
        self.head = lnn.Linear(16, 3)

    def forward(self, x: lattice.SparseTensor) -> lattice.SparseTensor:
        a = self.stem(x)
        b = self.res(self.down(a))
        u = self.up(b, a)
        return self.head(lattice.ops.cat([u, a]))


@needs_compile
def test_inductor_compiled_network_matches_eager(monkeypatch) -> None:
    monkeypatch.setattr(lattice.ops.fused_bn, "USE_LATTICE_BATCH_NORM", False)  # as above
    x = _input(1500, 16, seed=3)
    torch.manual_seed(1)
    model = _Small()
    g = torch.Generator().manual_seed(4)
    for m in model.modules():  # BatchNorm statistics away from the identity
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    model.eval()
    with torch.no_grad():
        ref = model(x).feats
        got = torch.compile(model)(x).feats
    assert got.shape == ref.shape == (len(x), 3)
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err <= 1e-5, err


def test_compile_support_is_installed_only_where_torch_compiles() -> None:
    conv = lattice.ops.subm_conv3d
    wrapped = hasattr(conv, "__lattice_compile_disabled__")
    assert wrapped == hasattr(torch, "compile") == _compile.available()
    assert lattice.ops.relu is lattice.ops.features.relu  # element-wise ops are left to dynamo
    assert not hasattr(lattice.ops.relu, "__lattice_compile_disabled__")
    if not wrapped:
        assert _compile.install() == []  # torch 1.13: nothing to do, nothing changed
        return
    assert lnn.SubmConv3d.forward.__lattice_compile_disabled__ is not None
    assert lattice.ops.conv.subm_conv3d is conv  # lattice.nn reaches the same wrapped function
    x = _input(600, 10, seed=5)
    w = torch.randn(6, 3, 3, 3, 4, generator=torch.Generator().manual_seed(6))
    a = conv(x, w, kernel_size=3).feats
    b = conv.__lattice_compile_disabled__(x, w, kernel_size=3).feats
    assert torch.equal(a, b)
