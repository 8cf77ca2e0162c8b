"""Host time of one sparse convolution on the GPU: where a layer's wall time goes when it is
host-bound (docs/performance.md, "Where the host time of a training conv goes").

    LATTICE_EXTENSION_DIR=build-device/py PYTHONPATH=python python3 scripts/gpu_host_time.py [--workload kitti] [--channels 64]

Prints, for a submanifold 3^3 layer in float16 on the workload's rows:

* host time per call (``time.perf_counter`` around the call, the device synchronised between
  calls) and pipelined time (many calls between two CUDA events) of the core's calls
  (``core.conv_forward``, ``core.conv_backward`` per pass) and of the module (no_grad, with
  autograd, forward + backward);
* an A/B in one process of ``lattice.ops.conv.CORE_PERMUTES_TRAINING_WEIGHTS`` (torch permutes the
  training weight vs the core permutes it on the device), alternating, best of two rounds, on the
  side-by-side script's fwd+bwd row, a ``backward(gy)`` step and a MinkUNet42 autocast training
  step on a fresh tensor.

The kitti workload needs the shared data (``LATTICE_SHARED_DIR`` or ../shared); ``lidar`` is the
synthetic scan. Needs a CUDA device.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import lattice
import lattice.nn as lnn
from lattice import ops
from lattice._core import core, to_core
from lattice.bench import workloads
from lattice.models import MinkUNet42


def host_and_pipelined(fn, n: int = 50) -> tuple[float, float]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return 1e6 * float(np.median(ts)), 1e3 * e0.elapsed_time(e1) / n


def event_ms(fn, warm: int = 3, reps: int = 20) -> float:
    """The side-by-side script's timer: CUDA events around one call, median of reps."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="kitti")
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--no-network", action="store_true", help="skip the MinkUNet42 training-step A/B")
    a = ap.parse_args()
    dev = torch.device("cuda")
    coords = torch.from_numpy(np.array(workloads.coords(a.workload))).int().to(dev)
    n, c = coords.shape[0], a.channels
    torch.manual_seed(0)
    feats = torch.randn(n, c, device=dev, dtype=torch.float16)
    gy = torch.randn(n, c, device=dev, dtype=torch.float16)
    conv = lnn.SubmConv3d(c, c, 3, bias=False).to(dev).half()
    x = lattice.SparseTensor(coords, feats)
    with torch.no_grad():
        conv(x)  # builds and caches the relation
    km = conv.weight.detach().permute(1, 2, 3, 4, 0).reshape(27, c, c).contiguous()
    p = ops.conv.plan("subm_conv3d", "submanifold", x, km, kernel_size=3)
    print(f"{a.workload}: {n} rows, C={c}, float16, {torch.cuda.get_device_name(0)}")
    print("\n| call | host us | pipelined us |\n|---|---|---|")
    fg = feats.clone().requires_grad_(True)
    xt = lattice.SparseTensor(coords, fg)
    calls = {
        "core.conv_forward": lambda: core.conv_forward(p, to_core(feats), to_core(km), None),
        "core.conv_backward input grad": lambda: core.conv_backward(p, to_core(feats), to_core(km), to_core(gy), True, False, False),
        "core.conv_backward weight grad": lambda: core.conv_backward(p, to_core(feats), to_core(km), to_core(gy), False, True, False),
        "core.conv_backward both": lambda: core.conv_backward(p, to_core(feats), to_core(km), to_core(gy), True, True, False),
        "module forward, no_grad": lambda: _no_grad(conv, x),
        "module forward, autograd": lambda: conv(xt),
        "module forward + backward(gy)": lambda: conv(xt).feats.backward(gy),
    }
    for name, fn in calls.items():
        h, d = host_and_pipelined(fn)
        print(f"| {name} | {h:.1f} | {d:.1f} |")

    rows = {
        "side-by-side fwd+bwd row (.float().sum().backward())": lambda: conv(xt).feats.float().sum().backward(),
        "forward + backward(gy)": lambda: conv(xt).feats.backward(gy),
    }
    if not a.no_network:
        net = MinkUNet42(4, 19).to(dev)
        pts = torch.randn(n, 4, device=dev)
        labels = torch.randint(0, 19, (n,), device=dev)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)

        def train_step() -> None:
            with torch.autocast("cuda", dtype=torch.float16):
                out = net(lattice.SparseTensor(coords, pts))
                loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        rows["MinkUNet42 training step, autocast, fresh tensor"] = train_step
    print("\n| row (ms, CUDA events) | torch permutes | core permutes | ratio |\n|---|---|---|---|")
    saved = ops.conv.CORE_PERMUTES_TRAINING_WEIGHTS
    try:
        for name, fn in rows.items():
            best: dict[bool, float] = {}
            for _ in range(2):
                for flag in (False, True):
                    ops.conv.CORE_PERMUTES_TRAINING_WEIGHTS = flag
                    t = event_ms(fn, reps=8 if "MinkUNet" in name else 20)
                    best[flag] = min(best.get(flag, float("inf")), t)
            print(f"| {name} | {best[False]:.3f} | {best[True]:.3f} | {best[True] / best[False]:.2f} |")
    finally:
        ops.conv.CORE_PERMUTES_TRAINING_WEIGHTS = saved


def _no_grad(conv, x):
    with torch.no_grad():
        return conv(x)


if __name__ == "__main__":
    main()
