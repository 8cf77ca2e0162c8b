"""Benchmark inputs, labelled by public shape (BENCHMARKS.md "Workloads").

The anchor numbers in BENCHMARKS.md were measured on the generators of
``shared/bench/workloads.py``. When that file is present (``<repo>/../shared/bench``, or the
folder named by ``LATTICE_SHARED_DIR``) it is imported and used for every generator it has, so our
inputs are bit-identical to the anchor inputs. Without it the fallbacks below produce inputs of the
same kind (similar N and density, not identical rows); results are then marked ``source=fallback``
and are not comparable with the anchor tables.

Names understood by :func:`coords`:

=====================  ==========================================================================
``kitti``              the SemanticKITTI scan in shared/data at 5 cm (needs shared/data)
``kitti_x2``           that scan twice, batch ids 0 and 1 (batch 2)
``lidar``              synthetic 64-beam street scan at 5 cm (~86k rows)
``lidar_x2``           two synthetic scans (seeds 0, 1), batch 2
``lidar_small``        a 512-step azimuth version of ``lidar`` (~32k rows)
``lidar_tiny``         32 beams, 128 azimuth steps, 20 cm voxels (~4k rows; the smoke network)
``plane``/``grid``/``isolated``  the anchor versions (N = 200,000)
``dense64``            a full 64^3 block; ``dense<S>`` any side S
``grid_<N>``           uniform random cube at 10% occupancy with N rows (``grid_20k``, ``grid_1m``)
``plane_<N>``          three orthogonal sheets, N rows
``isolated_<N>``       N rows with no two inside one 3x3x3 window
``line<S>_<N>``        straight x-segments of S voxels laid on a lattice (gaps of 2), N rows
``block<S>_<N>``       dense S^3 cubes laid on a lattice (gaps of 2), N rows
=====================  ==========================================================================

Every function returns int32 coords (N, 4) ``(batch, x, y, z)`` with unique rows.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Optional

import numpy as np

__all__ = [
    "WorkloadUnavailable", "shared_dir", "shared_module", "coords", "points", "source", "describe",
    "kitti_path", "ANCHOR_WORKLOADS", "parse_count", "format_count",
]

ANCHOR_WORKLOADS = ("kitti", "lidar", "lidar_x2", "plane", "grid", "dense64", "isolated")


class WorkloadUnavailable(RuntimeError):
    """The workload needs a file (the KITTI scan) that is not on this machine."""


# -- locating shared/ ------------------------------------------------------------------------------

def _repo_root() -> Path:
    # python/lattice/bench/workloads.py -> repo root is three folders above this package's folder.
    return Path(__file__).resolve().parents[3]


@functools.lru_cache(maxsize=None)
def shared_dir() -> Optional[Path]:
    """The shared/ folder beside the repo, or None. ``LATTICE_SHARED_DIR`` replaces the search (set it
    to a missing folder to run as if shared/ were absent)."""
    env = os.environ.get("LATTICE_SHARED_DIR")
    candidates = [Path(env)] if env else [_repo_root().parent / "shared"]
    for c in candidates:
        if (c / "bench" / "workloads.py").is_file() or (c / "data").is_dir():
            return c.resolve()
    return None


@functools.lru_cache(maxsize=None)
def shared_module() -> Optional[ModuleType]:
    """shared/bench/workloads.py imported under a private name, or None when absent or disabled.

    ``LATTICE_BENCH_NO_SHARED=1`` forces the fallbacks (used to test them).
    """
    if os.environ.get("LATTICE_BENCH_NO_SHARED") == "1":
        return None
    d = shared_dir()
    if d is None or not (d / "bench" / "workloads.py").is_file():
        return None
    spec = importlib.util.spec_from_file_location("_lattice_shared_bench_workloads", d / "bench" / "workloads.py")
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kitti_path() -> Optional[Path]:
    d = shared_dir()
    if d is None:
        return None
    p = d / "data" / "semantickitti" / "000000.bin"
    return p if p.is_file() else None


# -- fallback generators (used only when shared/bench/workloads.py is absent) ----------------------

def _unique(c: np.ndarray) -> np.ndarray:
    return np.unique(np.ascontiguousarray(c, dtype=np.int32), axis=0)


def _with_batch(xyz: np.ndarray, batch: int = 0) -> np.ndarray:
    b = np.full((xyz.shape[0], 1), batch, dtype=np.int64)
    return _unique(np.concatenate([b, xyz.astype(np.int64)], axis=1))


def _ray_box(origin_dirs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Distance along each unit ray from the origin to an axis-aligned box (inf on a miss)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.where(np.abs(origin_dirs) < 1e-12, 1e-12, origin_dirs)
    a, b = lo * inv, hi * inv
    near = np.minimum(a, b).max(axis=1)
    far = np.maximum(a, b).min(axis=1)
    hit = (far >= near) & (far > 0)
    return np.where(hit, np.where(near > 0, near, far), np.inf)


def fallback_lidar_points(seed: int = 0, beams: int = 64, azimuth_steps: int = 2048) -> np.ndarray:
    """(P, 3) float64 points of a simulated spinning scan in a street canyon (sensor at 1.73 m)."""
    rng = np.random.default_rng(seed)
    h = 1.73
    elevation = np.radians(np.linspace(-24.8, 2.0, beams))
    azimuth = np.arange(azimuth_steps) * (2 * np.pi / azimuth_steps) - np.pi
    el, az = np.meshgrid(elevation, azimuth, indexing="ij")
    rays = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], axis=-1).reshape(-1, 3)
    dist = np.full(rays.shape[0], np.inf)
    down = rays[:, 2] < -1e-6
    dist[down] = h / -rays[down, 2]  # road surface
    for wall_y in (12.0, -11.0):  # facades either side of the street
        with np.errstate(divide="ignore", invalid="ignore"):
            t = wall_y / rays[:, 1]
        dist = np.where((t > 0) & np.isfinite(t), np.minimum(dist, t), dist)
    for _ in range(24):  # parked cars
        cx, cy = rng.uniform(-50, 50), rng.choice([-7.0, 7.0]) + rng.uniform(-0.5, 0.5)
        lo, hi = np.array([cx - 2.2, cy - 0.9, -h]), np.array([cx + 2.2, cy + 0.9, 1.5 - h])
        dist = np.minimum(dist, _ray_box(rays, lo, hi))
    for _ in range(40):  # poles and trunks
        cx, cy = rng.uniform(-60, 60), rng.choice([-9.5, 9.5])
        lo, hi = np.array([cx - 0.15, cy - 0.15, -h]), np.array([cx + 0.15, cy + 0.15, 4.0 - h])
        dist = np.minimum(dist, _ray_box(rays, lo, hi))
    keep = dist < 80.0
    pts = rays[keep] * dist[keep, None]
    return pts + rng.normal(0.0, 0.01, pts.shape)


def _fallback_lidar(seed: int = 0, voxel: float = 0.05, beams: int = 64, azimuth_steps: int = 2048,
                    batch: int = 0) -> np.ndarray:
    pts = fallback_lidar_points(seed=seed, beams=beams, azimuth_steps=azimuth_steps)
    return _with_batch(np.floor(pts / voxel), batch)


def _fallback_plane(n: int) -> np.ndarray:
    side = math.isqrt(n // 3) + 2
    u, v = (a.ravel() for a in np.meshgrid(np.arange(side), np.arange(side), indexing="ij"))
    o = np.zeros_like(u)
    xyz = np.concatenate([np.stack(s, 1) for s in ((u, v, o), (u, o, v), (o, u, v))])[:n]
    return _with_batch(xyz)


def _fallback_grid(n: int, density: float = 0.1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    side = max(1, round((n / density) ** (1.0 / 3.0)))
    cells = rng.choice(side**3, size=min(n, side**3), replace=False)
    return _with_batch(np.stack(np.unravel_index(cells, (side,) * 3), 1))


def _fallback_dense(side: int) -> np.ndarray:
    return _with_batch(np.stack(np.unravel_index(np.arange(side**3), (side,) * 3), 1))


def _fallback_isolated(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    side = math.ceil(n ** (1.0 / 3.0)) + 1
    cells = rng.choice(side**3, size=n, replace=False)
    return _with_batch(4 * np.stack(np.unravel_index(cells, (side,) * 3), 1))


def _fallback_kitti(path: Path, voxel: float = 0.05) -> np.ndarray:
    pts = np.fromfile(path, dtype=np.float32).reshape(-1, 4)[:, :3]
    return _with_batch(np.floor(pts / voxel))


# -- line and block families (ours; not in shared/) ------------------------------------------------

def shapes_on_lattice(shape: np.ndarray, n: int, pitch: tuple[int, int, int]) -> np.ndarray:
    """Copies of ``shape`` (M, 3 offsets) at the points of a cubic lattice of ``pitch``, first n rows.

    Copies are placed in x-fastest order on a lattice as close to a cube as possible; the last copy
    may be cut so that exactly n rows come back.
    """
    copies = -(-n // shape.shape[0])
    side = max(1, math.ceil(copies ** (1.0 / 3.0) - 1e-9))
    while side**3 < copies:
        side += 1
    idx = np.arange(copies)
    cell = np.stack([idx % side, (idx // side) % side, idx // (side * side)], 1) * np.asarray(pitch)
    xyz = (cell[:, None, :] + shape[None, :, :]).reshape(-1, 3)[:n]
    return _with_batch(xyz)


def line_family(side: int, n: int) -> np.ndarray:
    """x-aligned segments of ``side`` voxels, gaps of 2 between segments (no k3 contact)."""
    seg = np.stack([np.arange(side), np.zeros(side, int), np.zeros(side, int)], 1)
    return shapes_on_lattice(seg, n, (side + 2, 3, 3))


def block_family(side: int, n: int) -> np.ndarray:
    """Dense side^3 cubes, gaps of 2 between cubes."""
    cube = np.stack(np.unravel_index(np.arange(side**3), (side,) * 3), 1)
    return shapes_on_lattice(cube, n, (side + 2,) * 3)


# -- names -----------------------------------------------------------------------------------------

_COUNT = re.compile(r"^(\d+(?:\.\d+)?)([km]?)$")


def parse_count(text: str) -> int:
    """'20k' -> 20000, '1m' -> 1000000, '1e5' -> 100000, '12345' -> 12345."""
    t = text.strip().lower()
    m = _COUNT.match(t)
    if m:
        return int(round(float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2)]))
    return int(float(t))


def format_count(n: int) -> str:
    """20000 -> '20k', 1000000 -> '1m', 12345 -> '12345'."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


