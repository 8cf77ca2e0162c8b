#!/usr/bin/env python3
"""Distributed training of a lattice segmentation network with PyTorch's DistributedDataParallel.

One process per device, launched by ``torchrun`` (docs/distributed.md has the commands):

    python3 examples/train_ddp.py --make-scans 16 --data /tmp/scans            # synthetic scans (once)
    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py --data /tmp/scans --epochs 2   # CPU, gloo
    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py --data DIR --device cuda    # 2 GPUs, nccl

What each rank does:

* process group: ``--backend auto`` = nccl when ``--device`` is cuda, gloo on CPU; rendezvous
  through torchrun's environment (``--dist-url env://``) or any ``init_method`` (``file://...``);
* data: :class:`lattice.data.ScanFolder` (KITTI ``.bin`` + SemanticKITTI ``.label``, LAS, PCD,
  PLY) -> ``DistributedSampler`` (shuffled with ``--seed``, ``set_epoch`` every epoch, so the
  order is a function of (seed, epoch, world size) only; every rank gets the same number of
  batches) -> ``DataLoader(collate_fn=lattice.data.sparse_collate_fn)``. Augmentation is seeded per
  (seed, epoch, sample index) by ScanFolder, so it does not depend on the rank or the worker;
  torch / numpy are seeded per rank (``seed + rank``) and DataLoader workers per (rank, worker);
* model: ``lattice.models.MinkUNet18/34/42``, identical initialisation on every rank (``seed``),
  BatchNorm -> SyncBatchNorm (``lattice.nn.convert_sync_batchnorm``; ``--no-sync-bn`` keeps
  per-rank statistics), ``DistributedDataParallel(find_unused_parameters=False)``. DDP passes the
  SparseTensor through unchanged (it only moves plain tensors / lists / dicts to ``device_ids``),
  so the batch is moved with ``.to(device)`` before the call;
* loss: cross-entropy summed over the labelled voxels of the rank, times world size / the global
  number of labelled voxels (one all-reduce), so DDP's gradient average is the gradient of the
  mean loss over the whole global batch, whatever the voxel count of each rank;
* checkpoints (rank 0 writes, atomically): ``--checkpoint-dir``/``last.pt`` at the end of every epoch
  and every ``--checkpoint-every`` steps (``step_NNNNNN.pt`` too with ``--keep-checkpoints``):
  model, optimizer, position (epoch, batch in epoch, global step), the RNG states of every rank
  and the arguments. ``--resume PATH`` (or ``auto``: ``last.pt`` when it exists) is read by rank 0
  and broadcast, so no shared file system is needed; a mid-epoch checkpoint resumes at the next
  batch of the same epoch order. With the same world size the resumed run's losses are bitwise
  those of an uninterrupted run (gloo, 2 ranks; tested in tests/python/test_distributed.py);
* a progress line per epoch on rank 0 (loss, voxel accuracy, throughput); ``--log-json`` writes
  every step (loss and the sample indices of every rank).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

import lattice
from lattice import models
from lattice import nn as lnn
from lattice.data import IGNORE_LABEL, ScanFolder, sparse_collate_fn

MODELS = {"MinkUNet18": models.MinkUNet18, "MinkUNet34": models.MinkUNet34, "MinkUNet42": models.MinkUNet42}
# synthetic scan classes (ground, structure, vehicle, pole) -> SemanticKITTI raw ids (road, building, car, pole)
_SYNTHETIC_TO_RAW = np.array([40, 50, 10, 80], dtype=np.uint32)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="folder of scans (ScanFolder)")
    p.add_argument("--make-scans", type=int, default=0, metavar="N",
                   help="write N synthetic KITTI scans + SemanticKITTI labels into --data and exit (no torchrun)")
    p.add_argument("--scan-points", type=int, default=4000, help="points per synthetic scan (--make-scans)")
    p.add_argument("--model", choices=sorted(MODELS), default="MinkUNet42")
    p.add_argument("--cr", type=float, default=0.5, help="width multiplier")
    p.add_argument("--num-classes", type=int, default=19)
    p.add_argument("--voxel-size", type=float, default=0.1, help="metres")
    p.add_argument("--no-augment", dest="augment", action="store_false", help="no rotation / scaling")
    p.add_argument("--batch-size", type=int, default=2, help="scans per rank and step")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda when available")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="auto: nccl on cuda, else gloo")
    p.add_argument("--dist-url", default="env://", help="init_method (torchrun: env://; tests: file://PATH)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="collective timeout of the process group")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: cores / local ranks)")
    p.add_argument("--no-sync-bn", dest="sync_bn", action="store_false", help="per-rank BatchNorm statistics")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS", help="also checkpoint every STEPS steps")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep step_NNNNNN.pt besides last.pt")
    p.add_argument("--resume", default=None, help="checkpoint to resume from ('auto': <checkpoint-dir>/last.pt if any)")
    p.add_argument("--log-json", default=None, help="rank 0 writes every step's record here")
    return p.parse_args(argv)


# ---- synthetic scans ----------------------------------------------------------------------------


def make_scans(folder: str, n: int, points: int) -> None:
    """``n`` ray-cast street scans (lattice's demo scanner, a different street per seed) as KITTI
    ``.bin`` (float32 x, y, z, reflectance) with SemanticKITTI ``.label`` files (uint32 raw ids)."""
    from lattice._demo_data import crop_nearest, synthetic_scan

    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        scan = crop_nearest(synthetic_scan(seed=i, azimuth_steps=360), points)
        stem = os.path.join(folder, f"{i:06d}")
        scan.points.astype(np.float32).tofile(stem + ".bin")
        _SYNTHETIC_TO_RAW[scan.labels].tofile(stem + ".label")
    print(f"wrote {n} scans ({points} points each) to {folder}")


# ---- distributed set-up ---------------------------------------------------------------------------


def setup(args: argparse.Namespace) -> tuple[int, int, int, torch.device]:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if local_rank >= torch.cuda.device_count():  # else NCCL would wait for a rank that cannot start
            raise SystemExit(f"[train_ddp] LOCAL_RANK: expected < {torch.cuda.device_count()} (one process per GPU; "
                             f"use --device cpu or fewer processes per node), got {local_rank}")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, local_world))
        torch.set_num_threads(threads)
        lattice.set_num_threads(threads)
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise SystemExit("[train_ddp] --backend: expected gloo for CPU training, got nccl (use --device cuda)")
    kwargs: dict[str, Any] = {"backend": backend, "init_method": args.dist_url,
                              "timeout": datetime.timedelta(seconds=args.timeout_s)}
    if not args.dist_url.startswith("env://"):
        kwargs.update(rank=rank, world_size=world)
    dist.init_process_group(**kwargs)
    return dist.get_rank(), dist.get_world_size(), local_rank, device


class ResumableSampler(torch.utils.data.Sampler):
    """The indices of a ``DistributedSampler`` for the current epoch, minus the first ``skip``
    (the batches a mid-epoch checkpoint already consumed)."""

    def __init__(self, sampler: torch.utils.data.distributed.DistributedSampler) -> None:
        self.sampler, self.skip = sampler, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.sampler)[self.skip:])

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


def _tagged_collate(samples: list[dict]) -> dict:
    batch = sparse_collate_fn(samples)
    batch["index"] = [int(s["index"]) for s in samples]
    return batch


class IndexedScans(torch.utils.data.Dataset):
    """ScanFolder samples with their index (logged, so the sampling order can be checked)."""

    def __init__(self, folder: ScanFolder) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> dict:
        sample = {k: v for k, v in self.folder[i].items() if k in ("coords", "feats", "labels")}
        sample["index"] = i
        return sample


# ---- checkpoints ----------------------------------------------------------------------------------


def save_checkpoint(path: str, model: torch.nn.Module, opt: torch.optim.Optimizer, position: dict,
                    args: argparse.Namespace, rng_states: list) -> None:
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "position": position,
             "rng": rng_states, "args": vars(args), "lattice": lattice.__version__}
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a truncated checkpoint


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None}


def load_checkpoint(path: Optional[str], rank: int) -> Optional[dict]:
    """Rank 0 reads ``path``; every rank gets the same object (broadcast, no shared disk needed)."""
    box = [None]
    if rank == 0 and path:
        box[0] = torch.load(path, map_location="cpu")
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---- training -------------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> None:
    rank, world, local_rank, device = setup(args)
    torch.manual_seed(args.seed + rank)
    np.random.seed((args.seed + rank) % 2**32)

    folder = ScanFolder(args.data, args.voxel_size, augment=args.augment, seed=args.seed)
    dataset = IndexedScans(folder)
    dsampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                               shuffle=True, seed=args.seed)
    sampler = ResumableSampler(dsampler)

    def worker_init(worker_id: int) -> None:
        torch.manual_seed(args.seed * 100003 + rank * 1009 + worker_id)
        np.random.seed((args.seed * 100003 + rank * 1009 + worker_id) % 2**32)

    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                         num_workers=args.workers, collate_fn=_tagged_collate,
                                         worker_init_fn=worker_init if args.workers else None,
                                         persistent_workers=False)
    steps_per_epoch = -(-len(dsampler) // args.batch_size)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = MODELS[args.model](in_channels=4, num_classes=args.num_classes, cr=args.cr)
    torch.manual_seed(args.seed + rank)
    if args.sync_bn:
        model = lnn.convert_sync_batchnorm(model)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)

    resume = args.resume
    if resume == "auto":
        last = os.path.join(args.checkpoint_dir or "", "last.pt")
        resume = last if args.checkpoint_dir and os.path.isfile(last) else None
    ckpt = load_checkpoint(resume, rank)
    epoch, skip, global_step = 0, 0, 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        epoch, skip, global_step = (int(ckpt["position"][k]) for k in ("epoch", "batch", "global_step"))
        states = ckpt["rng"]
        if len(states) == world:  # the same world size: every rank continues its own random streams
            torch.set_rng_state(states[rank]["torch"])
            np.random.set_state(states[rank]["numpy"])
            if states[rank]["cuda"] is not None and device.type == "cuda":
                torch.cuda.set_rng_state(states[rank]["cuda"])
        elif rank == 0:
            print(f"[train_ddp] resume: checkpoint from {len(states)} ranks, now {world}: "
                  f"random streams reseeded (not bitwise resumable)", flush=True)
        if rank == 0:
            print(f"resumed from {resume}: epoch {epoch + 1}, batch {skip}, step {global_step}", flush=True)

    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if device.type == "cuda" else None, find_unused_parameters=False)
    if rank == 0 and args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    records: list[dict] = []
    if rank == 0 and args.log_json and ckpt is not None and os.path.isfile(args.log_json):
        with open(args.log_json) as f:
            records = [r for r in json.load(f) if r["step"] <= global_step]

    def checkpoint(position: dict) -> None:
        states = [None] * world
        dist.all_gather_object(states, rng_state())
        if rank == 0 and args.checkpoint_dir:
            save_checkpoint(os.path.join(args.checkpoint_dir, "last.pt"), model, opt, position, args, states)
            if args.keep_checkpoints:
                save_checkpoint(os.path.join(args.checkpoint_dir, f"step_{position['global_step']:06d}.pt"), model, opt,
                                position, args, states)

    if rank == 0:
        print(f"training {args.model} (cr {args.cr}) on {len(folder)} scans, {world} ranks x {args.batch_size} "
              f"scans per step, {steps_per_epoch} steps per epoch, {dist.get_backend()} on {device.type}", flush=True)
    ddp.train()
    while epoch < args.epochs:
        folder.set_epoch(epoch)
        sampler.set_epoch(epoch, skip * args.batch_size)
        t0, totals = time.perf_counter(), torch.zeros(4, dtype=torch.float64)
        batch_in_epoch, resumed_at = skip, skip
        for batch in loader:
            x = batch["input"].to(device)  # DDP does not move a SparseTensor: move it here
            labels = batch["labels"].to(device)
            logits = ddp(x).feats
            ce = torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=IGNORE_LABEL, reduction="sum")
            valid = labels != IGNORE_LABEL
            correct = (logits.argmax(1)[valid] == labels[valid]).sum()
            stats = torch.stack([ce.detach().double(), valid.sum().double(), correct.double(),
                                 torch.tensor(float(len(x)), dtype=torch.float64, device=device)])
            dist.all_reduce(stats)  # global sum of losses, labelled voxels, correct voxels, voxels
            loss = ce * world / stats[1].clamp(min=1.0).to(ce.dtype)  # DDP averages: the global batch mean loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            global_step += 1
            batch_in_epoch += 1
            stats = stats.cpu()
            totals += stats
            if args.log_json:
                indices = [None] * world
                dist.all_gather_object(indices, batch["index"])
                if rank == 0:
                    records.append({"step": global_step, "epoch": epoch, "batch": batch_in_epoch,
                                    "loss": float(stats[0] / stats[1].clamp(min=1.0)), "indices": indices})
            if args.checkpoint_every and global_step % args.checkpoint_every == 0 and batch_in_epoch < steps_per_epoch:
                checkpoint({"epoch": epoch, "batch": batch_in_epoch, "global_step": global_step})
        skip = 0
        epoch += 1
        checkpoint({"epoch": epoch, "batch": 0, "global_step": global_step})
        if rank == 0:
            dt = time.perf_counter() - t0
            print(f"epoch {epoch}/{args.epochs}  step {global_step}  loss {float(totals[0] / totals[1].clamp(min=1)):.4f}  "
                  f"acc {float(totals[2] / totals[1].clamp(min=1)):.3f}  {float(totals[3]) / dt:.0f} voxels/s  {dt:.1f}s"
                  + (f"  (resumed at batch {resumed_at + 1})" if resumed_at else ""), flush=True)
        if rank == 0 and args.log_json:
            tmp = args.log_json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(records, f)
            os.replace(tmp, args.log_json)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.make_scans:
        make_scans(args.data, args.make_scans, args.scan_points)
        return 0
    try:
        train(args)
    except Exception as e:
        # the process exits with the error; the other ranks then fail in their next collective
        # (gloo: "Connection closed by peer", otherwise --timeout-s) and torchrun stops the job
        print(f"[train_ddp] rank {os.environ.get('RANK', '0')}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
