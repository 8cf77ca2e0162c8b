#!/usr/bin/env python3
"""Make the TorchSparse fixtures of tests/python/test_convert_torchsparse.py (run by hand, on a
machine with CUDA and TorchSparse 2.1 built: TorchSparse 2.1 has no CPU convolution).

What it writes, per network, to ``tests/fixtures/torchsparse_<net>.npz`` (numpy only, no pickle),
in the layout of scripts/make_convert_fixtures.py (the MinkowskiEngine fixtures):

* ``sd_keys`` (the state_dict's key order, which lattice.convert relies on) and ``sd/<key>`` for
  every entry of the TorchSparse network's ``state_dict()``: random weights from a fixed seed,
  BatchNorm affine parameters random, running statistics measured on the input (two train-mode
  passes with a cumulative average);
* ``input_coords`` (N, 4) int32 ``(batch, x, y, z)`` (TorchSparse 2.1's order, batch first, all
  >= 0) and ``input_feats`` (N, 4) float32 ``(x, y, z, remission)``: two crops of lattice's own
  synthetic ray-cast street scan (``lattice._demo_data.synthetic_scan``), shifted to non-negative
  coordinates, quantized by TorchSparse's own ``torchsparse.utils.quantize.sparse_quantize``
  (voxel 0.1 m, floor), one crop per batch index;
* ``out<i>_coords`` / ``out<i>_feats`` for each output ``i`` of the network (in TorchSparse's row
  order with TorchSparse's coordinates, in units of the output's stride), and ``out<i>_stride``;
  the network in eval mode, float32, copied to the CPU;
* ``meta``: a JSON string (network, TorchSparse / torch / CUDA versions, GPU, channels, seed,
  voxel size, crops, the conv config used).

The network (``TSNet``, module names as below; the matching lattice network is
``tests/python/test_convert_torchsparse.py::LatticeNet``, registered in the same order so that
``lattice.convert.from_torchsparse`` pairs the layers by state_dict order) covers every layer kind
a TorchSparse checkpoint has:

=========  ==========================================================  ======================
name       layers                                                      what it checks
=========  ==========================================================  ======================
stem       Conv3d(4, c0, 3) + BatchNorm + ReLU                         submanifold k3 (odd
                                                                       volume: x fastest)
down       Conv3d(c0, c1, 2, stride=2) + BatchNorm + ReLU              strided k2 (even: z
                                                                       fastest), floor coords
mid        Conv3d(c1, c1, (3, 1, 5)) + BatchNorm + ReLU                non-cubic odd kernel:
                                                                       the axis order of rows
up         Conv3d(c1, c0, 2, stride=2, transposed=True) + BN + ReLU    transposed conv onto
                                                                       the stem's rows
head       Conv3d(2 c0, classes, 1, bias=True) on cat(up, stem)        (C_in, C_out) 1x1
                                                                       kernel, bias, cat order
win        Conv3d(c1, c2, 3, stride=2, padding=1) + BatchNorm + ReLU   odd strided kernel: the
                                                                       spconv window
=========  ==========================================================  ======================

``forward`` returns ``(head output, win output)``. Precision: the convolutions run in float32
(``torchsparse.backends.allow_tf32 = allow_fp16 = False``, torch's TF32 off, the GatherScatter
dataflow: gather, torch matmul per kernel offset, scatter), so the fixture is TorchSparse's
float32 function and the lattice test can hold it to a float32 tolerance.

Build TorchSparse 2.1 (source: ../shared/anchors/torchsparse-2.1.0-385f5ce.tar.gz; needs CUDA,
libsparsehash: ../shared/anchors/sparsehash-2.0.3-headers.tar.gz) on the GPU machine, e.g.

    mkdir -p /tmp/ts && tar -xzf ../shared/anchors/torchsparse-2.1.0-385f5ce.tar.gz -C /tmp/ts
    tar -xzf ../shared/anchors/sparsehash-2.0.3-headers.tar.gz -C /tmp/ts   # usr/include/google/...
    (cd /tmp/ts/torchsparse && CPLUS_INCLUDE_PATH=/tmp/ts/usr/include FORCE_CUDA=1 MAX_JOBS=16 \\
        python3 -m pip install --no-build-isolation --no-deps .)

then, from the repository root (lattice importable: PYTHONPATH=python with a built extension, or
an installed lattice; only ``lattice._demo_data`` is used, for the synthetic scan):

    PYTHONPATH=python python3 scripts/make_torchsparse_fixtures.py

(``--out DIR`` writes elsewhere). Commit ``tests/fixtures/torchsparse_*.npz`` (a few
hundred kB); tests/python/test_convert_torchsparse.py then runs in ``make test``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict

import numpy as np
import torch

# TorchSparse 2.1 imports two small packages its computation never uses (rootpath, the backport
# of functools.cached_property); stand-ins where they are not installed, as the bench scripts do.
import functools  # noqa: E402
import types  # noqa: E402

sys.modules.setdefault("rootpath", types.ModuleType("rootpath"))
if "backports.cached_property" not in sys.modules:
    _bp, _cp = types.ModuleType("backports"), types.ModuleType("backports.cached_property")
    _cp.cached_property = functools.cached_property  # type: ignore[attr-defined]
    _bp.cached_property = _cp  # type: ignore[attr-defined]
    sys.modules.setdefault("backports", _bp)
    sys.modules.setdefault("backports.cached_property", _cp)

try:  # absent where only --write-points runs
    import torchsparse
    import torchsparse.nn as spnn
    from torchsparse.nn import functional as TF
    from torchsparse.utils.quantize import sparse_quantize
except ImportError as exc:  # pragma: no cover - depends on the machine
    torchsparse = None
    _TORCHSPARSE_ERROR = exc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = {"tsnet": dict(channels=(16, 24, 32), num_classes=6)}
VOXEL = 0.1
CROPS = (((5.0, 12.0), (-4.0, 4.0)), ((-12.0, -5.0), (-4.0, 4.0)))  # (x range, y range) per batch index
SEED = 17


class TSNet(torch.nn.Module):
    """The fixture network (module docstring), from TorchSparse 2.1 layers."""

    def __init__(self, in_channels: int, num_classes: int, channels) -> None:
        super().__init__()
        c0, c1, c2 = channels

        def block(conv):
            return torch.nn.Sequential(conv, spnn.BatchNorm(conv.out_channels), spnn.ReLU(True))

        self.stem = block(spnn.Conv3d(in_channels, c0, 3))
        self.down = block(spnn.Conv3d(c0, c1, 2, stride=2))
        self.mid = block(spnn.Conv3d(c1, c1, (3, 1, 5)))
        self.up = block(spnn.Conv3d(c1, c0, 2, stride=2, transposed=True))
        self.head = spnn.Conv3d(2 * c0, num_classes, 1, bias=True)
        self.win = block(spnn.Conv3d(c1, c2, 3, stride=2, padding=1))

    def forward(self, x):
        x1 = self.stem(x)
        x2 = self.mid(self.down(x1))
        u = self.up(x2)
        y = self.head(torchsparse.cat([u, x1]))
        return y, self.win(x2)


def scan_points(points_file: str = "") -> np.ndarray:
    """(P, 4) float32 points of lattice's synthetic street scan (seed SEED): computed with lattice
    (importable: PYTHONPATH=python and a built extension), or read from ``points_file`` written by
    ``--write-points`` on a machine where lattice is built."""
    if points_file:
        return np.load(points_file).astype(np.float32)
    sys.path.insert(0, os.path.join(REPO, "python"))
    try:
        from lattice._demo_data import synthetic_scan  # lattice's own scan: nothing third-party in the fixture
    except ImportError as exc:
        sys.exit(f"make_torchsparse_fixtures: lattice is not importable here ({exc}); build it (make build, or as "
                 f"scripts/device_parity.sh does) or pass --points FILE.npy written elsewhere with --write-points FILE.npy")
    return synthetic_scan(seed=SEED).points.astype(np.float32)


def make_input(pts: np.ndarray):
    coords, feats = [], []
    for b, ((x0, x1), (y0, y1)) in enumerate(CROPS):
        m = (pts[:, 0] > x0) & (pts[:, 0] < x1) & (pts[:, 1] > y0) & (pts[:, 1] < y1)
        p = pts[m]
        shifted = p[:, :3] - np.floor(p[:, :3].min(0) / VOXEL) * VOXEL  # TorchSparse 2.1: coordinates >= 0
        c, idx = sparse_quantize(shifted, VOXEL, return_index=True)
        coords.append(np.concatenate([np.full((len(c), 1), b, np.int32), c.astype(np.int32)], 1))
        feats.append(p[idx].astype(np.float32))
    return (torch.from_numpy(np.concatenate(coords)).int().contiguous(),
            torch.from_numpy(np.concatenate(feats)).float().contiguous())


def init_weights(net: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, spnn.Conv3d):
                k = m.kernel
                fan_in = m.in_channels * m.kernel_volume
                k.copy_(torch.randn(k.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, spnn.BatchNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)


def run(net, coords, feats):
    return net(torchsparse.SparseTensor(feats.cuda(), coords.cuda()))


def make(name: str, spec: dict, coords: torch.Tensor, feats: torch.Tensor, out_dir: str) -> str:
    torch.manual_seed(SEED)
    net = TSNet(feats.shape[1], spec["num_classes"], spec["channels"])
    init_weights(net, torch.Generator().manual_seed(SEED))
    net = net.cuda()
    bns = [m for m in net.modules() if isinstance(m, spnn.BatchNorm)]
    for bn in bns:
        bn.momentum = None  # cumulative average over the two passes
    net.train()
    with torch.no_grad():
        for _ in range(2):
            run(net, coords, feats)
    for bn in bns:
        bn.momentum = 0.1
    net.eval()
    with torch.no_grad():
        outs = run(net, coords, feats)
    sd = net.state_dict()
    arrays = OrderedDict()
    arrays["sd_keys"] = np.array(list(sd.keys()))
    for k, v in sd.items():
        arrays[f"sd/{k}"] = v.detach().cpu().numpy()
    arrays["input_coords"] = coords.numpy().astype(np.int32)
    arrays["input_feats"] = feats.numpy().astype(np.float32)
    for i, o in enumerate(outs):
        arrays[f"out{i}_coords"] = o.coords.cpu().numpy().astype(np.int32)
        arrays[f"out{i}_feats"] = o.feats.detach().float().cpu().numpy()
        arrays[f"out{i}_stride"] = np.array(o.stride, dtype=np.int32)
    meta = dict(net=name, channels=spec["channels"], num_classes=spec["num_classes"], in_channels=int(feats.shape[1]),
                outputs=len(outs), seed=SEED, voxel=VOXEL, crops=CROPS,
                data=f"lattice._demo_data.synthetic_scan(seed={SEED}), crops shifted to >= 0",
                torchsparse=torchsparse.__version__, torch=torch.__version__, cuda=torch.version.cuda,
                gpu=torch.cuda.get_device_name(), dataflow="GatherScatter", allow_tf32=False, allow_fp16=False)
    arrays["meta"] = np.array(json.dumps(meta))
    path = os.path.join(out_dir, f"torchsparse_{name}.npz")
    np.savez_compressed(path, **arrays)
    print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB, {len(coords)} voxels, outputs "
          f"{[tuple(o.feats.shape) for o in outs]} at strides {[o.stride for o in outs]}", file=sys.stderr)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--nets", nargs="*", default=list(NETS))
    ap.add_argument("--points", default="", help="read the scan points from this .npy (see --write-points)")
    ap.add_argument("--write-points", default="", metavar="FILE",
                    help="only write the synthetic scan's points (P, 4) float32 to FILE.npy (needs lattice, not "
                         "TorchSparse) and exit")
    args = ap.parse_args()
    if args.write_points:
        np.save(args.write_points, scan_points())
        return
    if torchsparse is None:
        sys.exit(f"make_torchsparse_fixtures: TorchSparse 2.1 is not importable ({_TORCHSPARSE_ERROR}); build it "
                 f"as the module docstring says")
    if not torch.cuda.is_available():
        sys.exit("make_torchsparse_fixtures: TorchSparse 2.1 convolutions need CUDA; no GPU is visible")
    os.makedirs(args.out, exist_ok=True)
    # float32 everywhere: TorchSparse's own TF32 / FP16 switches (set by torchsparse.backends.init()
    # from the GPU's capability) and torch's TF32 matmul off; GatherScatter: torch.mm per offset
    torchsparse.backends.allow_tf32 = False
    torchsparse.backends.allow_fp16 = False
    torchsparse.backends.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = TF.conv_config.get_default_conv_config()  # the module's own dict: copy before editing
    config = type(config)(list(config.items()))
    config.dataflow = TF.Dataflow.GatherScatter
    TF.conv_config.set_global_conv_config(config)
    coords, feats = make_input(scan_points(args.points))
    for name in args.nets:
        make(name, NETS[name], coords, feats, args.out)


if __name__ == "__main__":
    main()
