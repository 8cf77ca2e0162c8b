"""Issue 4 "Done when": a model mixing submanifold convolution, max pooling, a transposed
convolution onto the skip support, sparse_add of a residual and global average pooling trains for
a few steps with decreasing loss (CPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from lattice import nn as lnn
from lattice import ops
from conftest import random_coords

_MISSING = [name for name in ("max_pool3d", "global_avg_pool") if not hasattr(ops, name)]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"lattice.ops.{', '.join(_MISSING)} not available yet (pooling is a separate change)"
)


class Net(torch.nn.Module):
    """stem (subm) -> skip; max pool k2 s2 -> subm + residual (sparse_add, same key: no alignment)
    -> transposed conv onto the skip support -> sparse_add with the skip; a side branch through a
    generated transposed conv (a new coordinate set) joined onto the skip rows with
    sparse_add(join="left") (a real alignment) -> GELU -> Linear -> global average pool -> classes."""

    def __init__(self, c_in: int = 3, c: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.stem = lnn.SubmConv3d(c_in, c, 3)
        self.bn0 = lnn.BatchNorm(c)
        self.act = lnn.ReLU()
        self.pool = lnn.MaxPool3d(2, 2) if hasattr(lnn, "MaxPool3d") else None
        self.mid = lnn.SubmConv3d(c, c, 3)
        self.bn1 = lnn.BatchNorm(c)
        self.up = lnn.ConvTranspose3d(c, c, kernel_size=2, stride=2)
        self.side = lnn.ConvTranspose3d(c, c, kernel_size=2, stride=2, bias=True)
        self.gelu = lnn.GELU()
        self.proj = lnn.Linear(c, c)
        self.classifier = torch.nn.Linear(c, classes)

    def forward(self, x: lattice.SparseTensor) -> torch.Tensor:
        skip = self.act(self.bn0(self.stem(x)))
        p = self.pool(skip) if self.pool is not None else ops.max_pool3d(skip, 2, 2)
        assert p.stride == (2, 2, 2) and p.key != skip.key
        m = self.act(self.bn1(self.mid(p)))
        r = ops.sparse_add(m, p)  # residual; same key: identity fast path
        assert r.key == p.key
        u = self.up(r, coordinates=skip)  # onto the skip support
        assert u.key == skip.key
        fused = ops.sparse_add(u, skip)
        g = self.side(r)  # generated support: a different coordinate set
        assert g.key != skip.key
        y = ops.sparse_add(fused, g, join="left")  # aligned by value onto the skip rows
        assert y.key == skip.key
        y = self.proj(self.gelu(y))
        return self.classifier(ops.global_avg_pool(y))


def _batch(rng, samples=4, c_in=3):
    data = []
    for _ in range(samples):
        coords = random_coords(rng, 60, batches=1, extent=6, spread=4)
        data.append((coords[:, 1:], rng.standard_normal((len(coords), c_in)).astype(np.float32)))
    return ops.sparse_collate(data)


def test_model_with_pooling_transposed_conv_residual_sparse_add_and_global_pool_trains(rng):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Net()
    x = _batch(rng)
    assert x.batch_counts is not None and len(x.batch_counts) == 4
    labels = torch.tensor([0, 1, 2, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(12):
        opt.zero_grad()
        logits = model(x)
        assert tuple(logits.shape) == (4, 3)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        if step == 0:
            for name, param in model.named_parameters():
                assert param.grad is not None, f"{name} got no gradient"
                assert torch.isfinite(param.grad).all(), name
                assert param.grad.abs().sum() > 0, f"{name} got an all-zero gradient"
        opt.step()
        losses.append(float(loss))
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 8, losses


def test_model_converted_to_sync_batchnorm_runs_in_eval_on_cpu(rng):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = Net()
    x = _batch(rng)
    model.train()
    model(x)
    model.eval()
    expected = model(x)
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).eval()
    torch.testing.assert_close(converted(x), expected)
