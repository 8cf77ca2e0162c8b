"""lattice.models: shapes, geometry, gradients, determinism and a loss that goes down.

The networks are run at a small width (cr / width_multiplier) on a few hundred voxels so that the
whole file stays within a few seconds on a 2-core CPU. The geometric pieces that are not plain
lattice ops (WindowConv3d's spconv window, the BEV scatter) are compared with independent dense
torch computations (torch.nn.functional.conv3d on a zero-filled grid, lattice.ops.dense).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from lattice import models


def _scan(n: int = 400, extent: int = 24, batches: int = 2, seed: int = 0) -> lattice.SparseTensor:
    """Unique random voxels in [0, extent)^3 over ``batches`` samples, 4 features."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(batches):
        c = torch.unique(torch.randint(0, extent, (n, 3), generator=g), dim=0)
        rows.append(torch.cat([torch.full((len(c), 1), b), c], 1))
    coords = torch.cat(rows).int()
    return lattice.SparseTensor(coords, torch.randn(coords.shape[0], 4, generator=g))


UNETS = [(models.MinkUNet18, 9), (models.MinkUNet34, 13), (models.MinkUNet42, 10)]


@pytest.mark.parametrize("cls,stage_layers", UNETS, ids=[c.__name__ for c, _ in UNETS])
def test_minkunet_shapes_levels_and_layer_counts(cls, stage_layers):
    """Logits on the input rows (same identity, order), num_classes columns; the nine levels have
    strides 1, 2, 4, 8, 16, 8, 4, 2, 1 and channels int(cr * c); the residual block counts per stage
    are the documented ones (MinkUNet34's encoder 2, 3, 4, 6)."""
    torch.manual_seed(0)
    x = _scan()
    m = cls(in_channels=4, num_classes=7, cr=0.25)
    y, levels = m(x, return_features=True)
    assert y.key == x.key and y.feats.shape == (len(x), 7) and torch.equal(y.coords, x.coords)
    assert [lv.stride[0] for lv in levels] == [1, 2, 4, 8, 16, 8, 4, 2, 1]
    assert [lv.feats.shape[1] for lv in levels] == [int(0.25 * c) for c in models.minkunet.CHANNELS]
    assert levels[-1].key == x.key
    blocks = [sum(isinstance(b, models.ResidualBlock) for b in s) for s in m.encoders]
    blocks += [len(d["fuse"]) for d in m.decoders]
    assert tuple(blocks) == m.blocks
    expected = {models.MinkUNet18: (2,) * 8, models.MinkUNet34: (2, 3, 4, 6, 2, 2, 2, 2),
                models.MinkUNet42: (2,) * 8}[cls]
    assert m.blocks == expected
    assert [blk.conv.kernel_size[0] for blk in m.stem] == ([3, 3] if cls is models.MinkUNet42 else [5])


def test_minkunet_rejects_wrong_input():
    m = models.MinkUNet42(cr=0.125)
    x = _scan(50)
    with pytest.raises(ValueError, match=r"\[MinkUNet42\] input: expected 4 feature channels, got 3"):
        m(x.replace_feats(x.feats[:, :3]))
    with pytest.raises(TypeError, match=r"\[MinkUNet42\] input: expected a lattice.SparseTensor"):
        m(x.feats)


