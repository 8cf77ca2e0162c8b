"""Why a MinkUNet42 training step times longer in the side-by-side process than alone (issue 12).

gpu_side_by_side.sh's kitti autocast training row measured ~31-33 ms for lattice while
scripts/gpu_network_profile.py measured ~24-25 ms of wall for the same step alone. This script
times the side-by-side's own step (CUDA events around it, 3 warm-up and 10 timed calls, the
median; best of two) in one process at successive stages:

* alone (a fresh process, as the profile);
* with Python's garbage collector disabled around the timed calls;
* after lattice's single-layer rows of the side-by-side (kitti subm3 C=64 and 128 hot / cold /
  fwd+bwd, k2s2 cold: their modules and inputs kept alive, as the script does);
* the same with the collector disabled;

and prints, per stage, lattice's allocator driver calls and host syncs per step and the
collector's gen-2 collections per step. Needs a CUDA device and the kitti scan (LATTICE_SHARED_DIR).

    LATTICE_EXTENSION_DIR=build-device/py PYTHONPATH=python python3 scripts/gpu_train_gap.py
    REPEAT=4 taskset -c 0-3 ... python3 scripts/gpu_train_gap.py   # four alone / gc-off pairs, pinned
"""
from __future__ import annotations

import gc
import json

import numpy as np
import torch

import lattice
import lattice.nn as lnn
from lattice.bench import workloads
from lattice.models import MinkUNet42

dev = torch.device("cuda")


def timed(fn, warm=3, reps=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return float(np.median(ts))


coords = torch.from_numpy(np.array(workloads.coords("kitti"))).int().to(dev)
n = coords.shape[0]
torch.manual_seed(0)
feats = torch.randn(n, 4, device=dev)
labels = torch.randint(0, 19, (n,), device=dev)
model = MinkUNet42(in_channels=4).to(dev)


def la_train():
    model.train()
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(lattice.SparseTensor(coords, feats))
        loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
    loss.backward()


def stage(name, gc_off=False):
    if gc_off:
        gc.disable()
    try:
        t = min(timed(la_train) for _ in range(2))
        m0, s0, g0 = lattice.cuda.memory_stats(), lattice.cuda.host_syncs(), gc.get_stats()[2]["collections"]
        for _ in range(5):
            la_train()
        torch.cuda.synchronize()
        m1, s1, g1 = lattice.cuda.memory_stats(), lattice.cuda.host_syncs(), gc.get_stats()[2]["collections"]
    finally:
        gc.enable()
    row = {"stage": name, "train_ms": round(t, 2),
           "driver_allocs_per_step": (m1["driver_allocs"] - m0["driver_allocs"]) / 5,
           "host_syncs_per_step": (s1 - s0) / 5, "gen2_per_step": (g1 - g0) / 5,
           "gc_objects": len(gc.get_objects()),
           "torch_reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2),
           "lattice_live_gib": round(m1["live_bytes"] / 2**30, 2), "lattice_cached_gib": round(m1["cached_bytes"] / 2**30, 2)}
    print(json.dumps(row), flush=True)


import os
for r in range(int(os.environ.get("REPEAT", "1"))):  # the same stage again: is the time bimodal?
    stage(f"alone ({r + 1})")
    stage(f"alone, gc off ({r + 1})", True)
keep = []
for C in (64, 128):
    f = torch.randn(n, C, device=dev, dtype=torch.float16)
    conv = lnn.SubmConv3d(C, C, 3, bias=False).to(dev).half().eval()
    x = lattice.SparseTensor(coords, f)
    with torch.no_grad():
        for _ in range(35):
            conv(x)
        for _ in range(30):
            conv(lattice.SparseTensor(coords, f))
    fg = f.clone().requires_grad_(True)
    xt = lattice.SparseTensor(coords, fg)
    conv.train()
    for _ in range(30):
        conv(xt).feats.float().sum().backward()
    conv.eval()
    down = lnn.Conv3d(C, C, 2, stride=2, bias=False).to(dev).half().eval()
    with torch.no_grad():
        for _ in range(30):
            down(lattice.SparseTensor(coords, f))
    keep += [f, conv, x, fg, xt, down]
torch.cuda.synchronize()
stage("after the single-layer rows")
stage("after the single-layer rows, gc off", True)
