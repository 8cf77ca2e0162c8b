"""``python -m lattice.demo``: trains a small sparse U-Net to segment a lidar scan, on the CPU.

What it does, in order:

1. Gets a scan with a class per point: by default a synthetic 64-beam spinning lidar ray-cast in
   code against a street (ground plane, building walls, parked and moving cars, poles: classes
   ground / structure / vehicle / pole), about 110k points; or ``--scan file.bin`` (KITTI float32
   ``x, y, z, reflectance``) with ``--labels file.label`` (SemanticKITTI; default: ``<stem>.label``
   beside the scan or in ``../labels/``), whose raw ids are mapped onto ground / structure /
   object / vegetation / pole (``lattice._demo_data.KITTI_ID_TO_CLASS``; unlabeled and outlier
   points are ignored). ``--max-points`` keeps the points nearest the sensor.
2. Voxelizes it with ``lattice.ops.sparse_quantize`` (``--voxel-size``, default 10 cm). Voxel
   features are the mean of the points' ``(offset inside the voxel in x, y, z, height above the
   ground plane / 4 m, reflectance)``; a voxel's class is the majority class of its labelled
   points (ties: the smallest class id; a voxel with no labelled point is ignored).
3. Builds a MinkUNet-style sparse U-Net from ``lattice.nn`` (stem, three k2 s2 downsamples with
   residual blocks, three k2 s2 transposed convs onto the skip coordinates, skip concatenation, a
   linear head) and trains it on the whole scan for ``--steps`` Adam steps with class-weighted
   cross entropy (weights: inverse square root of the class frequency among the voxels), showing
   a progress bar with the loss. The first step builds every relation; later steps fetch them
   from the relation cache of the coordinate sets.
4. Evaluates (one eval-mode forward): per-class IoU and mIoU on the voxels, and on the points
   through the quantizer's point -> voxel ``inverse``, next to the majority-class predictor.
   These are scores on the scan the net was trained on: they show that the library trains a
   network (forward, backward, relation reuse), not how well it generalises.
5. ``--profile`` (default unless ``--quiet``): a per-layer table (rows, channels, stride, the route
   ``lattice.explain`` chooses for the same arguments, relation built or reused, cold and hot
   time: the fastest of ``TIMING_REPEATS`` forwards, cold ones on fresh copies of the input),
   rows per level, output shape, forward/backward times and ``lattice.backend_info()``.
6. Writes PNGs into ``--out`` (default ``./lattice_demo_out``): ``bev.png`` (bird's-eye view:
   ground truth beside the prediction, and the wrong points) and ``loss.png`` (loss and mIoU per
   step, with the majority-class predictor's mIoU).

Deterministic for a ``--seed`` (scene, weights; lattice's ops are deterministic). It needs only
the package (no files from the repository). Details and a sample run: docs/demo.md.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, TextIO

import torch

import lattice
from lattice import nn as lnn
from lattice._demo_data import (  # noqa: F401  (re-exported: the demo's public names)
    IGNORE_INDEX,
    KITTI_CLASSES,
    KITTI_ID_TO_CLASS,
    SENSOR_HEIGHT_M,
    SYNTHETIC_CLASSES,
    Scan,
    Voxels,
    crop_nearest,
    find_label_file,
    holdout_tiles,
    map_kitti_labels,
    majority_labels,
    read_kitti_scan,
    synthetic_scan,
    voxelize_scan,
)
from lattice._demo_model import (  # noqa: F401
    ConvBlock,
    LayerCall,
    LayerProfiler,
    ResidualBlock,
    SparseUNet,
    _min_seconds,
    _ms,
    _stride,
    conv_route,
    format_table,
    layer_table,
)
from lattice._demo_report import (
    ProgressBar,
    class_weights,
    confusion,
    iou_per_class,
    majority_class,
    mean_iou,
    plot_bev,
    plot_loss,
)
from lattice.tensor import SparseTensor

CLASS_NAMES = SYNTHETIC_CLASSES  # the default (synthetic) run's classes

__all__ = [
    "main", "run", "build_parser", "DemoResult", "train", "evaluate", "profile", "iou_table",
    # re-exported from the helpers
    "CLASS_NAMES", "SYNTHETIC_CLASSES", "KITTI_CLASSES", "KITTI_ID_TO_CLASS", "IGNORE_INDEX", "SENSOR_HEIGHT_M",
    "Scan", "Voxels", "synthetic_scan", "read_kitti_scan", "find_label_file", "map_kitti_labels", "crop_nearest",
    "voxelize_scan", "majority_labels", "holdout_tiles", "SparseUNet", "ConvBlock", "ResidualBlock",
    "LayerProfiler", "LayerCall", "conv_route", "layer_table", "format_table",
]

# Forward passes per profile timing (cold and hot); the minimum is reported because the machine is
# shared and single samples of a ~1 s pass vary by 2x under load (measured on the 2-core dev machine).
TIMING_REPEATS = 3

DEFAULT_VOXEL_SIZE = 0.1
DEFAULT_STEPS = 60
DEFAULT_LR = 0.01
DEFAULT_CHANNELS = 16
DEFAULT_OUT = "lattice_demo_out"


@dataclass
class DemoResult:
    """What a run measured (``run`` returns it; ``main`` has printed it by then)."""

    points: int
    voxels: int
    class_names: tuple[str, ...] = ()
    losses: list[float] = field(default_factory=list)        # per training step
    step_mious: list[float] = field(default_factory=list)    # mIoU of each step's training forward (voxels)
    final_loss: float = math.nan                              # eval forward after the last step (training labels)
    ious: list[float] = field(default_factory=list)          # per class, voxels (NaN: class absent)
    miou: float = math.nan
    majority: int = 0                                         # the majority predictor's class
    majority_miou: float = math.nan
    point_ious: list[float] = field(default_factory=list)
    point_miou: float = math.nan
    point_majority_miou: float = math.nan
    holdout_voxels: int = 0                                   # --holdout: voxels whose labels training never saw
    holdout_ious: list[float] = field(default_factory=list)
    holdout_miou: float = math.nan
    holdout_majority_miou: float = math.nan
    rows_per_level: list[int] = field(default_factory=list)
    pngs: list[str] = field(default_factory=list)
    first_step_s: float = 0.0
    train_s: float = 0.0
    forward_cold_s: float = math.nan
    backward_s: float = math.nan
    forward_hot_s: float = math.nan
    total_s: float = 0.0


# ------------------------------------------------------------------------------------------------
# Training and evaluation
# ------------------------------------------------------------------------------------------------


def _lr_at(step: int, steps: int, lr: float) -> float:
    """Constant for the first half, then a cosine decay to lr / 20 at the last step."""
    half = steps // 2
    if step < half or steps - half <= 1:
        return lr
    t = (step - half) / (steps - half - 1)
    return lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * t)))


def train(
    model: torch.nn.Module,
    x: SparseTensor,
    labels: torch.Tensor,
    loss_fn: torch.nn.Module,
    steps: int,
    lr: float,
    bar: ProgressBar,
    result: DemoResult,
) -> None:
    """``steps`` Adam steps on the whole scan (one forward, backward and update each); appends
    each step's loss and the mIoU of its forward's argmax to ``result``."""
    num_classes = len(result.class_names)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, steps, lr)
        t0 = time.perf_counter()
        logits, _ = model(x)
        loss = loss_fn(logits.feats, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 0:
            result.first_step_s = time.perf_counter() - t0
        with torch.no_grad():
            step_miou = mean_iou(iou_per_class(confusion(logits.feats.argmax(1), labels, num_classes)))
        result.losses.append(float(loss))
        result.step_mious.append(step_miou)
        bar.update(step + 1, float(loss), f"  mIoU {step_miou:.3f}")
        del logits, loss
    bar.close()
    result.train_s = time.perf_counter() - start


def evaluate(model: torch.nn.Module, vox: Voxels, point_labels: torch.Tensor, loss_fn: torch.nn.Module,
             result: DemoResult, train_labels: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """One eval-mode forward: loss, per-class IoU / mIoU on voxels and points, and the same for
    the majority-class predictor (the majority of ``train_labels``); with held-out voxels
    (``held``), also the scores on those alone. Returns the voxel predictions."""
    k = len(result.class_names)
    model.eval()
    with torch.no_grad():
        logits, _ = model(vox.tensor)
        result.final_loss = float(loss_fn(logits.feats, train_labels))  # the labels training saw
        pred = logits.feats.argmax(1)
    result.ious = iou_per_class(confusion(pred, vox.labels, k))
    result.miou = mean_iou(result.ious)
    result.majority = majority_class(train_labels, k)
    result.majority_miou = mean_iou(iou_per_class(confusion(torch.full_like(vox.labels, result.majority), vox.labels, k)))
    point_pred = pred[vox.inverse]
    result.point_ious = iou_per_class(confusion(point_pred, point_labels, k))
    result.point_miou = mean_iou(result.point_ious)
    point_majority = majority_class(point_labels, k)
    result.point_majority_miou = mean_iou(
        iou_per_class(confusion(torch.full_like(point_labels, point_majority), point_labels, k)))
    if (vox.labels[held] >= 0).any():
        truth = vox.labels[held]
        result.holdout_voxels = int((truth >= 0).sum())
        result.holdout_ious = iou_per_class(confusion(pred[held], truth, k))
        result.holdout_miou = mean_iou(result.holdout_ious)
        result.holdout_majority_miou = mean_iou(iou_per_class(confusion(torch.full_like(truth, result.majority), truth, k)))
    return pred


def _iou(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}"


def iou_table(result: DemoResult, vox_labels: torch.Tensor, point_labels: torch.Tensor) -> str:
    """Per class: voxels and points with that class, IoU of the net and of the majority-class
    predictor on voxels, IoU of the net on points; then the mIoU row."""
    k = len(result.class_names)
    nv = torch.bincount(vox_labels[vox_labels >= 0], minlength=k)
    npt = torch.bincount(point_labels[point_labels >= 0], minlength=k)
    rows = []
    for c, name in enumerate(result.class_names):
        maj = (float(nv[c]) / float(nv.sum()) if c == result.majority else 0.0) if nv[c] > 0 else math.nan
        rows.append([name, f"{int(nv[c]):,}", f"{int(npt[c]):,}", _iou(result.ious[c]), _iou(maj),
                     _iou(result.point_ious[c])])
        if result.holdout_ious:
            rows[-1].append(_iou(result.holdout_ious[c]))
    rows.append(["mIoU", f"{int(nv.sum()):,}", f"{int(npt.sum()):,}", _iou(result.miou), _iou(result.majority_miou),
                 _iou(result.point_miou)])
    headers = ["class", "voxels", "points", "IoU voxels", "majority", "IoU points"]
    if result.holdout_ious:
        rows[-1].append(_iou(result.holdout_miou))
        headers.append("IoU held out")
    text = format_table(headers, rows, [False] + [True] * (len(headers) - 1))
    lines = text.splitlines()
    return "\n".join([*lines[:-1], lines[1], lines[-1]])  # a rule above the mIoU row


# ------------------------------------------------------------------------------------------------
# Profile: the foundation demo's per-layer route table and timings
# ------------------------------------------------------------------------------------------------


def profile(model: torch.nn.Module, x: SparseTensor, labels: torch.Tensor, loss_fn: torch.nn.Module,
            steps: int, say, progress, result: DemoResult) -> None:  # type: ignore[no-untyped-def]
    """Times cold forwards (fresh copies of the input: every relation rebuilt), one backward and
    hot forwards (relations from the cache) in training mode, asks ``lattice.explain`` for every
    conv's route, and prints the per-layer table. The model's state (weights, BatchNorm running
    statistics) is restored afterwards, so the profile does not change any result."""
    state = copy.deepcopy(model.state_dict())
    model.train()
    profiler = LayerProfiler(model)
    cold: list[list[LayerCall]] = []
    hot: list[list[LayerCall]] = []
    try:
        progress(f"profile: {TIMING_REPEATS} cold forwards (a fresh copy of the input: new coordinate identity, "
                 f"every relation rebuilt), one backward, {TIMING_REPEATS} hot forwards")
        for i in range(TIMING_REPEATS):
            fresh = SparseTensor(x.coords.clone(), x.feats)
            t0 = time.perf_counter()
            logits, levels = model(fresh)
            seconds = time.perf_counter() - t0
            cold.append(profiler.take())
            result.forward_cold_s = seconds if i == 0 else min(result.forward_cold_s, seconds)
            if i == 0:
                result.rows_per_level = [len(t) for t in levels]
                level_strides = [_stride(t) for t in levels]
                logits_shape = tuple(logits.feats.shape)
                loss = loss_fn(logits.feats, labels)
                t0 = time.perf_counter()
                loss.backward()
                result.backward_s = time.perf_counter() - t0
                model.zero_grad(set_to_none=True)
                del loss
            del logits, levels, fresh
        for _ in range(TIMING_REPEATS):
            with torch.no_grad():
                t0 = time.perf_counter()
                model(x)
                seconds = time.perf_counter() - t0
            result.forward_hot_s = min(result.forward_hot_s, seconds) if not math.isnan(result.forward_hot_s) else seconds
            hot.append(profiler.take())
        progress("profile: asking lattice.explain for the route of every layer")
        profiler.explain = True
        with torch.no_grad():
            model(x)
        routes = profiler.take()
    finally:
        profiler.remove()
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)

    table, feat_cold, feat_hot = layer_table(cold, hot, routes)
    rest_cold = result.forward_cold_s - sum(_min_seconds(cold))
    rest_hot = result.forward_hot_s - sum(_min_seconds(hot))
    say()
    say(f"per-layer forward, fastest of {TIMING_REPEATS} passes (cold: relations built in the pass; "
        "hot: fetched from the relation cache):")
    say(table)
    n_feature = sum(isinstance(c.module, (lnn.BatchNorm, lnn.ReLU)) for c in cold[0])
    say(f"BatchNorm + ReLU ({n_feature} calls): cold {_ms(feat_cold)} ms, hot {_ms(feat_hot)} ms; "
        f"skip concatenation, residual adds, Python: cold {_ms(max(rest_cold, 0.0))} ms, "
        f"hot {_ms(max(rest_hot, 0.0))} ms")
    say()
    say("rows per level: " + ", ".join(f"stride {s}: {n:,}" for s, n in zip(level_strides, result.rows_per_level)))
    say(f"output:  logits {logits_shape} float32 on the input's coordinates {tuple(x.coords.shape)} int32, "
        f"stride {_stride(x)}")
    speedup = result.forward_cold_s / result.forward_hot_s if result.forward_hot_s > 0 else math.inf
    say(f"time:    forward cold {_ms(result.forward_cold_s)} ms, backward {_ms(result.backward_s)} ms, "
        f"forward hot {_ms(result.forward_hot_s)} ms (cached relations: {speedup:.2f}x faster); "
        f"training {result.train_s:.1f} s for {steps} steps")


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m lattice.demo``."""
    p = argparse.ArgumentParser(
        prog="python -m lattice.demo",
        description="Trains a small sparse U-Net to segment a lidar scan on the CPU: loss, per-class IoU, "
                    "the route of every layer, and PNGs (bird's-eye view, loss curve).",
    )
    p.add_argument("--scan", metavar="FILE.bin", help="KITTI scan (float32 x, y, z, reflectance); default: synthetic")
    p.add_argument("--labels", metavar="FILE.label",
                   help="SemanticKITTI labels of --scan (default: <stem>.label beside it or in ../labels/)")
    p.add_argument("--voxel-size", type=float, default=DEFAULT_VOXEL_SIZE,
                   help=f"voxel edge in metres (default {DEFAULT_VOXEL_SIZE:g})")
    p.add_argument("--channels", type=int, default=DEFAULT_CHANNELS,
                   help=f"base width c; levels use c, 2c, 4c, 8c (default {DEFAULT_CHANNELS})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"training steps (default {DEFAULT_STEPS})")
    p.add_argument("--lr", type=float, default=DEFAULT_LR,
                   help=f"Adam learning rate; cosine decay over the second half (default {DEFAULT_LR:g})")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic scene and the weights (default 0)")
    p.add_argument("--max-points", type=int, default=0, metavar="N",
                   help="keep only the N points nearest the sensor (default 0: all)")
    p.add_argument("--holdout", type=float, default=0.0, metavar="FRACTION",
                   help="hide the labels of about this fraction of 8 m x 8 m ground tiles from training and "
                        "also score those voxels alone (default 0: train on every labelled voxel)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"folder for bev.png and loss.png (default ./{DEFAULT_OUT}; created)")
    p.add_argument("--quiet", action="store_true",
                   help="print only the summary (no progress bar, no profile unless --profile)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="print the per-layer route/timing table, rows per level and backend info "
                        "(default: on, off with --quiet)")
    return p


def _check_args(args: argparse.Namespace) -> None:
    if not (args.voxel_size > 0 and math.isfinite(args.voxel_size)):
        raise ValueError(f"[demo] --voxel-size: expected a positive number, got {args.voxel_size}")
    if args.channels < 1:
        raise ValueError(f"[demo] --channels: expected >= 1, got {args.channels}")
    if args.steps < 1:
        raise ValueError(f"[demo] --steps: expected >= 1, got {args.steps}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise ValueError(f"[demo] --lr: expected a positive number, got {args.lr}")
    if not 0.0 <= args.holdout < 1.0:
        raise ValueError(f"[demo] --holdout: expected a fraction in [0, 1), got {args.holdout}")
    if args.max_points < 0:
        raise ValueError(f"[demo] --max-points: expected >= 0, got {args.max_points}")
    if args.scan is not None and not os.path.isfile(args.scan):
        raise ValueError(f"[demo] --scan: expected a KITTI .bin file, got {args.scan!r} (no such file)")
    if args.labels is not None and args.scan is None:
        raise ValueError("[demo] --labels: needs --scan (the synthetic scan has its own classes)")
    if args.labels is not None and not os.path.isfile(args.labels):
        raise ValueError(f"[demo] --labels: expected a SemanticKITTI .label file, got {args.labels!r} (no such file)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"[demo] --out: expected a folder, got {args.out!r} (a file)")


def run(args: argparse.Namespace, out: Optional[TextIO] = None) -> DemoResult:
    """Runs the demo for parsed ``args``, printing to ``out`` (default: the current
    ``sys.stdout``); returns the measurements."""
    _check_args(args)
    stream = sys.stdout if out is None else out
    show_profile = (not args.quiet) if args.profile is None else args.profile
    t_start = time.perf_counter()

    def say(text: str = "") -> None:
        print(text, file=stream, flush=True)

    def progress(text: str) -> None:
        if not args.quiet:
            say(f"... {text}")

    torch.manual_seed(args.seed)
    progress("ray-casting the synthetic scan" if args.scan is None else f"reading {args.scan}")
    t0 = time.perf_counter()
    scan = synthetic_scan(args.seed) if args.scan is None else read_kitti_scan(args.scan, args.labels)
    scan = crop_nearest(scan, args.max_points)
    t_scan = time.perf_counter() - t0
    progress(f"voxelizing {len(scan.points):,} points at {args.voxel_size * 100:g} cm")
    vox = voxelize_scan(scan, args.voxel_size)
    x = vox.tensor
    names = scan.class_names
    k = len(names)
    point_labels = torch.from_numpy(scan.labels)
    say(f"scan:    {scan.source}: {len(scan.points):,} points ({_ms(t_scan)} ms)")
    say(f"voxels:  {len(x):,} at {args.voxel_size * 100:g} cm ({len(scan.points) / max(len(x), 1):.2f} points/voxel) "
        f"in {_ms(vox.seconds)} ms, sparse_quantize route '{vox.route}'; features {tuple(x.feats.shape)} "
        f"= mean (dx, dy, dz, height, reflectance) by {vox.reducer}; labels: majority vote of the voxel's points")
    present = torch.bincount(vox.labels[vox.labels >= 0], minlength=k)
    ignored = int((vox.labels < 0).sum())
    say("classes: " + ", ".join(f"{n} {int(c):,}" for n, c in zip(names, present)) + f" voxels; {ignored:,} ignored")
    if int(present.sum()) == 0:
        raise ValueError("[demo] --labels: no voxel has a class (every point is unlabeled/outlier)")

    held = holdout_tiles(x.coords, args.voxel_size, args.holdout, args.seed)
    train_labels = torch.where(held, torch.full_like(vox.labels, IGNORE_INDEX), vox.labels)
    if args.holdout > 0:
        say(f"holdout: labels of {int((vox.labels[held] >= 0).sum()):,} voxels in {args.holdout:.0%} of the 8 m tiles "
            f"hidden from training; {int((train_labels >= 0).sum()):,} voxels train")
        if int((train_labels >= 0).sum()) == 0:
            raise ValueError("[demo] --holdout: every labelled voxel is held out; use a smaller fraction")

    torch.manual_seed(args.seed)
    model = SparseUNet(x.feats.shape[1], args.channels, k)
    weights = class_weights(train_labels, k)
    loss_fn = torch.nn.CrossEntropyLoss(weight=weights, ignore_index=IGNORE_INDEX)
    widths = "/".join(str(args.channels * f) for f in (1, 2, 4, 8))
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model:   sparse U-Net (MinkUNet-style, 3 levels), widths {widths}, {n_params:,} parameters, "
        "float32 on cpu")
    say(f"train:   {args.steps} Adam steps on the whole scan, lr {args.lr:g} (cosine decay over the second half), "
        "cross entropy weighted by 1/sqrt(class frequency): "
        + ", ".join(f"{n} {float(w):.2f}" for n, w in zip(names, weights)))

    result = DemoResult(points=len(scan.points), voxels=len(x), class_names=names)
    bar = ProgressBar(args.steps, stream, enabled=not args.quiet)
    train(model, x, train_labels, loss_fn, args.steps, args.lr, bar, result)
    rest = (result.train_s - result.first_step_s) / max(args.steps - 1, 1)
    say(f"trained: loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f} in {args.steps} steps, "
        f"{result.train_s:.1f} s (step 1, which builds every relation: {result.first_step_s:.2f} s; "
        f"then {rest:.2f} s/step)")

    pred = evaluate(model, vox, point_labels, loss_fn, result, train_labels, held)
    say()
    say(f"per-class IoU after training (eval-mode forward on the scan it was trained on; majority: the "
        f"majority-class predictor, '{names[result.majority]}' everywhere):")
    say(iou_table(result, vox.labels, point_labels))
    verdict = "beats" if result.miou > result.majority_miou else "does NOT beat"
    say(f"miou:    {result.miou:.3f} on voxels vs {result.majority_miou:.3f} for the majority-class predictor "
        f"({verdict} it); on points {result.point_miou:.3f} vs {result.point_majority_miou:.3f}")
    if result.holdout_ious:
        say(f"held out: {result.holdout_miou:.3f} on the {result.holdout_voxels:,} held-out voxels vs "
            f"{result.holdout_majority_miou:.3f} for the majority-class predictor")
    elif args.holdout > 0:
        say("held out: no labelled voxel fell in a held-out tile (a small crop has few 8 m tiles)")

    if show_profile:
        profile(model, x, vox.labels, loss_fn, args.steps, say, progress, result)

    progress(f"writing PNGs into {args.out}")
    os.makedirs(args.out, exist_ok=True)
    bev_path = os.path.join(args.out, "bev.png")
    loss_path = os.path.join(args.out, "loss.png")
    short = os.path.basename(args.scan) if args.scan else f"synthetic street (seed {args.seed})"
    plot_bev(
        bev_path, scan.points, scan.labels, pred[vox.inverse].numpy(), names,
        f"{short}: {len(scan.points):,} points, {len(x):,} voxels at {args.voxel_size * 100:g} cm, "
        f"{args.steps} training steps (bird's-eye view, colour = class)",
        "ground truth",
        f"prediction: mIoU {result.point_miou:.3f} on points, {result.miou:.3f} on voxels "
        f"(majority-class predictor {result.majority_miou:.3f})",
    )
    plot_loss(loss_path, result.losses, result.step_mious, result.majority_miou,
              f"training on {short}: {args.steps} Adam steps, lr {args.lr:g}, widths {widths}",
              final_miou=result.miou)
    result.pngs = [os.path.abspath(bev_path), os.path.abspath(loss_path)]
    say()
    say(f"pngs:    {result.pngs[0]} (bird's-eye view: ground truth | prediction | errors)")
    say(f"         {result.pngs[1]} (loss and mIoU per step)")
    result.total_s = time.perf_counter() - t_start
    say(f"total:   {result.total_s:.1f} s (training {result.train_s:.1f} s)")
    say(f"loss:    {result.final_loss:.6f}")
    if show_profile:
        say()
        say(lattice.backend_info().rstrip())
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status (0, or 1 when a loss is not finite)."""
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except ValueError as exc:
        if str(exc).startswith("[demo]"):
            build_parser().error(str(exc))  # exits with status 2 and the usage line
        raise
    finite = all(math.isfinite(v) for v in result.losses) and math.isfinite(result.final_loss)
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
