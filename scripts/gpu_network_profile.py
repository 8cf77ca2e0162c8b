"""Where the time of a fresh-tensor MinkUNet42 step goes on the GPU.

Wall time, lattice's host read-backs, driver-call counts and GPU time per call, a
torch-profiler table and a cProfile of the Python side (docs/performance.md, "GPU: fewer
read-backs for a fresh tensor").

    LATTICE_EXTENSION_DIR=build-device/py PYTHONPATH=python python3 scripts/gpu_network_profile.py \\
        [--workload kitti] [--out DIR]

For inference (eval, no_grad) and a training step (cross-entropy, backward), both under
``torch.autocast("cuda", float16)`` with a fresh SparseTensor per call as in the side-by-side
script, prints

* the median wall time of 10 calls (perf_counter around call + synchronize);
* per call: the CUDA driver calls the profiler saw (``cudaLaunchKernel``, ``cudaMemcpyAsync``,
  ``cudaStreamSynchronize``, ...), the GPU time, and ``lattice.cuda.host_syncs()``;

and writes DIR/prof_<step>.txt (the profiler's tables by host and by GPU time) and
DIR/cprof_<step>.txt (cProfile by own time). kitti needs the shared data (``LATTICE_SHARED_DIR``
or ../shared); ``lidar`` / ``lidar_x2`` are synthetic. Needs a CUDA device.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import lattice
from lattice.bench import workloads
from lattice.models import MinkUNet42


class _CoreProxy:
    """Stands in for lattice's core module: counts calls, host time and host read-backs per
    core function (the read-backs from ``lattice.cuda.host_syncs()`` before and after)."""

    def __init__(self, core, table):
        self._core, self._table = core, table

    def __getattr__(self, name):
        attr = getattr(self._core, name)
        if not callable(attr) or isinstance(attr, type) or name in ("host_syncs", "cuda_memory_stats"):
            return attr
        table = self._table

        def wrapped(*a, **k):
            s0 = lattice.cuda.host_syncs()
            t = time.perf_counter()
            try:
                return attr(*a, **k)
            finally:
                ms = 1e3 * (time.perf_counter() - t)
                synced = lattice.cuda.host_syncs() - s0
                # calls that read back (a fresh relation's first count, ...) on rows of their own
                row = table.setdefault(name + (" (reading back)" if synced else ""), [0, 0.0, 0])
                row[0] += 1
                row[1] += ms
                row[2] += synced
        return wrapped


@contextlib.contextmanager
def attribute_core():
    """Every lattice module that imported ``core`` sees the proxy while the block runs."""
    import sys
    table: dict = {}
    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("lattice") and mod is not None and hasattr(mod, "core") \
                and not isinstance(getattr(mod, "core"), _CoreProxy) and mod_name != "lattice._core":
            real = getattr(mod, "core")
            if getattr(real, "__name__", "").endswith("_lattice") or hasattr(real, "conv_forward"):
                patched.append((mod, real))
                setattr(mod, "core", _CoreProxy(real, table))
    try:
        yield table
    finally:
        for mod, real in patched:
            setattr(mod, "core", real)


def wall_ms(fn, reps: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="kitti")
    ap.add_argument("--out", default=".", help="folder for the profiler and cProfile tables")
    ap.add_argument("--steps", default="infer,train,train_half",
                    help="comma list of infer, train (autocast f16), infer_half, train_half (model.half())")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    coords = torch.from_numpy(np.array(workloads.coords(args.workload))).int().to(dev)
    n = coords.shape[0]
    torch.manual_seed(0)
    feats = torch.randn(n, 4, device=dev)
    labels = torch.randint(0, 19, (n,), device=dev)
    model = MinkUNet42(in_channels=4).to(dev)

    def infer():
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            model(lattice.SparseTensor(coords, feats))

    def train():
        model.train()
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(lattice.SparseTensor(coords, feats))
            loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
        loss.backward()

    model_half = MinkUNet42(in_channels=4).to(dev).half()
    feats_half = feats.half()

    def infer_half():
        model_half.eval()
        with torch.no_grad():
            model_half(lattice.SparseTensor(coords, feats_half))

    def train_half():
        model_half.train()
        out = model_half(lattice.SparseTensor(coords, feats_half))
        loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
        loss.backward()

    steps = {"infer": infer, "train": train, "infer_half": infer_half, "train_half": train_half}

    print(f"{args.workload}: {n} rows, {torch.cuda.get_device_name(0)}")
    for name in args.steps.split(","):
        fn = steps[name]
        wall = wall_ms(fn)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        ka = prof.key_averages()
        with open(os.path.join(args.out, f"prof_{name}.txt"), "w") as f:
            f.write(ka.table(sort_by="self_cpu_time_total", row_limit=45, max_name_column_width=60))
            f.write(ka.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
        calls = {e.key: e.count // 3 for e in ka if e.key.startswith("cuda") or "Memcpy" in e.key}
        gpu_ms = sum(getattr(e, "self_device_time_total", 0) for e in ka
                     if getattr(e.device_type, "name", "") == "CUDA") / 3 / 1e3
        pr = cProfile.Profile()
        torch.cuda.synchronize()
        pr.enable()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
        with open(os.path.join(args.out, f"cprof_{name}.txt"), "w") as f:
            f.write(s.getvalue())
        before = lattice.cuda.host_syncs()
        fn()
        torch.cuda.synchronize()
        syncs = lattice.cuda.host_syncs() - before
        print(f"{name}: wall {wall:.2f} ms, GPU {gpu_ms:.2f} ms, lattice host syncs {syncs}; driver calls per call: "
              + json.dumps(calls), flush=True)
        with attribute_core() as table:
            fn()
            torch.cuda.synchronize()
        print(f"{name}: lattice core calls (calls, host ms, host syncs):")
        for key, (n_calls, ms, n_syncs) in sorted(table.items(), key=lambda kv: -kv[1][1]):
            print(f"    {key:<34} {n_calls:5d} {ms:8.3f} {n_syncs:4d}")
        kern = {}
        for e in ka:
            if getattr(e.device_type, "name", "") == "CUDA":
                kern[e.key] = kern.get(e.key, 0.0) + getattr(e, "self_device_time_total", 0) / 3 / 1e3
        print(f"{name}: top GPU kernels (ms per call):")
        for k, v in sorted(kern.items(), key=lambda kv: -kv[1])[:14]:
            print(f"    {v:7.3f}  {k[:110]}")


if __name__ == "__main__":
    main()
