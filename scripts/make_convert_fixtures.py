#!/usr/bin/env python3
"""Make the MinkowskiEngine fixtures of tests/python/test_convert_fixtures.py (run by hand).

What it writes, per network, to ``tests/fixtures/minkowski_<net>.npz`` (numpy only, no pickle):

* ``sd_keys`` (the state_dict's key order, which lattice.convert relies on) and ``sd/<key>`` for
  every entry of the ME network's ``state_dict()``: random weights from a fixed seed, BatchNorm
  affine parameters random, running statistics measured on the input (two train-mode passes with
  a cumulative average, so they are neither 0 / 1 nor far from the activations' scale);
* ``input_coords`` (N, 4) int32 ``(batch, x, y, z)`` and ``input_feats`` (N, 4) float32
  ``(x, y, z, remission)``: two crops of lattice's own synthetic ray-cast street scan
  (``lattice._demo_data.synthetic_scan``; ``--data DIR`` takes a SemanticKITTI scan instead, whose
  CC BY-NC-SA 3.0 licence then applies to the output, so the committed fixtures do not use it), one per batch index, quantized by ME's own
  ``MinkowskiEngine.utils.sparse_quantize`` (voxel 0.1 m, floor) and batched by
  ``MinkowskiEngine.utils.batched_coordinates``;
* ``out_coords`` / ``out_feats``: the ME network's output in ME's row order with ME's
  coordinates (``out.C``, ``out.F``), the network in eval mode, float32 on the CPU;
* ``meta``: a JSON string (network, ME version, channel table, blocks, seed, voxel size, crops).

The networks are ME's examples/minkunet.py MinkUNet family, written out below from ME layers with
ME's module names (the examples folder is not part of the ME tarball in ../shared/anchors):
``conv0p1s1`` k5 + ``bn0``, four ``conv{i}p{2^(i-1)}s2`` k2 s2 + ``bn{i}`` + ``block{i}``, four
``convtr{j}p{..}s2`` k2 s2 transposed + ``bntr{j}``, ``ME.cat(up, skip)`` + ``block{j+1}``, and
``final`` (1x1 conv with bias); ``block*`` are ``MinkowskiEngine.modules.resnet_block.BasicBlock``
stacks with ME's ``_make_layer`` downsample (1x1 conv + BN) when the channels change. Channel
tables: ``INIT_DIM`` + ``PLANES`` of MinkUNet18A (32 | 32, 64, 128, 256 | 128, 128, 96, 96) and
MinkUNet34C (32 | 32, 64, 128, 256 | 256, 128, 96, 96), scaled down (``cr``) to keep each file
small; the matching lattice networks are ``lattice.models.MinkUNet18(channels=...)`` and
``MinkUNet34(channels=...)``.

Build ME 0.5.4 on the CPU as ../shared/bench/cpu_side_by_side.sh does (17 min on 2 busy cores;
the final copy step of ``build_ext --inplace`` fails, hence the last three lines):

    apt-get install -y libopenblas-dev libtorch-dev python3-dev
    mkdir -p /tmp/minkowski_build
    tar -xzf ../shared/anchors/MinkowskiEngine-0.5.4-02fc608.tar.gz -C /tmp/minkowski_build
    cd /tmp/minkowski_build/MinkowskiEngine && MAX_JOBS=2 /usr/bin/python3 setup.py build_ext --inplace \\
        --cpu_only --blas=openblas --blas_include_dirs=/usr/include/x86_64-linux-gnu/openblas-pthread
    mkdir -p MinkowskiEngineBackend
    cp build/lib.*/MinkowskiEngineBackend/_C*.so MinkowskiEngineBackend/
    touch MinkowskiEngineBackend/__init__.py

then, from the repository root:

    PYTHONPATH=/tmp/minkowski_build/MinkowskiEngine /usr/bin/python3 scripts/make_convert_fixtures.py

(``--out DIR`` writes elsewhere, ``--data DIR`` names another folder with ``000000.bin``). The
output is deterministic for a given ME build: the seed fixes the weights, the data fixes the
input; only ME's float32 summation order enters ``out_feats``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict

import numpy as np
import torch

import MinkowskiEngine as ME
from MinkowskiEngine.modules.resnet_block import BasicBlock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data", "semantickitti")

# ME examples/minkunet.py channel tables: (INIT_DIM,) + PLANES, and LAYERS
NETS = {
    "minkunet18a": dict(channels=(32, 32, 64, 128, 256, 128, 128, 96, 96), layers=(2,) * 8, cr=0.125,
                        lattice="MinkUNet18"),
    "minkunet34c": dict(channels=(32, 32, 64, 128, 256, 256, 128, 96, 96), layers=(2, 3, 4, 6, 2, 2, 2, 2),
                        cr=0.0625, lattice="MinkUNet34"),
}
NUM_CLASSES = 7
VOXEL = 0.1
CROPS = (((5.0, 12.0), (-4.0, 4.0)), ((-12.0, -5.0), (-4.0, 4.0)))  # (x range, y range) per batch index
SEED = 13
DATA_NAME = ""


class MEMinkUNet(torch.nn.Module):
    """ME's MinkUNetBase layout (examples/minkunet.py) from ME layers, with ME's module names."""

    def __init__(self, in_channels: int, out_channels: int, channels, layers, D: int = 3) -> None:
        super().__init__()
        init_dim, planes = channels[0], channels[1:]
        self.D = D
        self.inplanes = init_dim
        self.conv0p1s1 = ME.MinkowskiConvolution(in_channels, init_dim, kernel_size=5, dimension=D)
        self.bn0 = ME.MinkowskiBatchNorm(init_dim)
        skips = [init_dim]
        for i in range(4):
            setattr(self, f"conv{i + 1}p{2 ** i}s2",
                    ME.MinkowskiConvolution(self.inplanes, self.inplanes, kernel_size=2, stride=2, dimension=D))
            setattr(self, f"bn{i + 1}", ME.MinkowskiBatchNorm(self.inplanes))
            setattr(self, f"block{i + 1}", self._make_layer(planes[i], layers[i]))
            skips.append(self.inplanes)
        for j in range(4):
            name = f"convtr{4 + j}p{2 ** (4 - j)}s2"
            setattr(self, name, ME.MinkowskiConvolutionTranspose(self.inplanes, planes[4 + j], kernel_size=2,
                                                                  stride=2, dimension=D))
            setattr(self, f"bntr{4 + j}", ME.MinkowskiBatchNorm(planes[4 + j]))
            self.inplanes = planes[4 + j] + skips[3 - j]
            setattr(self, f"block{5 + j}", self._make_layer(planes[4 + j], layers[4 + j]))
        self.final = ME.MinkowskiConvolution(planes[7], out_channels, kernel_size=1, bias=True, dimension=D)
        self.relu = ME.MinkowskiReLU(inplace=True)

    def _make_layer(self, planes: int, blocks: int) -> torch.nn.Sequential:
        downsample = None
        if self.inplanes != planes:
            downsample = torch.nn.Sequential(
                ME.MinkowskiConvolution(self.inplanes, planes, kernel_size=1, stride=1, dimension=self.D),
                ME.MinkowskiBatchNorm(planes))
        layers = [BasicBlock(self.inplanes, planes, stride=1, dilation=1, downsample=downsample, dimension=self.D)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes, stride=1, dilation=1, dimension=self.D) for _ in range(1, blocks)]
        return torch.nn.Sequential(*layers)

    def forward(self, x):
        out = self.relu(self.bn0(self.conv0p1s1(x)))
        skips = [out]
        for i in range(4):
            out = getattr(self, f"conv{i + 1}p{2 ** i}s2")(out)
            out = self.relu(getattr(self, f"bn{i + 1}")(out))
            out = getattr(self, f"block{i + 1}")(out)
            skips.append(out)
        for j in range(4):
            out = getattr(self, f"convtr{4 + j}p{2 ** (4 - j)}s2")(out)  # onto the skip's coordinates
            out = self.relu(getattr(self, f"bntr{4 + j}")(out))
            out = ME.cat(out, skips[3 - j])
            out = getattr(self, f"block{5 + j}")(out)
        return self.final(out)


def make_input(data_dir: str):
    if data_dir == "synthetic":  # lattice's own ray-cast street scan: nothing third-party in the fixture
        sys.path.insert(0, os.path.join(REPO, "python"))
        from lattice._demo_data import synthetic_scan
        pts = synthetic_scan(seed=SEED).points.astype(np.float32)
    else:
        pts = np.fromfile(os.path.join(data_dir, "000000.bin"), dtype=np.float32).reshape(-1, 4)
    coords, feats = [], []
    for (x0, x1), (y0, y1) in CROPS:
        m = (pts[:, 0] > x0) & (pts[:, 0] < x1) & (pts[:, 1] > y0) & (pts[:, 1] < y1)
        c, f = ME.utils.sparse_quantize(pts[m, :3], pts[m], quantization_size=VOXEL)
        coords.append(c)
        feats.append(np.asarray(f, dtype=np.float32))
    bc = ME.utils.batched_coordinates(coords, dtype=torch.int32)
    return bc, torch.from_numpy(np.concatenate(feats))


def init_weights(net: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (ME.MinkowskiConvolution, ME.MinkowskiConvolutionTranspose)):
                k = m.kernel
                fan_in = m.in_channels * (k.shape[0] if k.dim() == 3 else 1)
                k.copy_(torch.randn(k.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, ME.MinkowskiBatchNorm):
                m.bn.weight.copy_(torch.rand(m.bn.weight.shape, generator=g) + 0.5)
                m.bn.bias.copy_(torch.randn(m.bn.bias.shape, generator=g) * 0.1)


def make(name: str, spec: dict, coords: torch.Tensor, feats: torch.Tensor, out_dir: str) -> str:
    cs = tuple(max(1, int(spec["cr"] * c)) for c in spec["channels"])
    torch.manual_seed(SEED)
    net = MEMinkUNet(feats.shape[1], NUM_CLASSES, cs, spec["layers"])
    init_weights(net, torch.Generator().manual_seed(SEED))
    # running statistics from the data: two train-mode passes, cumulative average
    bns = [m.bn for m in net.modules() if isinstance(m, ME.MinkowskiBatchNorm)]
    for bn in bns:
        bn.momentum = None
    net.train()
    with torch.no_grad():
        for _ in range(2):
            net(ME.SparseTensor(feats, coords))
    for bn in bns:
        bn.momentum = 0.1
    net.eval()
    with torch.no_grad():
        out = net(ME.SparseTensor(feats, coords))
    sd = net.state_dict()
    arrays = OrderedDict()
    arrays["sd_keys"] = np.array(list(sd.keys()))
    for k, v in sd.items():
        arrays[f"sd/{k}"] = v.detach().cpu().numpy()
    arrays["input_coords"] = coords.numpy().astype(np.int32)
    arrays["input_feats"] = feats.numpy().astype(np.float32)
    arrays["out_coords"] = out.C.cpu().numpy().astype(np.int32)
    arrays["out_feats"] = out.F.detach().cpu().numpy().astype(np.float32)
    meta = dict(net=name, lattice=spec["lattice"], me_version=ME.__version__, channels=cs, layers=spec["layers"],
                num_classes=NUM_CLASSES, in_channels=int(feats.shape[1]), seed=SEED, voxel=VOXEL, crops=CROPS,
                data=DATA_NAME, torch=torch.__version__)
    arrays["meta"] = np.array(json.dumps(meta))
    path = os.path.join(out_dir, f"minkowski_{name}.npz")
    np.savez_compressed(path, **arrays)
    print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB, {len(coords)} voxels, channels {cs}, "
          f"|out| max {np.abs(arrays['out_feats']).max():.3g}", file=sys.stderr)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--data", default="synthetic",
                    help="'synthetic' (default: lattice's ray-cast street scan, what the committed fixtures use) or a "
                         "folder with a SemanticKITTI 000000.bin (its licence, CC BY-NC-SA 3.0, then applies to the output)")
    ap.add_argument("--nets", nargs="*", default=list(NETS))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # one summation order per run
    global DATA_NAME
    DATA_NAME = ("lattice._demo_data.synthetic_scan(seed=%d)" % SEED if args.data == "synthetic"
                 else "semantickitti/000000.bin (KITTI, CC BY-NC-SA 3.0)")
    coords, feats = make_input(args.data)
    for name in args.nets:
        make(name, NETS[name], coords, feats, args.out)


if __name__ == "__main__":
    main()
