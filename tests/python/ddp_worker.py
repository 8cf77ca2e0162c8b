"""One rank of the two-process DistributedDataParallel runs of tests/python/test_distributed.py.

Run as ``python3 ddp_worker.py SCENARIO[,SCENARIO] RANK WORLD INIT_FILE OUT_DIR`` (the test starts one per rank
with subprocess and hard timeouts); it joins a gloo process group through ``file://INIT_FILE`` and
writes its results under OUT_DIR (``<scenario>_rank<r>.pt`` / ``.json``). The data and model
helpers are imported by the test too, so the single-process references use exactly the same
batch, initialisation and loss.

Scenarios:

* ``step``: one DDP step (SGD) of MinkUNet18 in float64 on half of a 4-sample batch per rank, with
  SyncBatchNorm (``sync``) and with per-rank BatchNorm (``plain``); saves gradients, updated
  parameters and buffers, and whether the module received the caller's SparseTensor object.
* ``models``: every ``lattice.models`` network (SyncBatchNorm-converted, float32) for two DDP
  steps with ``find_unused_parameters=False``; records parameters without a gradient, errors, and
  a digest of the parameters after the steps (equal on both ranks if DDP averaged the gradients).
  A control network with an unused parameter must fail; ``find_unused_parameters=True`` with a
  SparseTensor output is recorded as it behaves, and the documented workaround (return tensors)
  must work.
* ``bn``: :class:`lattice.nn.SyncBatchNorm` alone on (N, 6) float64 features split unevenly over
  the ranks (one case with an empty rank; momentum None, affine False, untracked statistics), two
  training steps: outputs, gradients, buffers.
* ``raise``: rank 1 raises before its first forward; rank 0 runs the step and must fail (peer
  gone or collective timeout), not hang.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import lattice
from lattice import models
from lattice import nn as lnn
from lattice.data import sparse_collate_fn

CLASSES = 5
C_IN = 4
LR = 0.1
PG_TIMEOUT_S = 20  # collective timeout of the process group (the "raise" scenario relies on it at worst)


# ---- data, model, loss (shared with the test's single-process references) -----------------------


def make_samples(seed: int, n: int = 4, dtype: torch.dtype = torch.float64) -> list[dict]:
    """``n`` dict samples (coords (M, 3) int32 clustered in a 32^3 box, feats (M, 4), labels (M,)).
    Voxel counts differ per sample, so the two halves of the batch have different row counts."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        centres = rng.integers(4, 28, size=(6, 3))
        pts = centres[rng.integers(0, 6, 500)] + rng.integers(-4, 5, size=(500, 3))
        coords = np.unique(pts, axis=0)[: int(rng.integers(180, 300))]
        m = coords.shape[0]
        out.append({"coords": torch.from_numpy(coords.astype(np.int32)),
                    "feats": torch.from_numpy(rng.standard_normal((m, C_IN))).to(dtype),
                    "labels": torch.from_numpy(rng.integers(0, CLASSES, m)).long()})
    return out