def _all_grads(model, x, labels):
    model.zero_grad(set_to_none=True)
    out = model(x)
    out = out[0] if isinstance(out, list) else out
    feats = out["bev"] if isinstance(out, dict) else out.feats
    if isinstance(out, dict):
        loss = (feats ** 2).mean()
    elif isinstance(model, models.SparseResNet):
        loss = sum((o.feats ** 2).mean() for o in model(x))
    else:
        loss = torch.nn.functional.cross_entropy(feats, labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _nets():
    return {
        "MinkUNet18": lambda: models.MinkUNet18(num_classes=5, cr=0.25),
        "MinkUNet34": lambda: models.MinkUNet34(num_classes=5, cr=0.25),
        "MinkUNet42": lambda: models.MinkUNet42(num_classes=5, cr=0.25),
        "SparseResNet21D": lambda: models.SparseResNet21D(width_multiplier=0.25),
        "VoxelBackBone8x": lambda: _Bev(),
    }


class _Bev(torch.nn.Module):
    """VoxelBackBone8x on the test grid (24, 24, 41) (z: 41 -> 21 -> 11 -> 5 -> 2, as KITTI)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = models.VoxelBackBone8x(4)

    def forward(self, x):
        return self.net(x, (24, 24, 41))


@pytest.mark.parametrize("name", list(_nets()))
def test_every_parameter_gets_a_gradient(name):
    """find_unused_parameters-style check: one backward reaches every parameter with a finite,
    non-zero gradient (a layer left out of forward, or a detached path, fails here)."""
    torch.manual_seed(0)
    model = _nets()[name]()
    x = _scan(300)
    labels = torch.randint(0, 5, (len(x),), generator=torch.Generator().manual_seed(3))
    _, grads = _all_grads(model, x, labels)
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"{name}: parameters without a gradient: {missing[:5]}"
    bad = [n for n, g in grads.items() if not torch.isfinite(g).all() or not g.abs().sum() > 0]
    assert not bad, f"{name}: zero or non-finite gradients: {bad[:5]}"


@pytest.mark.parametrize("name", ["MinkUNet42", "SparseResNet21D", "VoxelBackBone8x"])
def test_forward_backward_is_bitwise_deterministic(name):
    """Two models built from the same seed on two separately built inputs give bitwise equal
    outputs and parameter gradients (no order-dependent accumulation anywhere)."""
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _nets()[name]()
        x = _scan(300)
        labels = torch.randint(0, 5, (len(x),), generator=torch.Generator().manual_seed(3))
        loss, grads = _all_grads(model, x, labels)
        runs.append((loss, grads))
    (l0, g0), (l1, g1) = runs
    assert torch.equal(l0, l1)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n


def test_minkunet18_training_loss_goes_down():
    """A few SGD steps on a tiny labelled input lower the cross entropy (labels depend on the
    position, so the network can fit them)."""
    torch.manual_seed(0)
    x = _scan(300, extent=32, batches=1)
    labels = (x.coords[:, 1] >= 16).long() + 2 * (x.coords[:, 3] >= 16).long()
    model = models.MinkUNet18(num_classes=4, cr=0.25)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).feats, labels)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses


def test_sparse_resnet21d_strides_and_channels():
    x = _scan(300)
    outs = models.SparseResNet21D(width_multiplier=0.5)(x)
    assert [o.stride for o in outs] == [(1, 1, 1), (2, 2, 2), (4, 4, 4), (8, 8, 8), (8, 16, 8)]
    assert [o.feats.shape[1] for o in outs] == [8, 16, 32, 64, 64]
    assert outs[0].key == x.key


# ---- WindowConv3d: the spconv / TorchSparse window, against a dense conv3d ----------------------


def _dense(x: lattice.SparseTensor, shape) -> torch.Tensor:
    return lattice.ops.dense(x, shape)


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (3, 2, 0), ((3, 3, 3), 2, (1, 1, 0)), ((1, 1, 3), (1, 1, 2), 0),
                                   (2, 2, 0), ((1, 3, 1), (1, 2, 1), 0)])
def test_window_conv_matches_dense_conv3d_with_padding(k, s, p):
    """out[o] = sum_k in[s*o - p + k] @ W[k] for every o whose window holds an input, and exactly
    those o inside spconv's output grid (size + 2p - K) // s + 1: the dense reference is
    torch.nn.functional.conv3d (cross-correlation) on the zero-filled grid with the same padding."""
    torch.manual_seed(1)
    shape = (9, 8, 7)
    g = torch.Generator().manual_seed(5)
    c = torch.unique(torch.stack([torch.randint(0, n, (60,), generator=g) for n in shape], 1), dim=0)
    coords = torch.cat([torch.zeros(len(c), 1, dtype=torch.long), c], 1).int()
    x = lattice.SparseTensor(coords, torch.randn(len(c), 3, generator=g, dtype=torch.float64))
    conv = models.WindowConv3d(3, 2, k, stride=s, padding=p).double()
    y = conv(x, shape)
    w = conv.weight.permute(0, 4, 1, 2, 3)  # (C_out, Kx, Ky, Kz, C_in) -> torch (C_out, C_in, Kx, Ky, Kz)
    ref = torch.nn.functional.conv3d(_dense(x, shape), w, stride=conv.stride, padding=conv.window_padding)[0]
    hits = torch.nn.functional.conv3d(_dense(x.replace_feats(torch.ones(len(x), 1, dtype=torch.float64)), shape),
                                      torch.ones(1, 1, *conv.kernel_size, dtype=torch.float64),
                                      stride=conv.stride, padding=conv.window_padding)[0, 0]
    assert tuple(ref.shape[1:]) == conv.output_shape(shape)
    expect = {tuple(v) for v in (hits > 0).nonzero().tolist()}
    got = {tuple(v) for v in y.coords[:, 1:].tolist()}
    assert got == expect
    o = y.coords[:, 1:].long()
    torch.testing.assert_close(y.feats, ref[:, o[:, 0], o[:, 1], o[:, 2]].T, rtol=1e-12, atol=1e-12)


def test_bev_scatter_matches_dense_and_has_no_element_limit():
    """bev[b, c*Z + z, y, x] == dense[b, c, x, y, z]; the scatter works on a detection BEV at
    batch 4 (above 2^26 elements, lattice.ops.dense's former limit)."""
    x = _scan(200, extent=10)
    d = lattice.ops.dense(x, (10, 10, 10))
    bev = models.bev_scatter(x, (10, 10, 10))
    ref = d.permute(0, 1, 4, 3, 2).reshape(2, 4 * 10, 10, 10)
    assert torch.equal(bev, ref)
    big = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0], [3, 1400, 1599, 1]], dtype=torch.int32),
                               torch.ones(2, 16))
    out = models.bev_scatter(big, (1408, 1600, 2), batch_size=4)  # 4*16*2*1600*1408 > 2^26
    assert out.shape == (4, 32, 1600, 1408) and float(out.sum()) == 32.0 and float(out[3, 1, 1599, 1400]) == 1.0
    with pytest.raises(ValueError, match=r"\[bev_scatter\] coords: expected x, y, z within"):
        models.bev_scatter(big, (100, 100, 2))


def test_voxel_backbone8x_kitti_grid_shapes():
    """On the KITTI grid (1408, 1600, 41) the conv_out grid is (176, 200, 2) and the BEV has
    128 * 2 = 256 channels, as OpenPCDet's HeightCompression (spatial_features (B, 256, 200, 176))."""
    g = torch.Generator().manual_seed(2)
    n = 300
    c = torch.stack([torch.randint(0, 1408, (n,), generator=g), torch.randint(0, 1600, (n,), generator=g),
                     torch.randint(0, 41, (n,), generator=g)], 1)
    c = torch.unique(c, dim=0)
    x = lattice.SparseTensor(torch.cat([torch.zeros(len(c), 1, dtype=torch.long), c], 1).int(), torch.randn(len(c), 4))
    torch.manual_seed(0)
    out = models.VoxelBackBone8x(4).eval()(x, (1408, 1600, 41))
    assert out["shape"] == (176, 200, 2)
    assert out["bev"].shape == (1, 256, 200, 176)
    assert out["encoded"].stride == (8, 8, 16)
    assert [f.stride for f in out["features"]] == [(1, 1, 1), (2, 2, 2), (4, 4, 4), (8, 8, 8)]
