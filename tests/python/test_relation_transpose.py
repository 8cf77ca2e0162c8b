"""A transposed conv onto a U-Net skip reuses the downsampling relation (issue 12, "maps built once").

``conv3d(fine, stride=s)`` caches the relation fine -> coarse on ``fine``; a later
``conv_transpose3d(coarse, coordinates=fine)`` with the same kernel, stride, padding and dilation
reads exactly its transpose when no kernel axis is centered differently from indexed (every size
even or 1, SEMANTICS.md "Kernel geometry"). lattice then transposes the cached edge list instead of
hashing again. What these tests prove, on CPU and CUDA:

* the reuse happens exactly when it is valid (``transposed_relation_count``), and not for odd
  kernels, other strides / paddings / dilations, or a target that is not where the coarse set came
  from;
* the transposed relation is bitwise equal, array by array, to the one hashing builds on fresh
  coordinate sets (which test_relations checks against the float64 oracle), and equals the oracle's
  transposed relation as an edge set;
* the convolution and its gradients are bitwise the same either way.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from conftest import make_plan, oracle_relation_for, random_coords, relation_arrays
from lattice import ops
from lattice.tensor import SparseTensor

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]

# (kernel_size, stride, padding, dilation, expand, reused)
SPECS = [
    (2, 2, 0, 1, False, True),
    ((2, 1, 2), (2, 1, 2), 0, 1, False, True),
    (4, 2, 1, 1, False, True),
    (2, 2, 0, 2, False, True),
    (2, 3, 0, 1, True, True),
    (3, 2, 0, 1, False, False),  # odd kernel: forward offsets are centered, transposed indexed
    ((2, 3, 2), 2, 0, 1, False, False),
]


def _fine(device: str, seed: int = 5, n: int = 400) -> SparseTensor:
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, n, batches=2, extent=8, spread=10))
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], 3)).astype(np.float32))
    return SparseTensor(coords.to(device), feats.to(device))


def _weights(k, c_in: int, c_out: int, seed: int, device: str) -> torch.Tensor:
    ks = (k, k, k) if isinstance(k, int) else tuple(k)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(c_out, *ks, c_in, generator=g).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k, s, p, d, expand, reused", SPECS)
def test_transposed_relation_equals_a_hashed_one(device, k, s, p, d, expand, reused) -> None:
    fine = _fine(device)
    w_down = _weights(k, 3, 4, 1, device)
    w_up = _weights(k, 4, 3, 2, device)
    coarse = ops.conv3d(fine, w_down, stride=s, padding=p, dilation=d, expand=expand)
    plan = make_plan("conv_transpose3d", coarse, w_up, stride=s, padding=p, dilation=d, coordinates=fine)
    assert coarse._cs.transposed_relation_count == (1 if reused else 0)
    got = relation_arrays(plan)

    # the same relation hashed: fresh coordinate sets, nothing cached between them
    fine2 = SparseTensor(fine.coords.clone(), fine.feats.clone(), fine.stride)
    coarse2 = SparseTensor(coarse.coords.clone(), coarse.feats.detach().clone(), coarse.stride)
    plan2 = make_plan("conv_transpose3d", coarse2, w_up, stride=s, padding=p, dilation=d, coordinates=fine2)
    assert coarse2._cs.transposed_relation_count == 0
    want = relation_arrays(plan2)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)

    # and the oracle's transposed relation, as an edge set
    o = oracle_relation_for("conv_transpose3d", coarse.coords.cpu().numpy(), k, s, p, d,
                            target=fine.coords.cpu().numpy())
    edges = set(zip(got["in_idx"].tolist(), got["out_idx"].tolist(), got["k_idx"].tolist()))
    assert edges == set(zip(*(np.asarray(a).tolist() for a in (o.in_idx, o.out_idx, o.k_idx))))

    # the convolution and its gradients: bitwise the same either way
    def run(c: SparseTensor, f: SparseTensor):
        feats = c.feats.detach().clone().requires_grad_(True)
        w = w_up.clone().requires_grad_(True)
        y = ops.conv_transpose3d(c.replace_feats(feats), w, stride=s, padding=p, dilation=d, coordinates=f)
        y.feats.square().sum().backward()
        return y.feats.detach(), feats.grad, w.grad

    for a, b in zip(run(coarse, fine), run(coarse2, fine2)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_target_relation_is_transposed_too(device) -> None:
    fine = _fine(device)
    coarse = ops.conv3d(fine, _weights(2, 3, 4, 1, device), stride=2)
    # a second fine-to-coarse relation, onto the coarse set as an explicit target
    fine_b = SparseTensor(fine.coords.clone(), fine.feats.clone())
    ops.conv3d(fine_b, _weights(2, 3, 4, 1, device), stride=2, coordinates=coarse)
    ops.conv_transpose3d(coarse, _weights(2, 4, 3, 2, device), stride=2, coordinates=fine_b)
    assert coarse._cs.transposed_relation_count == 1


@pytest.mark.parametrize("device", DEVICES)
def test_explain_says_when_the_relation_is_a_reused_transpose(device) -> None:
    """explain() of the transposed conv names the reuse (issue 11: every decision visible) when the
    relation is the transpose of the cached one, and does not for a relation it had to hash."""
    fine = _fine(device)
    coarse = ops.conv3d(fine, _weights(2, 3, 4, 1, device), stride=2)
    up = _weights(2, 4, 3, 2, device)
    ops.conv_transpose3d(coarse, up, stride=2, coordinates=fine)
    assert coarse._cs.transposed_relation_count == 1
    text = str(lattice.explain("conv_transpose3d", coarse, up, stride=2, coordinates=fine))
    assert "reused: the transpose of the cached relation" in text, text
    other = SparseTensor(fine.coords.clone(), fine.feats.clone())  # same rows, another set: hashed
    text = str(lattice.explain("conv_transpose3d", coarse, up, stride=2, coordinates=other))
    assert "reused" not in text, text


@pytest.mark.parametrize("device", DEVICES)
def test_no_reuse_onto_an_unrelated_target_or_another_spec(device) -> None:
    fine = _fine(device)
    coarse = ops.conv3d(fine, _weights(2, 3, 4, 1, device), stride=2)
    other = SparseTensor(fine.coords.clone(), fine.feats.clone())  # same rows, another identity
    ops.conv_transpose3d(coarse, _weights(2, 4, 3, 2, device), stride=2, coordinates=other)
    assert coarse._cs.transposed_relation_count == 0
    # kernel 4, padding 1 onto fine: the cached relation has kernel 2, padding 0
    ops.conv_transpose3d(coarse, _weights(4, 4, 3, 2, device), stride=2, padding=1, coordinates=fine)
    assert coarse._cs.transposed_relation_count == 0
    # the matching spec: reused, and a second call is a plain cache hit
    ops.conv_transpose3d(coarse, _weights(2, 4, 3, 2, device), stride=2, coordinates=fine)
    ops.conv_transpose3d(coarse, _weights(2, 4, 3, 3, device), stride=2, coordinates=fine)
    assert coarse._cs.transposed_relation_count == 1
    assert coarse._cs.cached_relation_count == 3


def test_minkunet_decoder_reuses_every_downsampling_relation(monkeypatch) -> None:
    """MinkUNet18's four transposed convs (k2 s2 onto the skips) all transpose a cached relation."""
    torch.manual_seed(0)
    model = lattice.models.MinkUNet18(in_channels=3, num_classes=4, cr=0.25).eval()
    x = _fine("cpu", n=1500)
    seen = []
    orig = ops.conv_transpose3d

    def spy(inp, *args, **kw):
        out = orig(inp, *args, **kw)
        seen.append(inp._cs.transposed_relation_count)
        return out

    monkeypatch.setattr(lattice.ops, "conv_transpose3d", spy)  # lattice.nn calls it through lattice.ops
    with torch.no_grad():
        model(x)
    assert seen == [1, 1, 1, 1], seen


