"""Host time of one lattice conv call (issue 12: GPU training is host-bound), measured on the CPU.

    PYTHONPATH=python /usr/bin/python3 scripts/host_overhead.py                 # this checkout
    PYTHONPATH=python /usr/bin/python3 scripts/host_overhead.py --ref main      # A/B: main vs this checkout
    PYTHONPATH=python /usr/bin/python3 scripts/host_overhead.py --set lattice.ops.conv.PERMUTE_IN_NODE=False
    PYTHONPATH=python /usr/bin/python3 scripts/host_overhead.py --env LATTICE_SOMETHING=1

The workloads are small enough (64 rows, 16 channels) that the kernels are negligible and what is
timed is the Python and C++ host path around them -- the same Python that runs on CUDA:

* ``subm no-grad``: one ``lnn.SubmConv3d(16, 16, 3)`` call under ``torch.no_grad``;
* ``subm training``: the same call with autograd (weight and input features need a gradient),
  then ``backward`` of its features with a fixed gradient (forward + backward);
* ``unet no-grad`` / ``unet training``: a small U-Net (5 convs: submanifold, strided down,
  submanifold, transposed up onto the skip, 1x1 head; ReLUs and one skip concatenation), one
  inference call / one forward + backward of ``feats.square().sum()``.

Each number is microseconds per call: the median over repetitions of the time of a block of calls
divided by its length (and, as "best", the median of each process's fastest block: on a shared
machine the slow blocks are other work's, not the code's). An A/B interleaves its two sides: ``--ref`` and ``--env`` run the sides in
alternating subprocesses (``rounds`` of each, the order flipping every round; a ``--ref`` side runs
that git ref's ``python/lattice`` against this checkout's compiled extension, so only Python
differs), ``--set`` flips a module attribute between blocks in one process. Every side also hashes
its results (outputs and every gradient, bit for bit); the A/B says whether the hashes agree.

Lattice's kernels run on one thread here (``LATTICE_NUM_THREADS=1``, torch's too) unless the
environment says otherwise: on a busy 2-core machine OpenMP barriers are noise, not host time.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("subm no-grad", "subm training", "unet no-grad", "unet training")


# --------------------------------------------------------------------------------------------
# one side: build the workloads, hash their results, time blocks of calls
# --------------------------------------------------------------------------------------------
def _build() -> dict[str, Callable[[], Any]]:
    import numpy as np
    import torch

    import lattice
    import lattice.nn as lnn
    from lattice import ops

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n = 64
    pts = np.unique(rng.integers(0, 6, size=(3 * n, 3)), axis=0)[:n]
    coords = torch.from_numpy(np.concatenate([np.zeros((len(pts), 1), np.int64), pts], 1).astype(np.int32))
    feats = torch.randn(len(pts), 16)
    x = lattice.SparseTensor(coords, feats)
    xg = lattice.SparseTensor(coords, feats.clone().requires_grad_(True))
    conv = lnn.SubmConv3d(16, 16, 3, bias=True)
    gy = torch.randn(len(pts), 16)

    class TinyUNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc0 = lnn.SubmConv3d(16, 16, 3)
            self.down = lnn.Conv3d(16, 32, 2, stride=2)
            self.enc1 = lnn.SubmConv3d(32, 32, 3)
            self.up = lnn.ConvTranspose3d(32, 16, 2, stride=2)
            self.dec = lnn.SubmConv3d(32, 16, 3, bias=True)
            self.relu = lnn.ReLU()

        def forward(self, t: Any) -> Any:
            a = self.relu(self.enc0(t))
            b = self.relu(self.enc1(self.down(a)))
            u = self.up(b, coordinates=a)
            return self.relu(self.dec(ops.cat([a, u])))

    net = TinyUNet()

    def subm_nograd() -> Any:
        with torch.no_grad():
            return conv(x)

    def subm_training() -> Any:
        y = conv(xg)
        y.feats.backward(gy)
        return y

    def unet_nograd() -> Any:
        with torch.no_grad():
            return net(x)

    def unet_training() -> Any:
        y = net(xg)
        y.feats.square().sum().backward()
        return y

    fns = {"subm no-grad": subm_nograd, "subm training": subm_training, "unet no-grad": unet_nograd,
           "unet training": unet_training}
    params = [xg.feats, *conv.parameters(), *net.parameters()]
    return {"fns": fns, "params": params}


def _digest(built: dict[str, Any]) -> str:
    """sha256 over every workload's output features and every gradient after one call of each."""
    import torch

    h = hashlib.sha256()
    for p in built["params"]:
        p.grad = None
    for name in WORKLOADS:
        y = built["fns"][name]()
        h.update(name.encode())
        h.update(y.feats.detach().contiguous().numpy().tobytes())
        for p in built["params"]:
            if p.grad is not None:
                h.update(p.grad.contiguous().numpy().tobytes())
                p.grad = None
        h.update(str(torch.get_default_dtype()).encode())
    return h.hexdigest()


