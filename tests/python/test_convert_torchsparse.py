"""lattice.convert.from_torchsparse against TorchSparse 2.1's own outputs.

The fixtures ``tests/fixtures/torchsparse_<net>.npz`` are written by
``scripts/make_torchsparse_fixtures.py`` on a machine with CUDA and TorchSparse 2.1 (source in
``../shared/anchors``; TorchSparse 2.1 has no CPU convolution): the network ``TSNet`` of that
script (a submanifold k3 stem, a k2 s2 strided conv, a non-cubic (3, 1, 5) submanifold conv, a
k2 s2 transposed conv onto the stem's rows, ``torchsparse.cat`` and a 1x1 head with bias, and a
k3 s2 p1 strided conv: the spconv window), BatchNorm + ReLU after each conv, random weights from a
fixed seed, BatchNorm in eval with running statistics measured on the input, float32 convolutions
(TF32 / FP16 off, GatherScatter dataflow), two crops of lattice's synthetic street scan quantized
by TorchSparse's ``sparse_quantize``. TorchSparse itself is not imported here.

What the test proves: converting TorchSparse's state_dict with ``lattice.convert.from_torchsparse``
into :class:`LatticeNet` (lattice.nn / lattice.models layers registered in TSNet's order) and
running lattice on the same input reproduces both TorchSparse outputs at every voxel (rows matched
by coordinates, which must be the same set, at the same stride): TorchSparse's kernel-row order
(x fastest for odd kernel volumes, z fastest for even ones) including a non-cubic kernel, its
(K, C_in, C_out) and (C_in, C_out) layouts, the transposed conv's kernel, the head's bias, the
flat BatchNorm keys, the floor of coordinates under k2 s2 striding, the transposed conv landing on
the skip's rows, the cat order, and the k3 s2 p1 window with TorchSparse's output grid (computed
from the input's largest coordinate, as ``spdownsample`` does without a ``spatial_range``). The
negative control converts with lattice's own row order for every kernel and must miss by far
more than the tolerance (the comparison discriminates).

Tolerance: both sides evaluate the same float32 network with different summation orders through
~6 layers: ``TOL = 2e-5`` of the largest |output|.

Gate (marker ``torchsparse_fixtures``): while the fixture files are missing these tests are
deselected, and the run's summary says so and names the script (tests/python/conftest.py);
``pytest -m torchsparse_fixtures`` runs them anyway and they fail with that message. Once the
fixtures are committed they run in ``make test``.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import lattice
from lattice import convert
from lattice import nn as lnn
from lattice.models import ConvBlock, WindowConv3d

pytestmark = pytest.mark.torchsparse_fixtures

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NETS = ["tsnet"]  # scripts/make_torchsparse_fixtures.py NETS
SCRIPT = "scripts/make_torchsparse_fixtures.py"
TOL = 2e-5


def fixture_paths() -> list[Path]:
    return [FIXTURES / f"torchsparse_{n}.npz" for n in NETS]


def load(name: str):
    path = FIXTURES / f"torchsparse_{name}.npz"
    if not path.exists():
        pytest.fail(f"{path} is missing: make it on a machine with CUDA and TorchSparse 2.1 with "
                    f"`PYTHONPATH=python python3 {SCRIPT}` (see its docstring) and commit it")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        sd = OrderedDict((str(k), torch.from_numpy(z[f"sd/{k}"].copy())) for k in z["sd_keys"])
        arrays = {k: torch.from_numpy(z[k].copy()) for k in z.files if not k.startswith("sd") and k != "meta"}
    return meta, sd, arrays


class LatticeNet(torch.nn.Module):
    """TSNet (scripts/make_torchsparse_fixtures.py) from lattice layers, in TSNet's module order."""

    def __init__(self, in_channels: int, num_classes: int, channels) -> None:
        super().__init__()
        c0, c1, c2 = channels
        self.stem = ConvBlock(lnn.SubmConv3d(in_channels, c0, 3))
        self.down = ConvBlock(lnn.Conv3d(c0, c1, 2, stride=2))
        self.mid = ConvBlock(lnn.SubmConv3d(c1, c1, (3, 1, 5)))
        self.up = ConvBlock(lnn.ConvTranspose3d(c1, c0, 2, stride=2))
        self.head = lnn.SubmConv3d(2 * c0, num_classes, 1, bias=True)
        self.win = ConvBlock(WindowConv3d(c1, c2, 3, stride=2, padding=1))

    def forward(self, x: lattice.SparseTensor):
        x1 = self.stem(x)
        x2 = self.mid(self.down(x1))
        u = self.up(x2, x1)  # TorchSparse's transposed conv lands on the stem's rows
        y = self.head(lattice.ops.cat([u, x1]))
        # TorchSparse (no spatial_range): output grid from the input's largest coordinate per axis
        shape = tuple(int(v) + 1 for v in x2.coords[:, 1:].max(0).values)
        w = self.win.relu(self.win.bn(self.win.conv(x2, shape)))
        return y, w


def _sorted(coords: torch.Tensor, feats: torch.Tensor):
    key = coords.long()
    order = np.lexsort(key.numpy().T[::-1])  # by batch, then x, y, z
    return key[order], feats[order]


def _run(meta, sd, arrays, weights) -> list[tuple[torch.Tensor, torch.Tensor, tuple]]:
    model = LatticeNet(meta["in_channels"], meta["num_classes"], meta["channels"])
    model.load_state_dict(weights)
    model.eval()
    x = lattice.SparseTensor(arrays["input_coords"], arrays["input_feats"])
    with torch.no_grad():
        outs = model(x)
    return [(o.coords, o.feats, o.stride) for o in outs]


@pytest.mark.parametrize("name", NETS)
def test_from_torchsparse_reproduces_torchsparse(name: str) -> None:
    meta, sd, arrays = load(name)
    model = LatticeNet(meta["in_channels"], meta["num_classes"], meta["channels"])
    weights = convert.from_torchsparse(sd, model)
    outs = _run(meta, sd, arrays, weights)
    assert len(outs) == meta["outputs"] == 2
    for i, (coords, feats, stride) in enumerate(outs):
        assert tuple(stride) == tuple(int(v) for v in arrays[f"out{i}_stride"]), i
        lc, lf = _sorted(coords, feats)
        tc, tf = _sorted(arrays[f"out{i}_coords"], arrays[f"out{i}_feats"])
        assert torch.equal(lc, tc), f"output {i}: lattice's rows differ from TorchSparse's ({len(lc)} vs {len(tc)})"
        scale = float(tf.abs().max())
        err = float((lf - tf).abs().max()) / scale
        assert scale > 0 and err <= TOL, (i, err)


@pytest.mark.parametrize("name", NETS)
def test_wrong_kernel_order_misses_torchsparse(name: str) -> None:
    """Negative control: the same weights with lattice's own row order (z fastest) for every
    kernel, i.e. a naive copy of TorchSparse's (K, C_in, C_out) rows, miss TorchSparse's outputs."""
    meta, sd, arrays = load(name)
    model = LatticeNet(meta["in_channels"], meta["num_classes"], meta["channels"])
    naive = convert._convert(sd, model, "torchsparse",
                             lambda t, k: convert.weight_from_kernel_major(t["kernel"], k, "lattice"))
    coords, feats, _ = _run(meta, sd, arrays, naive)[0]
    lc, lf = _sorted(coords, feats)
    tc, tf = _sorted(arrays["out0_coords"], arrays["out0_feats"])
    assert torch.equal(lc, tc)
    assert float((lf - tf).abs().max()) / float(tf.abs().max()) > 100 * TOL