_SIZED = re.compile(r"^(grid|plane|isolated|line|block)(\d*)_(\w+)$")


def _shared_or(name: str):
    mod = shared_module()
    return getattr(mod, name, None) if mod is not None else None


def _batch2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    b = b.copy()
    b[:, 0] = 1
    return _unique(np.concatenate([a, b]))


def _generate(name: str) -> tuple[np.ndarray, str]:
    """(coords, source) where source is 'shared' or 'fallback'."""
    sh_lidar, sh_dense = _shared_or("lidar"), _shared_or("dense_block")
    if name in ("kitti", "kitti_x2"):
        sh_kitti = _shared_or("kitti")
        if sh_kitti is not None and kitti_path() is not None:
            one, src = sh_kitti(), "shared"
        elif kitti_path() is not None:
            one, src = _fallback_kitti(kitti_path()), "fallback"  # type: ignore[arg-type]
        else:
            raise WorkloadUnavailable("workload unavailable: kitti needs shared/data/semantickitti/000000.bin")
        return (one if name == "kitti" else _batch2(one, one)), src
    if name == "lidar":
        return (sh_lidar(), "shared") if sh_lidar else (_fallback_lidar(), "fallback")
    if name == "lidar_small":
        return (sh_lidar(azimuth_steps=512), "shared") if sh_lidar else (_fallback_lidar(azimuth_steps=512), "fallback")
    if name == "lidar_tiny":
        kw = {"voxel": 0.2, "beams": 32, "azimuth_steps": 128}
        return (sh_lidar(**kw), "shared") if sh_lidar else (_fallback_lidar(**kw), "fallback")
    if name == "lidar_x2":
        wl = _shared_or("WORKLOADS")
        if wl is not None and "lidar_x2" in wl:
            return _unique(wl["lidar_x2"]()), "shared"
        return _unique(np.concatenate([_fallback_lidar(seed=0, batch=0), _fallback_lidar(seed=1, batch=1)])), "fallback"
    if name in ("plane", "grid", "isolated"):
        return _generate(f"{name}_200k")
    m = re.match(r"^dense(\d+)$", name)
    if m:
        side = int(m.group(1))
        return (sh_dense(side), "shared") if sh_dense else (_fallback_dense(side), "fallback")
    m = _SIZED.match(name)
    if m:
        family, side_text, count = m.group(1), m.group(2), parse_count(m.group(3))
        if family in ("line", "block"):
            side = int(side_text or 4)
            return (line_family if family == "line" else block_family)(side, count), "lattice.bench"
        gen = _shared_or(family)
        if gen is not None:
            return gen(n=count), "shared"
        fallback = {"grid": _fallback_grid, "plane": _fallback_plane, "isolated": _fallback_isolated}[family]
        return fallback(count), "fallback"
    raise ValueError(f"[bench] workload: unknown name {name!r} (see lattice.bench.workloads)")