def _block(fn: Callable[[], Any], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e6 * (time.perf_counter() - t) / calls


def _calls(name: str) -> int:
    return {"subm no-grad": 400, "subm training": 100, "unet no-grad": 60, "unet training": 20}[name]


def _set_attr(spec: str) -> tuple[Any, str, Any, Any]:
    """'pkg.module.ATTR=VALUE' -> (module, attr, old value, new value) (VALUE: a Python literal)."""
    import ast

    path, value = spec.split("=", 1)
    mod_name, attr = path.rsplit(".", 1)
    mod = importlib.import_module(mod_name)
    return mod, attr, getattr(mod, attr), ast.literal_eval(value)


def worker(blocks: int, sets: list[str]) -> dict[str, Any]:
    """One side (or, with ``sets``, both sides interleaved block by block): µs-per-call samples."""
    built = _build()
    fns = built["fns"]
    flips = [_set_attr(s) for s in sets]

    def side(b: bool) -> None:
        for mod, attr, old, new in flips:
            setattr(mod, attr, new if b else old)

    sides = (False, True) if flips else (False,)
    out: dict[str, Any] = {"samples": {s: {w: [] for w in WORKLOADS} for s in ("A", "B")}, "digest": {}}
    for b in sides:
        side(b)
        out["digest"]["B" if b else "A"] = _digest(built)
    for name in WORKLOADS:  # warm-up (relation cache, weight caches, allocator)
        for b in sides:
            side(b)
            _block(fns[name], max(1, _calls(name) // 4))
    for r in range(blocks):
        for name in WORKLOADS:
            order = sides if r % 2 == 0 else tuple(reversed(sides))
            for b in order:
                side(b)
                out["samples"]["B" if b else "A"][name].append(_block(fns[name], _calls(name)))
    side(False)
    for p in built["params"]:
        p.grad = None
    return out


# --------------------------------------------------------------------------------------------
# the driver: sides in subprocesses (--ref / --env) or in one process (--set)
# --------------------------------------------------------------------------------------------
def _extension_dir() -> str:
    if os.environ.get("LATTICE_EXTENSION_DIR"):
        return os.environ["LATTICE_EXTENSION_DIR"]
    import lattice._core as c

    return os.path.dirname(c.core.__file__)


def _export_ref(ref: str, dest: str) -> str:
    """``ref``'s python/lattice under dest/python (git archive: no worktree, no checkout)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "python/lattice"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    return os.path.join(dest, "python")


def _run_side(pythonpath: str, env_extra: dict[str, str], blocks: int) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--blocks", str(blocks)],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", help="A side: this git ref's python/lattice (B: this checkout)")
    ap.add_argument("--env", action="append", default=[], help="B side only: VAR=VALUE (repeatable)")
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="B side only: module.ATTR=literal, flipped in-process between blocks (repeatable)")
    ap.add_argument("--rounds", type=int, default=16, help="subprocess rounds per side (--ref / --env)")
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks per workload and side in one process")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the raw samples here")
    args = ap.parse_args()
    os.environ.setdefault("LATTICE_NUM_THREADS", "1")
    if args.worker:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(worker(args.blocks, args.sets)))
        return
    mine = os.path.join(ROOT, "python")
    samples: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in ("A", "B")}
    best: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in ("A", "B")}
    digests: dict[str, set[str]] = {"A": set(), "B": set()}
    ab = bool(args.ref or args.env)
    tmp = tempfile.mkdtemp(prefix="host_overhead_") if args.ref else None
    try:
        env_ext = {"LATTICE_EXTENSION_DIR": _extension_dir()}
        path_a = _export_ref(args.ref, tmp) if args.ref else mine
        env_b = dict(env_ext, **dict(e.split("=", 1) for e in args.env))
        if ab:
            for r in range(args.rounds):
                order = ("A", "B") if r % 2 == 0 else ("B", "A")
                for s in order:
                    res = _run_side(path_a if s == "A" else mine, env_ext if s == "A" else env_b, args.blocks)
                    digests[s].add(res["digest"]["A"])
                    for w in WORKLOADS:
                        samples[s][w].append(statistics.median(res["samples"]["A"][w]))
                        best[s][w].append(min(res["samples"]["A"][w]))
        else:
            res = _run_side(mine, env_ext, args.blocks) if not args.sets else None
            if args.sets:
                os.environ.update(env_ext)
                sys.path.insert(0, mine)
                import torch

                torch.set_num_threads(1)
                res = worker(args.blocks, args.sets)
            assert res is not None
            for s in ("A", "B") if args.sets else ("A",):
                digests[s].add(res["digest"][s])
                for w in WORKLOADS:
                    samples[s][w] = res["samples"][s][w]
                    best[s][w] = [min(res["samples"][s][w])]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    two = ab or bool(args.sets)
    label_a = args.ref if args.ref else ("default" if two else "this checkout")
    label_b = "this checkout" if args.ref else " ".join(args.env + args.sets)
    print(f"host time per call, us: median over {'rounds of each process' if ab else 'blocks'}'s median block "
          f"(best: median of each process's fastest block); LATTICE_NUM_THREADS={os.environ['LATTICE_NUM_THREADS']}")
    med = {s: {w: statistics.median(samples[s][w]) for w in WORKLOADS} for s in ("A", "B") if samples[s][WORKLOADS[0]]}
    top = {s: {w: statistics.median(best[s][w]) for w in WORKLOADS} for s in ("A", "B") if best[s][WORKLOADS[0]]}
    if two:
        print(f"A = {label_a}   B = {label_b}")
        print(f"{'workload':<16}{'A':>9}{'B':>9}{'B/A':>7}   {'A best':>9}{'B best':>9}{'B/A':>7}")
        for w in WORKLOADS:
            a, b, ta, tb = med["A"][w], med["B"][w], top["A"][w], top["B"][w]
            print(f"{w:<16}{a:>9.1f}{b:>9.1f}{b / a:>7.2f}   {ta:>9.1f}{tb:>9.1f}{tb / ta:>7.2f}")
        same = len(digests["A"]) == 1 and digests["A"] == digests["B"]
        print("results bitwise equal (outputs and gradients, sha256):", "yes" if same else
              f"NO (A {sorted(digests['A'])}, B {sorted(digests['B'])})")
    else:
        print(f"{'workload':<16}{'us':>9}{'best':>9}")
        for w in WORKLOADS:
            print(f"{w:<16}{med['A'][w]:>9.1f}{top['A'][w]:>9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "best": best, "digests": {k: sorted(v) for k, v in digests.items()}}, f)


if __name__ == "__main__":
    main()