@pytest.mark.parametrize("device", DEVICES)
def test_generated_supports_count_their_batches_when_asked(device) -> None:
    """A generated support's batch counts are counted on first request (not while building the
    relation): they still equal the rows per batch of its coordinates, for every generating kind."""
    rng = np.random.default_rng(11)
    coords = torch.from_numpy(random_coords(rng, 500, batches=3, extent=8, spread=10))
    coords = coords[torch.argsort(coords[:, 0], stable=True)]
    counts = torch.bincount(coords[:, 0].long(), minlength=3).tolist()
    x = SparseTensor(coords.to(device), torch.ones(coords.shape[0], 2, device=device), 2, counts)
    outs = [
        ops.conv3d(x, torch.ones(3, 2, 2, 2, 2, device=device), stride=2),
        ops.conv3d(x, torch.ones(3, 3, 3, 3, 2, device=device), stride=2, expand=True),
        ops.conv_transpose3d(x, torch.ones(3, 2, 2, 2, 2, device=device), stride=2),
        ops.generative_conv_transpose3d(x, torch.ones(3, 2, 2, 2, 2, device=device), stride=2),
    ]
    for y in outs:
        want = torch.bincount(y.coords[:, 0].long().cpu(), minlength=3).tolist()
        assert y.batch_counts == want
        assert len({tuple(r) for r in y.coords.cpu().tolist()}) == len(y)  # unique rows (no check ran)
