"""lattice.export -> graph.json + weights.safetensors -> lattice-run (C++, no Python) and
lattice.load_exported (Python executor), checked against the model's own eager forward.

What each test proves:

* ``test_runner_matches_python[demo|minkunet42]``: the demo network (SparseUNet) and a small
  MinkUNet42 (cr 0.25), randomised BatchNorm statistics, trained a few steps, in eval mode, exported
  and run by the ``lattice-run`` binary on a KITTI scan crop (the SemanticKITTI scan when
  /work/shared/data/semantickitti is there, else the synthetic street written as a KITTI .bin):
  the runner's voxelization equals the Python recipe's, its per-point logits equal the eager
  forward's within f32 max relative error 1e-5 (max |a - b| / max |b|) with identical argmax,
  its .label file holds those labels, and the Python executor equals the runner bit for bit
  (same ops, same routes: the C++ runtime adds nothing of its own to the numbers).
* ``test_batch_norm_folding``: folding BatchNorm into the convs changes the graph (no BatchNorm
  nodes left) but not the result beyond f32 rounding; unfolded BatchNorm runs as scale_shift.
* ``test_unsupported_*``: what the exporter cannot write fails with ExportError naming the
  function and the module path (not a silent wrong graph).
* ``test_safetensors_layout``: the weights file is the documented layout (u64 LE header length,
  JSON header with dtype/shape/data_offsets, 8-byte aligned buffers) and round-trips.
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import struct
import subprocess

import numpy as np
import pytest
import torch

import lattice
from lattice import nn as lnn
from lattice._demo_data import crop_nearest, synthetic_scan, voxelize_scan
from lattice._demo_model import SparseUNet
from lattice.models import MinkUNet42

lx = importlib.import_module("lattice.export")  # the module (lattice.export itself is the function)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KITTI_SCAN = "/work/shared/data/semantickitti/000000.bin"
VOXEL = 0.1
N_POINTS = 20000


def _runner() -> str:
    """The lattice-run binary: $LATTICE_RUN, else the newest build*/lattice-run of this checkout."""
    env = os.environ.get("LATTICE_RUN")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(ROOT, "build*", "lattice-run")), key=os.path.getmtime)
    if not found:
        pytest.fail("lattice-run not found: build the project (make build) or set LATTICE_RUN")
    return found[-1]


@pytest.fixture(scope="module")
def scan_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A KITTI .bin of the N_POINTS points nearest the sensor (real scan when present)."""
    if os.path.exists(KITTI_SCAN):
        pts = np.fromfile(KITTI_SCAN, dtype=np.float32).reshape(-1, 4)
        r = np.hypot(pts[:, 0], pts[:, 1])
        pts = pts[np.sort(np.argsort(r, kind="stable")[:N_POINTS])]
    else:
        pts = crop_nearest(synthetic_scan(0, azimuth_steps=600), N_POINTS).points
    path = str(tmp_path_factory.mktemp("scan") / "crop.bin")
    np.ascontiguousarray(pts, dtype="<f4").tofile(path)
    return path


def _randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights (torch default init under ``seed``) and BatchNorm statistics far from the
    identity, so folding and the affine terms matter; eval mode."""
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g) * 0.6 - 0.3)
    return model.eval()


def _trained(name: str, x: lattice.SparseTensor, steps: int = 6) -> torch.nn.Module:
    """The demo network / MinkUNet42 (cr 0.25) with randomised BatchNorm statistics, trained
    ``steps`` Adam steps on ``x`` (targets: height bands of the voxels, one per class) so that
    the logits separate classes (an untrained net answers one class everywhere), then eval."""
    torch.manual_seed(0)
    model = SparseUNet(5, 8, 5) if name == "demo" else MinkUNet42(5, 19, cr=0.25)
    _randomize(model, 0).train()
    k = (model.head if name == "demo" else model.classifier).weight.shape[0]
    z = x.feats[:, 3].contiguous()
    target = torch.bucketize(z, torch.quantile(z, torch.linspace(0, 1, k + 1)[1:-1]).contiguous())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        loss = torch.nn.functional.cross_entropy(out.feats, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("name", ["demo", "minkunet42"])
def test_runner_matches_python(name: str, scan_bin: str, tmp_path) -> None:
    spec = lx.demo_voxelize_spec(VOXEL)
    points = torch.from_numpy(np.fromfile(scan_bin, dtype=np.float32).reshape(-1, 4))
    x, inverse = lx.voxelize_points(points, spec)
    assert len(x) > 2000, len(x)  # a real workload, not a handful of voxels
    model = _trained(name, x)
    out_dir = str(tmp_path / "net")
    graph = lattice.export(model, x, out_dir, metadata={"voxelize": spec})
    assert graph["format"] == "lattice.graph" and graph["version"] == 1
    assert {"conv3d", "conv_transpose3d", "subm_conv3d", "cat", "add", "linear"} <= {n["op"] for n in graph["nodes"]}

    with torch.no_grad():
        eager = model(x)
    eager = eager[0] if isinstance(eager, tuple) else eager
    assert eager.key == x.key
    ref_points = eager.feats[inverse]

    labels_path, logits_path = str(tmp_path / "crop.label"), str(tmp_path / "logits.npy")
    proc = subprocess.run([_runner(), out_dir, scan_bin, "--out", labels_path, "--logits", logits_path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for stage in ("read", "voxelize", "network", "map back"):
        assert stage in proc.stdout, proc.stdout
    runner = torch.from_numpy(np.load(logits_path))
    assert runner.shape == ref_points.shape
    err = _rel(runner, ref_points)
    assert err <= 1e-5, err
    assert torch.equal(runner.argmax(1), ref_points.argmax(1))
    labels = np.fromfile(labels_path, dtype=np.uint32)
    assert np.array_equal(labels.astype(np.int64), ref_points.argmax(1).numpy())
    assert len(np.unique(labels)) >= 3  # not a constant answer

    # the Python executor of the same directory: bit for bit the runner's numbers
    ex = lattice.load_exported(out_dir)(x)[0]
    assert torch.equal(ex.feats[inverse], runner)


def test_runner_voxelization_matches_demo(scan_bin: str) -> None:
    """demo_voxelize_spec + point_features reproduce the demo's own voxel features exactly."""
    from lattice._demo_data import Scan

    pts = np.fromfile(scan_bin, dtype=np.float32).reshape(-1, 4)
    demo = voxelize_scan(Scan(pts, np.zeros(len(pts), dtype=np.int64) - 100, "test"), VOXEL)
    x, inverse = lx.voxelize_points(torch.from_numpy(pts), lx.demo_voxelize_spec(VOXEL))
    assert torch.equal(x.coords, demo.tensor.coords)
    assert torch.equal(x.feats, demo.tensor.feats)
    assert torch.equal(inverse, demo.inverse)