def make_model(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(1234)
    return models.MinkUNet18(C_IN, CLASSES, cr=0.125).to(dtype)


def ce_sum(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return F.cross_entropy(model(batch["input"]).feats, batch["labels"], reduction="sum")


class Probe(torch.nn.Module):
    """Records the object the wrapped model receives (DDP must hand over the caller's SparseTensor)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.received: list = []

    def forward(self, x):  # type: ignore[no-untyped-def]
        self.received.append(x)
        return self.model(x)


def tree(module: torch.nn.Module, prefix: str = "") -> dict:
    """Parameters, gradients and buffers by name (copies), names without ``prefix``."""
    cut = len(prefix)
    return {"params": {n[cut:]: p.detach().clone() for n, p in module.named_parameters()},
            "grads": {n[cut:]: (None if p.grad is None else p.grad.detach().clone()) for n, p in module.named_parameters()},
            "buffers": {n[cut:]: b.detach().clone() for n, b in module.named_buffers()}}


# ---- scenarios ------------------------------------------------------------------------------------


def scenario_step(rank: int, world: int, out_dir: str) -> None:
    samples = make_samples(0)
    half = len(samples) // world
    local = sparse_collate_fn(samples[rank * half:(rank + 1) * half])
    n_total = sum(int(s["labels"].numel()) for s in samples)
    results = {}
    for mode in ("sync", "plain"):
        model = make_model()
        if mode == "sync":
            model = lnn.convert_sync_batchnorm(model)
        probe = Probe(model)
        ddp = torch.nn.parallel.DistributedDataParallel(probe, find_unused_parameters=False)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        # DDP averages gradients over ranks; scaling the local sum by world / N makes the average
        # the gradient of the whole batch's mean loss, also with unequal rows per rank
        loss = ce_sum(ddp, local) * world / n_total
        loss.backward()
        grads = tree(model)["grads"]
        opt.step()
        t = tree(model)
        results[mode] = {"grads": grads, "params": t["params"], "buffers": t["buffers"], "loss": loss.detach(),
                         "same_object": len(probe.received) == 1 and probe.received[0] is local["input"],
                         "bn_types": sorted({type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__})}
    torch.save(results, os.path.join(out_dir, f"step_rank{rank}.pt"))


BN_CASES = {  # name: (SyncBatchNorm kwargs, rows of rank 0, rows of rank 1)
    "default": ({}, 37, 23),
    "momentum_none": ({"momentum": None}, 30, 30),
    "affine_false": ({"affine": False}, 11, 40),
    "untracked": ({"track_running_stats": False}, 25, 9),
    "rank1_empty": ({}, 41, 0),
}


def bn_case_data(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features of both ranks concatenated (N, 6) float64, upstream weights R (N, 6), initial
    running mean) for a SyncBatchNorm case; rank 0 holds the first rows."""
    g = torch.Generator().manual_seed(len(name))
    n = BN_CASES[name][1] + BN_CASES[name][2]
    return (torch.randn(n, 6, generator=g, dtype=torch.float64) * 3 + 1, torch.randn(n, 6, generator=g, dtype=torch.float64),
            torch.randn(6, generator=g, dtype=torch.float64))


def scenario_bn(rank: int, world: int, out_dir: str) -> None:
    """lattice.nn.SyncBatchNorm alone, two training steps per case (loss sum(y * R)): outputs,
    input / weight / bias gradients and buffers of each rank."""
    results = {}
    for name, (kwargs, n0, n1) in BN_CASES.items():
        feats, r, rm = bn_case_data(name)
        lo, hi = (0, n0) if rank == 0 else (n0, n0 + n1)
        bn = lnn.SyncBatchNorm(6, **kwargs).double()
        if bn.running_mean is not None:
            bn.running_mean.copy_(rm)
        if bn.weight is not None:
            with torch.no_grad():
                bn.weight.copy_(torch.linspace(0.5, 2.0, 6))
                bn.bias.copy_(torch.linspace(-1.0, 1.0, 6))
        coords = torch.zeros(hi - lo, 4, dtype=torch.int32)
        coords[:, 1] = torch.arange(hi - lo, dtype=torch.int32)
        steps = []
        for step in range(2):
            x = feats[lo:hi].clone().requires_grad_(True)
            y = bn(lattice.SparseTensor(coords, x * (step + 1)))
            (y.feats * r[lo:hi]).sum().backward()
            steps.append({"y": y.feats.detach(), "dx": x.grad,
                          "dw": None if bn.weight is None else bn.weight.grad.clone(),
                          "db": None if bn.bias is None else bn.bias.grad.clone(),
                          "buffers": {k: v.clone() for k, v in bn.state_dict().items()}})
            if bn.weight is not None:
                bn.weight.grad = bn.bias.grad = None
        results[name] = steps
    torch.save(results, os.path.join(out_dir, f"bn_rank{rank}.pt"))


class _Unused(torch.nn.Module):
    """Control: a network with a parameter that never enters the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = models.MinkUNet18(C_IN, CLASSES, cr=0.125)
        self.unused = torch.nn.Linear(3, 3)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.net(x)


class _Tensors(torch.nn.Module):
    """The documented workaround for find_unused_parameters=True: return tensors, not a SparseTensor."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.net(x).feats


def _network_loss(name: str, out) -> torch.Tensor:  # type: ignore[no-untyped-def]
    if name == "VoxelBackBone8x":
        return out["bev"].square().mean()
    if isinstance(out, list):  # SparseResNet21D: every stage output
        return sum(o.feats.square().mean() for o in out)
    return (out if isinstance(out, torch.Tensor) else out.feats).square().mean()


def _networks() -> dict:
    return {
        "MinkUNet18": lambda: models.MinkUNet18(C_IN, CLASSES, cr=0.125),
        "MinkUNet34": lambda: models.MinkUNet34(C_IN, CLASSES, cr=0.125),
        "MinkUNet42": lambda: models.MinkUNet42(C_IN, CLASSES, cr=0.125),
        "SparseResNet21D": lambda: models.SparseResNet21D(in_channels=C_IN, width_multiplier=0.25),
        "VoxelBackBone8x": lambda: models.VoxelBackBone8x(C_IN),
        "control_unused_parameter": _Unused,
        "find_unused_true_sparse_output": lambda: models.MinkUNet18(C_IN, CLASSES, cr=0.125),
        "find_unused_true_tensor_output": lambda: _Tensors(models.MinkUNet18(C_IN, CLASSES, cr=0.125)),
    }


def scenario_models(rank: int, world: int, out_dir: str) -> None:
    report = {}
    for name, build in _networks().items():
        torch.manual_seed(7)
        model = lnn.convert_sync_batchnorm(build())
        find_unused = name.startswith("find_unused_true")
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        entry: dict = {"no_grad_after_step1": None, "error": None, "digest": None}
        try:
            for step in range(2):
                batch = sparse_collate_fn(make_samples(100 + 10 * step + rank, n=2, dtype=torch.float32))
                opt.zero_grad(set_to_none=True)
                out = ddp(batch["input"], (32, 32, 41)) if name == "VoxelBackBone8x" else ddp(batch["input"])
                _network_loss(name, out).backward()
                if step == 0:
                    entry["no_grad_after_step1"] = [n for n, p in model.named_parameters() if p.grad is None]
                opt.step()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()
            entry["digest"] = hashlib.sha256(flat).hexdigest()
        except Exception as e:  # recorded; the test decides which networks may fail
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        report[name] = entry
        dist.barrier()  # a failing control leaves no collective half-done for the next network
    with open(os.path.join(out_dir, f"models_rank{rank}.json"), "w") as f:
        json.dump(report, f)


def scenario_raise(rank: int, world: int, out_dir: str) -> None:
    model = lnn.convert_sync_batchnorm(make_model(torch.float32))
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=False)
    batch = sparse_collate_fn(make_samples(5, n=2, dtype=torch.float32))
    if rank == 1:
        raise RuntimeError("injected failure on rank 1")
    ce_sum(ddp, batch).backward()  # needs rank 1 (SyncBatchNorm statistics, gradient all-reduce)
    dist.barrier()
    with open(os.path.join(out_dir, "raise_rank0_finished"), "w") as f:  # must never be written
        f.write("rank 0 completed a step without rank 1\n")


def main(argv: list[str]) -> int:
    scenario, rank, world, init_file, out_dir = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    torch.set_num_threads(1)  # two ranks share two cores
    lattice.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    try:
        for name in scenario.split(","):  # "step,models": both in one launch (one interpreter start-up)
            {"step": scenario_step, "models": scenario_models, "bn": scenario_bn, "raise": scenario_raise}[name](rank, world, out_dir)
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)  # do not wait in the process group's destructor for a peer that is gone
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
