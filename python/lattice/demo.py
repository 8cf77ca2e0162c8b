"""``python -m lattice.demo``: a small sparse U-Net on a lidar scan, on the CPU, with its routes.

What it does, in order:

1. Gets a scan: by default a synthetic 64-beam spinning lidar ray-cast in code against a street
   (ground plane, two building walls, parked and moving cars, poles), about 100k points with a
   per-point class; or ``--scan file.bin`` (KITTI float32 ``x, y, z, reflectance``; the scan's
   SemanticKITTI ``.label`` file, beside it or in ``../labels/``, provides classes when present).
2. Voxelizes it with ``lattice.ops.sparse_quantize`` (default 5 cm). Voxel features are the mean
   of the points' ``(offset inside the voxel in x, y, z, reflectance)``, reduced with the
   quantizer's ``inverse`` and ``counts``; a voxel's class is the class of its first point.
3. Builds a sparse U-Net from ``lattice.nn`` (stem, three k2 s2 downsamples with residual blocks,
   three k2 s2 transposed convs onto the skip coordinates, skip concatenation, a linear head),
   then runs ``--steps`` SGD steps (forward, cross-entropy, backward, step) and one more forward.
   The first forward builds every relation ("cold"); later passes fetch them from the relation
   cache of the coordinate sets ("hot").
4. Prints a per-layer table (rows, channels, stride, route chosen by ``lattice.explain`` for the
   same arguments, cold and hot time: the fastest of ``TIMING_REPEATS`` passes, cold ones on
   fresh copies of the input), rows per level, output shapes, totals and ``lattice.backend_info()``.

It needs only the package (no files from the repository). ``--max-points`` crops the scan to the
points nearest the sensor, which keeps a test run at a few seconds.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, TextIO

import numpy as np
import torch

import lattice
from lattice import nn as lnn
from lattice import ops
from lattice.tensor import SparseTensor

CLASS_NAMES = ("ground", "structure", "vehicle", "pole")
IGNORE_INDEX = -100  # cross-entropy ignores voxels without a class (unlabeled real points)

# Synthetic scanner: roughly a Velodyne HDL-64E (vertical field of view, mounting height).
SENSOR_HEIGHT_M = 1.73
BEAMS = 64
ELEVATION_DEG = (-24.8, 2.0)
AZIMUTH_STEPS = 1800  # 0.2 degree steps: ~100k returns for the street below
MAX_RANGE_M = 80.0
RANGE_NOISE_M = 0.01


# ------------------------------------------------------------------------------------------------
# Scans
# ------------------------------------------------------------------------------------------------


@dataclass
class Scan:
    """Points ``(P, 4)`` float32 ``(x, y, z, reflectance)`` and per-point classes ``(P,)`` int64
    (indices into ``CLASS_NAMES``, or ``IGNORE_INDEX``)."""

    points: np.ndarray
    labels: np.ndarray
    source: str


@dataclass
class _Box:
    lo: tuple[float, float, float]
    hi: tuple[float, float, float]
    label: int
    reflectance: float


def _street_boxes(rng: np.random.Generator) -> list[_Box]:
    """Axis-aligned boxes of a street canyon along x: walls, parked/moving cars, poles."""
    g = -SENSOR_HEIGHT_M
    boxes = [
        # North facade, continuous; south facade with a side street between x = 14 and x = 26.
        _Box((-90.0, 12.0, g), (90.0, 12.6, g + 15.0), 1, 0.35),
        _Box((-90.0, -11.6, g), (14.0, -11.0, g + 11.0), 1, 0.35),
        _Box((26.0, -11.6, g), (90.0, -11.0, g + 11.0), 1, 0.35),
    ]
    # Parked cars along both curbs, with random gaps; a few moving cars in the lanes.
    for side in (-7.0, 7.0):
        x = -60.0 + rng.uniform(0.0, 4.0)
        while x < 60.0:
            if rng.uniform() < 0.7 and abs(x) > 3.0:
                cy = side + rng.uniform(-0.3, 0.3)
                length, width, height = rng.uniform(3.8, 4.8), rng.uniform(1.7, 1.9), rng.uniform(1.4, 1.7)
                boxes.append(_Box((x, cy - width / 2, g), (x + length, cy + width / 2, g + height), 2, 0.6))
            x += rng.uniform(5.5, 9.0)
    for cx, cy in ((rng.uniform(8.0, 20.0), -2.5), (rng.uniform(-30.0, -10.0), 2.5), (rng.uniform(25.0, 45.0), 2.0)):
        boxes.append(_Box((cx, cy - 0.9, g), (cx + 4.5, cy + 0.9, g + 1.5), 2, 0.6))
    # Poles (street lights, signs) on the sidewalks.
    for side in (-9.5, 9.5):
        for cx in np.arange(-64.0, 64.0, 12.0) + rng.uniform(-2.0, 2.0):
            boxes.append(_Box((cx - 0.12, side - 0.12, g), (cx + 0.12, side + 0.12, g + 5.0), 3, 0.5))
    return boxes


def synthetic_scan(seed: int = 0, azimuth_steps: int = AZIMUTH_STEPS) -> Scan:
    """Ray-casts a spinning 64-beam lidar at the origin against a street scene.

    Each ray keeps its nearest hit within ``MAX_RANGE_M``: the ground plane ``z = -1.73`` or an
    axis-aligned box (slab test). Range gets Gaussian noise; reflectance is the surface's base
    value times the square root of the incidence cosine plus noise, in ``[0, 1]``.
    """
    rng = np.random.default_rng(seed)
    elevation = np.deg2rad(np.linspace(ELEVATION_DEG[0], ELEVATION_DEG[1], BEAMS))
    azimuth = np.linspace(-np.pi, np.pi, azimuth_steps, endpoint=False)
    e, a = np.meshgrid(elevation, azimuth, indexing="ij")
    d = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).reshape(-1, 3)

    t = np.full(len(d), np.inf)
    label = np.full(len(d), -1, np.int64)
    base = np.zeros(len(d))
    normal_axis = np.full(len(d), 2, np.int64)  # axis of the surface normal at the hit

    down = d[:, 2] < -1e-6
    t[down] = -SENSOR_HEIGHT_M / d[down, 2]
    label[down], base[down] = 0, 0.25

    safe = np.where(np.abs(d) < 1e-12, 1e-12, d)
    inv = 1.0 / safe
    for box in _street_boxes(rng):
        t1 = np.asarray(box.lo) * inv
        t2 = np.asarray(box.hi) * inv
        near = np.minimum(t1, t2)
        t_near = near.max(1)
        t_far = np.maximum(t1, t2).min(1)
        hit = (t_far >= t_near) & (t_near > 0) & (t_near < t)
        t[hit] = t_near[hit]
        label[hit], base[hit] = box.label, box.reflectance
        normal_axis[hit] = near[hit].argmax(1)

    ok = t < MAX_RANGE_M
    d, t, label, base, normal_axis = d[ok], t[ok], label[ok], base[ok], normal_axis[ok]
    t = t + rng.normal(0.0, RANGE_NOISE_M, t.shape)
    xyz = d * t[:, None]
    cos_incidence = np.abs(d[np.arange(len(d)), normal_axis])
    refl = np.clip(base * np.sqrt(cos_incidence) + rng.normal(0.0, 0.03, t.shape), 0.0, 1.0)
    points = np.concatenate([xyz, refl[:, None]], 1).astype(np.float32)
    return Scan(points, label, f"synthetic 64-beam street scan (seed {seed})")


# SemanticKITTI raw class ids -> demo classes (others: ignored by the loss).
_KITTI_CLASSES = {
    0: (40, 44, 48, 49, 60, 72),           # road, parking, sidewalk, other-ground, lane marking, terrain
    1: (50, 51, 52, 70),                   # building, fence, other-structure, vegetation
    2: (10, 11, 13, 15, 16, 18, 20, 252, 253, 254, 255, 256, 257, 258, 259),  # vehicles (moving too)
    3: (71, 80, 81),                       # trunk, pole, traffic sign
}


def _label_file(path: str) -> Optional[str]:
    """The SemanticKITTI labels of a scan: ``<stem>.label`` beside it or in ``../labels/``."""
    folder, name = os.path.split(os.path.abspath(path))
    stem = os.path.splitext(name)[0] + ".label"
    for candidate in (os.path.join(folder, stem), os.path.join(os.path.dirname(folder), "labels", stem)):
        if os.path.isfile(candidate):
            return candidate
    return None


def read_kitti_scan(path: str) -> Scan:
    """Reads a KITTI ``.bin`` (float32 ``x, y, z, reflectance`` per point, no header).

    Rows with NaN/inf are dropped. Classes come from the SemanticKITTI ``.label`` file of the
    scan when there is one (``_label_file``), mapped onto ``CLASS_NAMES`` (other classes are
    ignored by the loss); otherwise from height bands above the lowest 2% of points (ground below
    0.3 m, vehicle 0.3-2 m, pole 2-4 m, structure above), so that the loss is defined.
    """
    raw = np.fromfile(path, dtype=np.float32)
    if raw.size == 0 or raw.size % 4:
        raise ValueError(
            f"[demo] --scan: expected float32 (x, y, z, reflectance) records, got {raw.size * 4} bytes in {path}"
        )
    records = raw.reshape(-1, 4)
    finite = np.isfinite(records).all(1)
    points = records[finite]
    label_path = _label_file(path)
    if label_path is not None:
        raw_labels = np.fromfile(label_path, dtype=np.uint32)
        if raw_labels.size == len(records):
            semantic = (raw_labels[finite] & 0xFFFF).astype(np.int64)  # low 16 bits: class id
            labels = np.full(len(points), IGNORE_INDEX, np.int64)
            for cls, ids in _KITTI_CLASSES.items():
                labels[np.isin(semantic, ids)] = cls
            return Scan(points, labels, f"{path} ({os.path.basename(label_path)} classes)")
    z = points[:, 2] - np.quantile(points[:, 2], 0.02)
    labels = np.select([z < 0.3, z < 2.0, z < 4.0], [0, 2, 3], 1).astype(np.int64)
    return Scan(points, labels, f"{path} (no .label file: height-band classes)")


def crop_nearest(scan: Scan, max_points: int) -> Scan:
    """The ``max_points`` points nearest the sensor in the horizontal plane (order preserved)."""
    if max_points <= 0 or len(scan.points) <= max_points:
        return scan
    r = np.hypot(scan.points[:, 0], scan.points[:, 1])
    keep = np.sort(np.argsort(r, kind="stable")[:max_points])
    return Scan(scan.points[keep], scan.labels[keep], scan.source + f", cropped to the {max_points} nearest points")


# ------------------------------------------------------------------------------------------------
# Voxelization
# ------------------------------------------------------------------------------------------------


@dataclass
class Voxels:
    tensor: SparseTensor      # (M, 4) features: mean (dx, dy, dz) offset in the voxel, mean reflectance
    labels: torch.Tensor      # (M,) int64 class of the voxel's first point
    seconds: float
    route: str


def voxelize(scan: Scan, voxel_size: float) -> Voxels:
    """Quantizes the scan at ``voxel_size`` and averages point features per voxel."""
    start = time.perf_counter()
    pts = torch.from_numpy(np.ascontiguousarray(scan.points))
    xyz = pts[:, :3].contiguous()
    coords, inverse, counts = ops.sparse_quantize(xyz, voxel_size)
    scaled = xyz.double() / voxel_size
    point_feats = torch.cat([(scaled - torch.floor(scaled) - 0.5).float(), pts[:, 3:4]], 1)
    m = coords.shape[0]
    sums = torch.zeros(m, point_feats.shape[1]).index_add_(0, inverse, point_feats)
    feats = sums / counts.unsqueeze(1).to(sums.dtype)
    # Rows are in first-occurrence order, so a stable sort by voxel puts each voxel's first point
    # at the start of its group.
    order = torch.sort(inverse, stable=True).indices
    first = order[torch.cumsum(counts, 0) - counts]
    labels = torch.from_numpy(scan.labels)[first]
    seconds = time.perf_counter() - start
    route = lattice.explain("sparse_quantize", xyz).chosen or "-"
    return Voxels(SparseTensor(coords, feats), labels, seconds, route)


# ------------------------------------------------------------------------------------------------
# The network
# ------------------------------------------------------------------------------------------------


class ConvBlock(torch.nn.Module):
    """conv -> BatchNorm -> ReLU; ``forward(x, target)`` passes ``target`` to (transposed) convs."""

    def __init__(self, conv: torch.nn.Module) -> None:
        super().__init__()
        self.conv = conv
        self.bn = lnn.BatchNorm(conv.out_channels)
        self.relu = lnn.ReLU()

    def forward(self, x: SparseTensor, target: Optional[SparseTensor] = None) -> SparseTensor:
        y = self.conv(x) if target is None else self.conv(x, target)  # positional: hooks see it
        return self.relu(self.bn(y))


class ResidualBlock(torch.nn.Module):
    """Two submanifold k3 convs with BatchNorm; ReLU after adding the shortcut.

    The shortcut is the input, or a 1x1 submanifold conv + BatchNorm when the channel count
    changes (a kernel-1 identity relation: the route layer runs it as a plain matmul).
    """

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = lnn.SubmConv3d(c_in, c_out, 3)
        self.bn1 = lnn.BatchNorm(c_out)
        self.relu1 = lnn.ReLU()
        self.conv2 = lnn.SubmConv3d(c_out, c_out, 3)
        self.bn2 = lnn.BatchNorm(c_out)
        self.proj: Optional[torch.nn.Module] = None
        if c_in != c_out:
            self.proj = torch.nn.Sequential(lnn.SubmConv3d(c_in, c_out, 1), lnn.BatchNorm(c_out))
        self.relu2 = lnn.ReLU()

    def forward(self, x: SparseTensor) -> SparseTensor:
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        shortcut = x if self.proj is None else self.proj(x)
        return self.relu2(y.replace_feats(y.feats + shortcut.feats))


class SparseUNet(torch.nn.Module):
    """A three-level sparse U-Net (strides 1, 2, 4, 8) with width ``c`` at full resolution.

    encoder: stem subm k3 (c_in -> c); per level a k2 s2 conv (doubling channels) and a
    residual block. decoder: per level a k2 s2 transposed conv onto the skip's coordinates,
    concatenation with the skip, a residual block (1x1 projection for the channel change);
    the last level a subm k3 block. head: a per-voxel linear layer to the classes.
    """

    def __init__(self, c_in: int, c: int, num_classes: int) -> None:
        super().__init__()
        w = [c, 2 * c, 4 * c, 8 * c]
        self.stem = ConvBlock(lnn.SubmConv3d(c_in, w[0], 3))
        self.down1 = ConvBlock(lnn.Conv3d(w[0], w[1], 2, stride=2))
        self.enc1 = ResidualBlock(w[1], w[1])
        self.down2 = ConvBlock(lnn.Conv3d(w[1], w[2], 2, stride=2))
        self.enc2 = ResidualBlock(w[2], w[2])
        self.down3 = ConvBlock(lnn.Conv3d(w[2], w[3], 2, stride=2))
        self.enc3 = ResidualBlock(w[3], w[3])
        self.up3 = ConvBlock(lnn.ConvTranspose3d(w[3], w[2], 2, stride=2))
        self.dec3 = ResidualBlock(2 * w[2], w[2])
        self.up2 = ConvBlock(lnn.ConvTranspose3d(w[2], w[1], 2, stride=2))
        self.dec2 = ResidualBlock(2 * w[1], w[1])
        self.up1 = ConvBlock(lnn.ConvTranspose3d(w[1], w[0], 2, stride=2))
        self.dec1 = ConvBlock(lnn.SubmConv3d(2 * w[0], w[0], 3))
        self.head = lnn.Linear(w[0], num_classes)

    def forward(self, x: SparseTensor) -> tuple[SparseTensor, list[SparseTensor]]:
        """Returns the per-voxel logits (on the input's coordinates) and the encoder levels."""
        s0 = self.stem(x)
        s1 = self.enc1(self.down1(s0))
        s2 = self.enc2(self.down2(s1))
        s3 = self.enc3(self.down3(s2))
        u2 = self.dec3(ops.cat([self.up3(s3, s2), s2]))
        u1 = self.dec2(ops.cat([self.up2(u2, s1), s1]))
        u0 = self.dec1(ops.cat([self.up1(u1, s0), s0]))
        return self.head(u0), [s0, s1, s2, s3]


# ------------------------------------------------------------------------------------------------
# Per-layer profiling
# ------------------------------------------------------------------------------------------------

_CONV_OPS: dict[type, str] = {
    lnn.SubmConv3d: "subm_conv3d",
    lnn.Conv3d: "conv3d",
    lnn.ConvTranspose3d: "conv_transpose3d",
}
_PROFILED = (lnn.SubmConv3d, lnn.Conv3d, lnn.ConvTranspose3d, lnn.Linear, lnn.BatchNorm, lnn.ReLU)


@dataclass
class LayerCall:
    """One call of a leaf module during a forward pass (sizes and keys only: no tensors are kept,
    so recording a pass does not hold on to its activations)."""

    name: str
    module: torch.nn.Module
    n_in: int
    c_in: int
    stride_in: str
    relation_key: Optional[tuple[Any, ...]]  # convs: what the relation cache keys the relation by
    n_out: int = 0
    c_out: int = 0
    stride_out: str = ""
    seconds: float = 0.0
    route: str = ""  # filled by an explain pass


class LayerProfiler:
    """Records every leaf lattice module call with forward hooks; ``take()`` returns one pass.

    With ``explain = True`` the pre-hook also asks ``lattice.explain`` for the route of each conv
    (forward, input-grad and weight-grad passes) with the module's own arguments; use that on an
    untimed pass.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[LayerCall] = []
        self.explain = False
        self._start: list[float] = []
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            if isinstance(module, _PROFILED):
                self._handles.append(module.register_forward_pre_hook(self._pre(name)))
                self._handles.append(module.register_forward_hook(self._post))

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
            x: SparseTensor = inputs[0]
            target: Optional[SparseTensor] = inputs[1] if len(inputs) > 1 else None
            key = _relation_key(module, x, target) if type(module) in _CONV_OPS else None
            call = LayerCall(name, module, len(x), int(x.feats.shape[1]), _stride(x), key)
            if self.explain and type(module) in _CONV_OPS:
                routes = [conv_route(module, x, target, p) for p in ("forward", "input_grad", "weight_grad")]
                call.route = routes[0] if len(set(routes)) == 1 else "/".join(routes)
            self.calls.append(call)
            self._start.append(time.perf_counter())

        return hook

    def _post(self, module: torch.nn.Module, inputs: tuple[Any, ...], output: SparseTensor) -> None:
        elapsed = time.perf_counter() - self._start.pop()
        call = next(c for c in reversed(self.calls) if c.module is module)
        call.seconds, call.n_out, call.c_out, call.stride_out = elapsed, len(output), int(output.feats.shape[1]), _stride(output)

    def take(self) -> list[LayerCall]:
        """The calls recorded since the last ``take``, in call order."""
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _relation_key(module: torch.nn.Module, x: SparseTensor, target: Optional[SparseTensor]) -> tuple[Any, ...]:
    """What the relation cache keys a conv call's relation by (input, target, op kind, geometry)."""
    geometry = tuple(getattr(module, a, None) for a in ("kernel_size", "stride", "padding", "dilation", "expand"))
    return (_CONV_OPS[type(module)], x.key, None if target is None else target.key, geometry)


def conv_route(module: torch.nn.Module, x: SparseTensor, target: Optional[SparseTensor], pass_: str = "forward") -> str:
    """The route ``lattice.explain`` reports for this conv module called on ``x`` (and ``target``)."""
    op = _CONV_OPS[type(module)]
    kw: dict[str, Any] = {"kernel_size": module.kernel_size, "dilation": module.dilation}
    if op != "subm_conv3d":
        kw.update(stride=module.stride, padding=module.padding, coordinates=target)
    if op == "conv3d":
        kw["expand"] = module.expand
    return lattice.explain(op, x, module.weight, pass_=pass_, **kw).chosen or "none admitted"


# ------------------------------------------------------------------------------------------------
# Report formatting
# ------------------------------------------------------------------------------------------------


def _stride(t: SparseTensor) -> str:
    s = t.stride
    return str(s[0]) if s[0] == s[1] == s[2] else "x".join(map(str, s))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A plain text table: a header, a rule, one line per row; ``right`` columns right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _min_seconds(samples: list[list[LayerCall]]) -> list[float]:
    """Per call position, the fastest of the passes (every pass makes the same calls in order)."""
    return [min(calls[i].seconds for calls in samples) for i in range(len(samples[0]))]


def layer_table(
    cold: list[list[LayerCall]], hot: list[list[LayerCall]], routes: list[LayerCall]
) -> tuple[str, float, float]:
    """The per-layer table (convs and the head) and the summed BatchNorm/ReLU times (cold, hot).

    ``cold``/``hot`` hold the calls of several forward passes (times: the per-layer minimum);
    ``routes`` is an explain pass. The "relation" column says whether the cold pass built the
    layer's relation or reused one that an earlier layer built for the same coordinates and
    geometry.
    """
    cold_s, hot_s = _min_seconds(cold), _min_seconds(hot)
    seen: set[tuple[Any, ...]] = set()
    rows = []
    feature_cold = feature_hot = 0.0
    for i, (c, r) in enumerate(zip(cold[0], routes)):
        m = c.module
        if isinstance(m, (lnn.BatchNorm, lnn.ReLU)):
            feature_cold += cold_s[i]
            feature_hot += hot_s[i]
            continue
        if c.relation_key is not None:
            k, s = m.kernel_size, getattr(m, "stride", (1, 1, 1))
            op_text = _CONV_OPS[type(m)] + (f" k{k[0]}" if k[0] == k[1] == k[2] else " k" + "x".join(map(str, k)))
            op_text += (f" s{s[0]}" if s != (1, 1, 1) else "") + (" >skip" if c.relation_key[2] is not None else "")
            relation = "reused" if c.relation_key in seen else "built"
            seen.add(c.relation_key)
            route = r.route
        else:
            op_text, route, relation = "linear", "torch.nn.Linear", "-"
        rows.append([
            c.name, op_text, f"{c.n_in:,}", f"{c.n_out:,}", str(c.c_in), str(c.c_out),
            f"{c.stride_in}->{c.stride_out}", route, relation, _ms(cold_s[i]), _ms(hot_s[i]),
        ])
    headers = ["layer", "op", "N in", "N out", "C in", "C out", "stride", "route (fwd[/dx/dW])", "relation",
               "cold ms", "hot ms"]
    right = [False, False, True, True, True, True, False, False, False, True, True]
    return format_table(headers, rows, right), feature_cold, feature_hot


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------

# Forward passes per timing (cold and hot); the minimum is reported because the machine is shared
# and single samples of a ~1 s pass vary by 2x under load (measured on the 2-core dev machine).
TIMING_REPEATS = 3


@dataclass
class DemoResult:
    """What a run measured (``run`` returns it; ``main`` has printed it by then)."""

    points: int
    voxels: int
    rows_per_level: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # per SGD step, then after the last step
    forward_cold_s: float = 0.0
    backward_s: float = 0.0
    forward_hot_s: float = 0.0
    total_s: float = 0.0


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m lattice.demo``."""
    p = argparse.ArgumentParser(
        prog="python -m lattice.demo",
        description="Trains a small sparse U-Net on a lidar scan on the CPU and shows the route of every layer.",
    )
    p.add_argument("--scan", metavar="FILE.bin", help="KITTI scan (float32 x, y, z, reflectance); default: synthetic")
    p.add_argument("--voxel-size", type=float, default=0.05, help="voxel edge in metres (default 0.05)")
    p.add_argument("--channels", type=int, default=16, help="base width c; levels use c, 2c, 4c, 8c (default 16)")
    p.add_argument("--steps", type=int, default=1, help="SGD steps before the final forward (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic scene and the weights (default 0)")
    p.add_argument("--max-points", type=int, default=0, metavar="N",
                   help="keep only the N points nearest the sensor (default 0: all)")
    p.add_argument("--quiet", action="store_true", help="print only the summary (no progress, table, backend info)")
    return p


def _check_args(args: argparse.Namespace) -> None:
    if not (args.voxel_size > 0 and math.isfinite(args.voxel_size)):
        raise ValueError(f"[demo] --voxel-size: expected a positive number, got {args.voxel_size}")
    if args.channels < 1:
        raise ValueError(f"[demo] --channels: expected >= 1, got {args.channels}")
    if args.steps < 1:
        raise ValueError(f"[demo] --steps: expected >= 1, got {args.steps}")
    if args.max_points < 0:
        raise ValueError(f"[demo] --max-points: expected >= 0, got {args.max_points}")
    if args.scan is not None and not os.path.isfile(args.scan):
        raise ValueError(f"[demo] --scan: expected a KITTI .bin file, got {args.scan!r} (no such file)")


def run(args: argparse.Namespace, out: Optional[TextIO] = None) -> DemoResult:
    """Runs the demo for parsed ``args``, printing to ``out`` (default: the current
    ``sys.stdout``); returns the measurements."""
    _check_args(args)
    stream = sys.stdout if out is None else out
    t_start = time.perf_counter()

    def say(text: str = "") -> None:
        print(text, file=stream, flush=True)

    def progress(text: str) -> None:
        if not args.quiet:
            say(f"... {text}")

    torch.manual_seed(args.seed)
    progress("ray-casting the synthetic scan" if args.scan is None else f"reading {args.scan}")
    t0 = time.perf_counter()
    scan = synthetic_scan(args.seed) if args.scan is None else read_kitti_scan(args.scan)
    scan = crop_nearest(scan, args.max_points)
    t_scan = time.perf_counter() - t0
    progress(f"voxelizing {len(scan.points):,} points at {args.voxel_size * 100:g} cm")
    vox = voxelize(scan, args.voxel_size)
    x = vox.tensor
    say(f"scan:    {scan.source}: {len(scan.points):,} points ({_ms(t_scan)} ms)")
    say(f"voxels:  {len(x):,} at {args.voxel_size * 100:g} cm ({len(scan.points) / max(len(x), 1):.2f} points/voxel) "
        f"in {_ms(vox.seconds)} ms, sparse_quantize route '{vox.route}'; features {tuple(x.feats.shape)} "
        "= mean (dx, dy, dz, reflectance)")
    present = torch.bincount(vox.labels[vox.labels >= 0], minlength=len(CLASS_NAMES))
    say("classes: " + ", ".join(f"{n} {int(c):,}" for n, c in zip(CLASS_NAMES, present)) + " voxels")

    model = SparseUNet(x.feats.shape[1], args.channels, len(CLASS_NAMES))
    model.train()
    widths = "/".join(str(args.channels * f) for f in (1, 2, 4, 8))
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model:   sparse U-Net, widths {widths}, {n_params:,} parameters, float32 on cpu, SGD lr 0.05")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)
    profiler = LayerProfiler(model)
    result = DemoResult(points=len(scan.points), voxels=len(x))
    cold: list[list[LayerCall]] = []
    hot: list[list[LayerCall]] = []
    try:
        for step in range(args.steps):
            what = "cold: builds every relation" if step == 0 else "hot: cached relations"
            progress(f"step {step + 1}/{args.steps}: forward ({what})")
            t0 = time.perf_counter()
            logits, levels = model(x)
            t_fwd = time.perf_counter() - t0
            calls = profiler.take()
            if step == 0:
                cold.append(calls)
                result.forward_cold_s = t_fwd
                result.rows_per_level = [len(t) for t in levels]
                level_strides = [_stride(t) for t in levels]
                logits_shape = tuple(logits.feats.shape)
            loss = loss_fn(logits.feats, vox.labels)
            progress(f"step {step + 1}/{args.steps}: backward (forward took {_ms(t_fwd)} ms)")
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            t_bwd = time.perf_counter() - t0
            optimizer.step()
            if step == 0:
                result.backward_s = t_bwd
            result.losses.append(float(loss))
            say(f"step {step + 1}:  loss {float(loss):.4f}, forward {_ms(t_fwd)} ms, backward {_ms(t_bwd)} ms")
            del logits, levels, loss
        if not args.quiet:
            progress(f"timing {TIMING_REPEATS - 1} more cold forwards (a fresh copy of the input: new coordinate "
                     f"identity, every relation rebuilt) and {TIMING_REPEATS} hot ones")
            for _ in range(TIMING_REPEATS - 1):
                fresh = SparseTensor(x.coords.clone(), x.feats)
                t0 = time.perf_counter()
                model(fresh)
                result.forward_cold_s = min(result.forward_cold_s, time.perf_counter() - t0)
                cold.append(profiler.take())
            del fresh
        result.forward_hot_s = math.inf
        for _ in range(TIMING_REPEATS if not args.quiet else 1):
            t0 = time.perf_counter()
            model(x)
            result.forward_hot_s = min(result.forward_hot_s, time.perf_counter() - t0)
            hot.append(profiler.take())
        # An untimed pass that asks lattice.explain for every conv's route; its logits are the
        # model's output after the SGD steps.
        progress("asking lattice.explain for the route of every layer")
        profiler.explain = not args.quiet
        with torch.no_grad():
            logits, _ = model(x)
        routes = profiler.take()
    finally:
        profiler.remove()
    with torch.no_grad():
        final_loss = float(loss_fn(logits.feats, vox.labels))
        valid = vox.labels >= 0
        accuracy = float((logits.feats.argmax(1)[valid] == vox.labels[valid]).float().mean()) if valid.any() else 0.0
    result.losses.append(final_loss)

    if not args.quiet:
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
            f"stride {_stride(x)}; loss {result.losses[0]:.4f} -> {final_loss:.4f} after {args.steps} SGD "
            f"step(s), voxel accuracy {accuracy:.3f}")
    result.total_s = time.perf_counter() - t_start
    speedup = result.forward_cold_s / result.forward_hot_s if result.forward_hot_s > 0 else math.inf
    say(f"time:    forward cold {_ms(result.forward_cold_s)} ms, backward {_ms(result.backward_s)} ms, "
        f"forward hot {_ms(result.forward_hot_s)} ms (cached relations: {speedup:.2f}x faster); "
        f"total {result.total_s:.1f} s")
    say(f"loss:    {final_loss:.6f}")
    if not args.quiet:
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
    return 0 if all(math.isfinite(v) for v in result.losses) else 1


if __name__ == "__main__":
    sys.exit(main())