def test_batch_norm_folding(tmp_path) -> None:
    torch.manual_seed(3)
    model = _randomize(SparseUNet(5, 8, 5), 3)
    coords = torch.unique(torch.randint(0, 24, (3000, 3), dtype=torch.int32), dim=0)
    coords = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords], 1)
    x = lattice.SparseTensor(coords, torch.randn(len(coords), 5, generator=torch.Generator().manual_seed(4)))
    with torch.no_grad():
        ref = model(x)[0].feats
    folded = lattice.export(model, x, str(tmp_path / "f"))
    plain = lattice.export(model, x, str(tmp_path / "p"), fold_batch_norm=False)
    ops_f = [n["op"] for n in folded["nodes"]]
    ops_p = [n["op"] for n in plain["nodes"]]
    assert "scale_shift" not in ops_f and "batch_norm" not in ops_f
    n_bn = sum(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules())
    assert ops_p.count("scale_shift") == n_bn and len(ops_p) == len(ops_f) + n_bn
    assert sum("folded_batch_norm" in n["attrs"] for n in folded["nodes"]) == n_bn
    for d in ("f", "p"):
        out = lattice.load_exported(str(tmp_path / d))(x)[0].feats
        assert _rel(out, ref) <= 1e-5
        assert torch.equal(out.argmax(1), ref.argmax(1))


class _Slices(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = lnn.SubmConv3d(4, 8, 3)

    def forward(self, x):
        y = self.conv(x)
        return y.replace_feats(y.feats[:, :4])  # Tensor.__getitem__: not exportable


class _Pooled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = lnn.MaxPool3d(2, stride=2)
        self.head = lnn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.pool(x))


def _small_input() -> lattice.SparseTensor:
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1], [0, 3, 2, 1]], dtype=torch.int32)
    return lattice.SparseTensor(coords, torch.randn(4, 4))


def test_unsupported_function_names_it(tmp_path) -> None:
    with pytest.raises(lx.ExportError, match=r"\[export\] model \(_Slices\): Tensor.__getitem__: expected one of the exportable"):
        lattice.export(_Slices().eval(), _small_input(), str(tmp_path / "a"))
    assert not os.path.exists(tmp_path / "a" / "graph.json")


def test_unsupported_module_names_its_place(tmp_path) -> None:
    with pytest.raises(lx.ExportError, match=r"\[export\] pool \(MaxPool3d\): Tensor.detach: expected one of the exportable"):
        lattice.export(_Pooled().eval(), _small_input(), str(tmp_path / "b"))


def test_training_mode_batch_norm_is_refused(tmp_path) -> None:
    model = SparseUNet(4, 4, 3)  # train mode
    with pytest.raises(lx.ExportError, match=r"\[export\] stem.bn.bn \(BatchNorm1d\): torch.nn.functional.batch_norm: expected eval mode"):
        lattice.export(model, _small_input(), str(tmp_path / "c"))


def test_window_conv_is_refused(tmp_path) -> None:
    from lattice.models.blocks import WindowConv3d

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down = WindowConv3d(4, 4, 3, stride=2, padding=1)

        def forward(self, x):
            return self.down(x)

    with pytest.raises(lx.ExportError, match=r"\[export\] down \(WindowConv3d\): WindowConv3d: expected one of SubmConv3d"):
        lattice.export(M().eval(), _small_input(), str(tmp_path / "d"))


def test_safetensors_layout(tmp_path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.5, -2.0, 7.0], dtype=np.float32)
    p = str(tmp_path / "w.safetensors")
    lx.write_safetensors(p, {"b": b, "a": a}, {"k": "v"})
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"k": "v"}
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "F32", "shape": [3], "data_offsets": [24, 36]}
    assert raw[8 + n:8 + n + 24] == a.astype("<f4").tobytes()
    back = lx.read_safetensors(p)
    assert np.array_equal(back["a"], a) and np.array_equal(back["b"], b)
