"""Phase profile of lattice.models.MinkUNet42 on the CPU (issue 17).

    PYTHONPATH=python /usr/bin/python3 scripts/profile_minkunet_cpu.py [--reps 3] [--json out.json]

Times one inference (eval, no_grad) and one training step (train, forward + backward of
``F.sum()``) on the SemanticKITTI scan of ../shared/bench/workloads.py, a fresh SparseTensor each
time (as cpu_side_by_side.sh does), split into phases by wrapping the Python entry points:

* ``index``: SparseTensor construction (the coordinate index of the input);
* ``relation``: ``core.plan_conv`` (relation building, or the cache lookup);
* ``conv fwd``: ``core.conv_forward``;
* ``input grad`` / ``weight grad``: ``core.conv_backward`` asked for one gradient at a time (the
  profiled backward calls the core twice; the sum equals the one-call backward up to the bias
  gradient, which rides with the weight gradient). ``input grad`` includes the lazy input-side
  grouping of the relation the first time a relation is differentiated; ``--split-grouping``
  runs the input pass twice and reports the first-minus-second difference as ``grouping``;
* ``bn`` / ``relu`` / ``cat`` / ``add``: the torch work between layers (forward and, for the
  training step, its autograd backward, measured with torch.profiler-free wall clocks around
  the module calls; the backward share of torch ops is the remainder of backward time not spent
  in conv_backward);
* ``other``: the rest of the wall time (Python, autograd bookkeeping, allocation).

The wrappers cost a few microseconds per call (~200 calls per step), negligible next to the
phases. Medians over ``--reps`` runs after one warm-up. ``--clock cpu`` times with the process CPU
time instead of the wall clock (use it with ``LATTICE_NUM_THREADS=1`` for A/B runs on a shared
machine: the wall time of a process that other jobs deschedule is mostly their load);
``--torch-threads n`` sets torch's intra-op threads first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np
import torch

sys.path.insert(0, os.environ.get("LATTICE_BENCH_DIR", "/work/shared/bench"))
import workloads as W  # noqa: E402

import lattice  # noqa: E402
import lattice.autograd as la  # noqa: E402
import lattice.nn as lnn  # noqa: E402
from lattice import _core  # noqa: E402
from lattice.models import MinkUNet42  # noqa: E402

T = defaultdict(float)
CLOCK = [time.perf_counter]  # --clock cpu: time.process_time (CPU time of all threads)
LAYERS: list = []  # (pass, C_in, C_out, K, edges, seconds) per core call, when --layers
RECORD = [False]
SHAPE = [None]


DEPTH = defaultdict(int)


def timed(name, fn):
    """fn, its wall time added to phase `name` (only the outermost of nested calls of one phase)."""
    def wrapper(*a, **k):
        if DEPTH[name]:
            return fn(*a, **k)
        DEPTH[name] += 1
        t = CLOCK[0]()
        try:
            return fn(*a, **k)
        finally:
            T[name] += CLOCK[0]() - t
            DEPTH[name] -= 1
    return wrapper


def install(split_grouping: bool) -> None:
    import lattice.ops.conv as oc
    mod_core = oc.core
    mod_core_plan = mod_core.plan_conv
    oc.core = type("C", (), {})()
    for name in dir(mod_core):
        if not name.startswith("__"):
            setattr(oc.core, name, getattr(mod_core, name))
    oc.core.plan_conv = timed("relation", mod_core_plan)
    acore = la.core
    fwd, bwd = acore.conv_forward, acore.conv_backward
    shim = type("C", (), {})()
    for name in dir(acore):
        if not name.startswith("__"):
            setattr(shim, name, getattr(acore, name))
    def conv_forward(plan, x, w, b, *rest):
        t = CLOCK[0]()
        y = fwd(plan, x, w, b, *rest)
        dt = CLOCK[0]() - t
        T["conv fwd"] += dt
        if RECORD[0]:
            r = plan.relation
            LAYERS.append(("fwd", r.kernel_volume, r.n_out, r.n_edges, dt, SHAPE[0]))
        return y
    shim.conv_forward = conv_forward
    orig_apply = la.ConvFunction.apply

    def apply(feats, weight, bias, plan, *rest):
        SHAPE[0] = tuple(weight.shape)
        return orig_apply(feats, weight, bias, plan, *rest)
    import lattice.ops.conv as oc2
    oc2.ConvFunction = type("ConvFunction", (), {"apply": staticmethod(apply)})

    from lattice._core import borrow, from_core

    def backward(ctx, grad_out):  # ConvFunction.backward, one gradient per core call
        feats, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        if not (need_x or need_w or need_b):
            return None, None, None, None, None, None
        dy = grad_out.contiguous()

        def call(nx, nw, nb):  # fresh capsules per core call (a capsule is consumed once)
            w = ctx.weight_core if ctx.weight_core is not None else borrow(weight)
            return bwd(ctx.plan, borrow(feats), w, borrow(dy), nx, nw, nb, *ctx.weight_form)
        dx = dw = db = None
        if need_x:
            t = CLOCK[0]()
            dx, _, _ = call(True, False, False)
            first = CLOCK[0]() - t
            if RECORD[0]:
                r = ctx.plan.relation
                LAYERS.append(("dx", r.kernel_volume, r.n_out, r.n_edges, first, tuple(weight.shape)))
            if split_grouping:
                t = CLOCK[0]()
                dx, _, _ = call(True, False, False)
                second = CLOCK[0]() - t
                T["input grad"] += second
                T["grouping"] += max(first - second, 0.0)
                T["_extra"] += second  # the duplicated call, removed from the wall time
            else:
                T["input grad"] += first
        if need_w or need_b:
            t = CLOCK[0]()
            _, dw, db = call(False, bool(need_w), bool(need_b))
            T["weight grad"] += CLOCK[0]() - t
            if RECORD[0]:
                r = ctx.plan.relation
                LAYERS.append(("dw", r.kernel_volume, r.n_out, r.n_edges, CLOCK[0]() - t,
                               tuple(weight.shape)))
        if dw is not None:
            dw = from_core(dw)
            if ctx.torch_form is not None:  # as ConvFunction.backward: the parameter's layout and dtype
                dtype, dense_shape = ctx.torch_form
                dw = dw.to(dtype)
                if dense_shape is not None:
                    dw = dw.view(*dense_shape[1:], dense_shape[0]).permute(4, 0, 1, 2, 3)
        return (from_core(dx) if dx is not None else None, dw,
                from_core(db) if db is not None else None, None, None, None)
    la.ConvFunction.backward = staticmethod(backward)
    la.core = shim
    lnn.BatchNorm.forward = timed("bn", lnn.BatchNorm.forward)
    lnn.ReLU.forward = timed("relu", lnn.ReLU.forward)
    import lattice.ops.features as of
    import lattice.models.blocks as mb
    import lattice.models.minkunet as mm
    cat = timed("cat", of.cat)
    of.cat = cat
    lattice.ops.cat = cat
    # the residual blocks' batch norm + ReLU (and + skip) run as one lattice op on the CPU
    # (blocks.py: batch_norm_relu, batch_norm_add_relu): timed as 'bn', which thus includes the
    # residual add and the ReLUs they fuse; 'add' is what stays outside (nothing, when fused)
    lnn.features.batch_norm_relu = timed("bn", lnn.features.batch_norm_relu)
    lnn.features.batch_norm_add_relu = timed("bn", lnn.features.batch_norm_add_relu)
    orig_init = lattice.SparseTensor.__init__
    lattice.SparseTensor.__init__ = timed("index", orig_init)


def run(reps: int, split_grouping: bool) -> dict:
    c = W.WORKLOADS["kitti"]()
    coords = torch.from_numpy(c).int()
    feats = torch.randn(len(c), 4)
    torch.manual_seed(0)
    model = MinkUNet42()
    out = {"N": len(c), "lattice_threads": lattice.get_num_threads(),
           "torch_threads": torch.get_num_threads()}

    def inf():
        model.eval()
        with torch.no_grad():
            model(lattice.SparseTensor(coords, feats))

    def step():
        model.train()
        y = model(lattice.SparseTensor(coords, feats))
        T["_fwd_end"] = CLOCK[0]()
        y.F.sum().backward()
        T["_bwd_end"] = CLOCK[0]()

    for name, fn in (("inference", inf), ("train_step", step)):
        fn()
        rows = []
        for _ in range(reps):
            T.clear()
            t0 = CLOCK[0]()
            fn()
            wall = CLOCK[0]() - t0 - T.pop("_extra", 0.0)
            fwd_end = T.pop("_fwd_end", None)
            T.pop("_bwd_end", None)
            row = dict(T)
            row["wall"] = wall
            if fwd_end is not None:
                row["forward wall"] = fwd_end - t0
                row["backward wall"] = wall - row["forward wall"]
            rows.append(row)
        keys = sorted({k for r in rows for k in r})
        med = {k: float(np.median([r.get(k, 0.0) for r in rows])) * 1e3 for k in keys}
        fwd_parts = ("index", "relation", "conv fwd", "bn", "relu", "cat", "add")
        bwd_parts = ("input grad", "weight grad", "grouping")
        if "forward wall" in med:
            med["other fwd"] = med["forward wall"] - sum(med.get(k, 0.0) for k in fwd_parts)
            # torch backward of bn/relu/cat/add + autograd engine + Python of the backward
            med["torch bwd + other"] = med["backward wall"] - sum(med.get(k, 0.0) for k in bwd_parts)
        else:
            med["other fwd"] = med["wall"] - sum(med.get(k, 0.0) for k in fwd_parts)
        out[name] = med
    return out


def layer_table() -> None:
    """One training step, every conv core call: GFLOP/s = 2 * edges * C_in * C_out / time."""
    c = W.WORKLOADS["kitti"]()
    coords = torch.from_numpy(c).int()
    feats = torch.randn(len(c), 4)
    model = MinkUNet42().train()
    model(lattice.SparseTensor(coords, feats)).F.sum().backward()
    LAYERS.clear()
    RECORD[0] = True
    model(lattice.SparseTensor(coords, feats)).F.sum().backward()
    RECORD[0] = False
    agg = defaultdict(lambda: [0, 0.0, 0.0])
    for kind, K, n_out, E, dt, extra in LAYERS:
        shape = extra
        agg_key = (kind, K, E, shape)
        a = agg[agg_key]
        a[0] += 1
        a[1] += dt
        a[2] = shape
    print(f"{'pass':4s} {'K':>3s} {'edges':>9s} {'calls':>5s} {'ms':>8s} {'GFLOP/s':>8s}  weight shape")
    for (kind, K, E, _), (n, dt, shape) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        gf = 2 * E * int(np.prod(shape)) / K * n / dt / 1e9 if shape else float("nan")
        print(f"{kind:4s} {K:3d} {E:9d} {n:5d} {dt * 1e3:8.1f} {gf:8.1f}  {shape}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--split-grouping", action="store_true")
    ap.add_argument("--layers", action="store_true", help="per-call table of the last training step")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch.set_num_threads(n) before running (default: leave torch's count alone)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: perf_counter; cpu: process CPU time (all threads; with LATTICE_NUM_THREADS=1 a "
                         "measure of work that a loaded machine disturbs far less than wall time)")
    args = ap.parse_args()
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    install(args.split_grouping)
    res = run(args.reps, args.split_grouping)
    if args.layers:
        layer_table()
    print(json.dumps(res, indent=1))
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
