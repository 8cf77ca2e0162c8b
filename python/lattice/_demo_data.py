"""Scans, labels and voxelization for ``python -m lattice.demo`` (helpers; see lattice/demo.py).

* ``synthetic_scan``: a 64-beam spinning lidar ray-cast in code against a street, with a class per
  point (``SYNTHETIC_CLASSES``);
* ``read_kitti_scan``: a KITTI velodyne ``.bin`` and its SemanticKITTI ``.label``, raw ids mapped
  onto the coarse ``KITTI_CLASSES`` by ``KITTI_ID_TO_CLASS`` (unlabeled / outlier -> ignored);
* ``crop_nearest``: the N points nearest the sensor;
* ``voxelize_scan``: ``lattice.ops.sparse_quantize`` + per-voxel mean features and majority-vote
  labels (ties: the smallest class id; voxels whose points are all ignored: ``IGNORE_INDEX``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

import lattice
from lattice import ops
from lattice.tensor import SparseTensor

IGNORE_INDEX = -100  # torch's CrossEntropyLoss default: points/voxels without a class

SYNTHETIC_CLASSES = ("ground", "structure", "vehicle", "pole")
KITTI_CLASSES = ("ground", "structure", "object", "vegetation", "pole")

# SemanticKITTI raw class id (low 16 bits of a .label entry) -> index into KITTI_CLASSES.
# Ids not listed (0 unlabeled, 1 outlier, and any unknown id) are ignored by the loss and the IoU.
_KITTI_GROUPS = {
    0: (40, 44, 48, 49, 60, 72),  # road, parking, sidewalk, other-ground, lane-marking, terrain
    1: (50, 51, 52),  # building, fence, other-structure
    2: (10, 11, 13, 15, 16, 18, 20, 30, 31, 32, 99,  # car, bicycle, bus, motorcycle, on-rails, truck,
        # other-vehicle, person, bicyclist, motorcyclist, other-object, and the moving-* variants:
        252, 253, 254, 255, 256, 257, 258, 259),
    3: (70, 71),  # vegetation, trunk
    4: (80, 81),  # pole, traffic-sign
}
KITTI_ID_TO_CLASS: dict[int, int] = {raw: cls for cls, ids in _KITTI_GROUPS.items() for raw in ids}

# Synthetic scanner: roughly a Velodyne HDL-64E (vertical field of view, mounting height).
SENSOR_HEIGHT_M = 1.73
BEAMS = 64
ELEVATION_DEG = (-24.8, 2.0)
AZIMUTH_STEPS = 1800  # 0.2 degree steps: ~100k returns for the street below
MAX_RANGE_M = 80.0
RANGE_NOISE_M = 0.01


@dataclass
class Scan:
    """Points ``(P, 4)`` float32 ``(x, y, z, reflectance)`` and per-point classes ``(P,)`` int64
    (indices into ``class_names``, or ``IGNORE_INDEX``)."""

    points: np.ndarray
    labels: np.ndarray
    source: str
    class_names: tuple[str, ...] = SYNTHETIC_CLASSES


# ------------------------------------------------------------------------------------------------
# The synthetic street
# ------------------------------------------------------------------------------------------------


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
    value times the square root of the incidence cosine plus noise, in ``[0, 1]``. Classes:
    ``SYNTHETIC_CLASSES`` (ground plane, building walls, cars, poles).
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
    return Scan(points, label, f"synthetic 64-beam street scan (seed {seed})", SYNTHETIC_CLASSES)


# ------------------------------------------------------------------------------------------------
# KITTI / SemanticKITTI files
# ------------------------------------------------------------------------------------------------


def find_label_file(scan_path: str) -> Optional[str]:
    """The SemanticKITTI labels of a scan: ``<stem>.label`` beside it or in ``../labels/``."""
    folder, name = os.path.split(os.path.abspath(scan_path))
    stem = os.path.splitext(name)[0] + ".label"
    for candidate in (os.path.join(folder, stem), os.path.join(os.path.dirname(folder), "labels", stem)):
        if os.path.isfile(candidate):
            return candidate
    return None


def _lattice_io():  # type: ignore[no-untyped-def]
    """``lattice.io`` (the C++ point-cloud readers) when this build has it, else None."""
    try:
        import importlib

        return importlib.import_module("lattice.io")
    except Exception:  # not landed (or the extension predates it)
        return None


def _read_bin_records(path: str) -> np.ndarray:
    """``(P, 4)`` float32 records of a KITTI velodyne file: ``lattice.io.read_kitti`` when the
    installed package has it (and it returns one row per 16 bytes), else numpy (16 bytes per
    point, no header)."""
    io = _lattice_io()
    if io is not None and hasattr(io, "read_kitti"):
        try:
            arr = np.asarray(io.read_kitti(path))
            if arr.ndim == 2 and arr.shape == (os.path.getsize(path) // 16, 4):
                return np.ascontiguousarray(arr, dtype=np.float32)
        except Exception:  # an API or build we do not know: the numpy reader below is authoritative
            pass
    raw = np.fromfile(path, dtype=np.float32)
    if raw.size == 0 or raw.size % 4:
        raise ValueError(
            f"[demo] --scan: expected float32 (x, y, z, reflectance) records, got {raw.size * 4} bytes in {path}"
        )
    return raw.reshape(-1, 4)


def _read_label_ids(path: str) -> np.ndarray:
    """The raw class ids (low 16 bits) of a SemanticKITTI ``.label`` file, int64:
    ``lattice.io.read_kitti_labels`` when the installed package has it, else numpy."""
    io = _lattice_io()
    if io is not None and hasattr(io, "read_kitti_labels"):
        try:
            semantic = np.asarray(io.read_kitti_labels(path)[0])
            if semantic.shape == (os.path.getsize(path) // 4,):
                return semantic.astype(np.int64) & 0xFFFF
        except Exception:
            pass
    return (np.fromfile(path, dtype=np.uint32) & 0xFFFF).astype(np.int64)


def map_kitti_labels(raw: np.ndarray) -> np.ndarray:
    """SemanticKITTI ``.label`` entries (uint32: class in the low 16 bits, instance in the high 16;
    or the class ids alone) -> indices into ``KITTI_CLASSES`` (int64), ``IGNORE_INDEX`` for
    unmapped ids."""
    lut = np.full(1 << 16, IGNORE_INDEX, np.int64)
    for raw_id, cls in KITTI_ID_TO_CLASS.items():
        lut[raw_id] = cls
    return lut[np.asarray(raw).astype(np.int64) & 0xFFFF]


def read_kitti_scan(path: str, label_path: Optional[str] = None) -> Scan:
    """Reads a KITTI ``.bin`` and its SemanticKITTI ``.label``.

    ``label_path`` defaults to ``find_label_file(path)``. Rows with NaN/inf coordinates are
    dropped (with their labels). Without a label file, classes are height bands above the lowest
    2% of points (ground below 0.3 m, vehicle 0.3-2 m, pole 2-4 m, structure above, in
    ``SYNTHETIC_CLASSES``), so that the loss is defined; the source line says so.
    """
    records = _read_bin_records(path)
    finite = np.isfinite(records).all(1)
    points = np.ascontiguousarray(records[finite])
    if label_path is None:
        label_path = find_label_file(path)
    if label_path is not None:
        raw = _read_label_ids(label_path)
        if raw.size != len(records):
            raise ValueError(
                f"[demo] --labels: {label_path} has {raw.size:,} entries (uint32 each) but {path} has "
                f"{len(records):,} points"
            )
        labels = map_kitti_labels(raw[finite])
        return Scan(points, labels, f"{path} ({os.path.basename(label_path)} classes)", KITTI_CLASSES)
    z = points[:, 2] - np.quantile(points[:, 2], 0.02)
    labels = np.select([z < 0.3, z < 2.0, z < 4.0], [0, 2, 3], 1).astype(np.int64)
    return Scan(points, labels, f"{path} (no .label file: height-band classes)", SYNTHETIC_CLASSES)


def crop_nearest(scan: Scan, max_points: int) -> Scan:
    """The ``max_points`` points nearest the sensor in the horizontal plane (order preserved)."""
    if max_points <= 0 or len(scan.points) <= max_points:
        return scan
    r = np.hypot(scan.points[:, 0], scan.points[:, 1])
    keep = np.sort(np.argsort(r, kind="stable")[:max_points])
    return Scan(scan.points[keep], scan.labels[keep], scan.source + f", cropped to the {max_points} nearest points",
                scan.class_names)


# ------------------------------------------------------------------------------------------------
# Voxelization
# ------------------------------------------------------------------------------------------------

# Per-point input features, averaged per voxel: the offset of the point inside its voxel (x, y, z,
# in [-0.5, 0.5)), its height above the sensor's ground plane in metres / HEIGHT_SCALE_M (the one
# absolute cue: a sparse conv net is translation invariant otherwise), and its reflectance.
FEATURE_NAMES = ("dx", "dy", "dz", "height", "reflectance")
HEIGHT_SCALE_M = 4.0


@dataclass
class Voxels:
    tensor: SparseTensor      # (M, 5) features FEATURE_NAMES, coords (M, 4) int32 at stride 1
    labels: torch.Tensor      # (M,) int64 majority class of the voxel's labelled points, or IGNORE_INDEX
    inverse: torch.Tensor     # (P,) int64 point -> voxel row
    counts: torch.Tensor      # (M,) int64 points per voxel
    seconds: float
    route: str                # sparse_quantize's route (lattice.explain)
    reducer: str              # which op averaged the features


def majority_labels(inverse: torch.Tensor, point_labels: torch.Tensor, num_voxels: int, num_classes: int) -> torch.Tensor:
    """Per voxel, the most frequent class among its points with a class (``>= 0``); ties go to the
    smallest class id; voxels with no such point get ``IGNORE_INDEX``."""
    valid = point_labels >= 0
    hist = torch.zeros(num_voxels * num_classes, dtype=torch.int64)
    hist.index_add_(0, inverse[valid] * num_classes + point_labels[valid], torch.ones(int(valid.sum()), dtype=torch.int64))
    hist = hist.view(num_voxels, num_classes)
    best = hist.max(1, keepdim=True).values
    ids = torch.arange(num_classes).expand(num_voxels, num_classes)
    winner = torch.where(hist == best, ids, torch.full_like(ids, num_classes)).min(1).values  # smallest id among ties
    return torch.where(best.squeeze(1) > 0, winner, torch.full_like(winner, IGNORE_INDEX))


def _mean_by_voxel(point_feats: torch.Tensor, inverse: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    sums = torch.zeros(counts.shape[0], point_feats.shape[1], dtype=point_feats.dtype).index_add_(0, inverse, point_feats)
    return sums / counts.unsqueeze(1).to(sums.dtype)


def voxelize_scan(scan: Scan, voxel_size: float) -> Voxels:
    """Quantizes the scan at ``voxel_size``; mean features per voxel and majority-vote labels.

    The mean goes through ``lattice.ops.voxelize(..., reduction="mean")`` when the installed
    package has it and it returns the same voxel rows as ``sparse_quantize``; otherwise through
    ``index_add_`` over the quantizer's ``inverse`` / ``counts``.
    """
    start = time.perf_counter()
    pts = torch.from_numpy(np.ascontiguousarray(scan.points))
    xyz = pts[:, :3].contiguous()
    coords, inverse, counts = ops.sparse_quantize(xyz, voxel_size)
    scaled = xyz.double() / voxel_size
    offset = (scaled - torch.floor(scaled) - 0.5).float()
    height = (pts[:, 2:3] + SENSOR_HEIGHT_M) / HEIGHT_SCALE_M
    point_feats = torch.cat([offset, height, pts[:, 3:4]], 1).contiguous()
    feats, reducer = None, "index_add_ over sparse_quantize's inverse"
    if hasattr(ops, "voxelize"):
        try:
            v = ops.voxelize(xyz, point_feats, voxel_size, reduction="mean")
            if isinstance(v, SparseTensor) and torch.equal(v.coords, coords) and v.feats.shape == (len(coords), point_feats.shape[1]):
                feats, reducer = v.feats.detach().float().contiguous(), "lattice.ops.voxelize (mean)"
        except Exception:  # not landed in this form: the fallback below is exact
            feats = None
    if feats is None:
        feats = _mean_by_voxel(point_feats, inverse, counts)
    labels = majority_labels(inverse, torch.from_numpy(scan.labels), len(coords), len(scan.class_names))
    seconds = time.perf_counter() - start
    route = lattice.explain("sparse_quantize", xyz).chosen or "-"
    return Voxels(SparseTensor(coords, feats), labels, inverse, counts, seconds, route, reducer)


def holdout_tiles(coords: torch.Tensor, voxel_size: float, fraction: float, seed: int, tile_m: float = 8.0) -> torch.Tensor:
    """``(M,)`` bool: voxels in held-out ``tile_m`` x ``tile_m`` metre tiles of the ground plane, about
    ``fraction`` of the tiles, picked by a hash of the tile index and ``seed`` (deterministic)."""
    if fraction <= 0:
        return torch.zeros(len(coords), dtype=torch.bool)
    centre = (coords[:, 1:3].double() + 0.5) * voxel_size
    tile = torch.floor(centre / tile_m).to(torch.int64)
    h = (tile[:, 0] * 73856093) ^ (tile[:, 1] * 19349663) ^ (seed * 83492791 + 1234567)
    h = (h * 2654435761) & 0xFFFFFFFF  # Knuth's multiplicative mix, 32 bits
    return (h.double() / 2.0**32) < fraction