@functools.lru_cache(maxsize=64)
def _cached(name: str) -> tuple[np.ndarray, str]:
    c, src = _generate(name)
    c = np.ascontiguousarray(c, dtype=np.int32)
    c.setflags(write=False)
    return c, src


def coords(name: str) -> np.ndarray:
    """int32 (N, 4) coordinates of the named workload (cached; read-only)."""
    return _cached(name)[0]


def source(name: str) -> str:
    """'shared' (bit-identical to the anchor inputs), 'fallback' or 'lattice.bench' (our families)."""
    return _cached(name)[1]


def describe(name: str) -> str:
    return f"{name} ({source(name)}, N={coords(name).shape[0]})"


@functools.lru_cache(maxsize=8)
def points(name: str) -> np.ndarray:
    """(P, 3) float32 raw points for point->voxel cases: ``kitti_points`` or ``lidar_points``."""
    if name == "kitti_points":
        p = kitti_path()
        if p is None:
            raise WorkloadUnavailable("workload unavailable: kitti_points needs shared/data/semantickitti/000000.bin")
        return np.ascontiguousarray(np.fromfile(p, dtype=np.float32).reshape(-1, 4)[:, :3])
    if name == "lidar_points":
        return fallback_lidar_points().astype(np.float32)
    if name == "lidar_small_points":
        return fallback_lidar_points(azimuth_steps=512).astype(np.float32)
    raise ValueError(f"[bench] points: unknown name {name!r}")
