"""Point-cloud file readers: KITTI velodyne scans and SemanticKITTI labels, LAS, PCD and PLY.

    import lattice
    pts = lattice.io.read_kitti("000000.bin")                 # (N, 4) float32: x, y, z, reflectance
    sem, inst = lattice.io.read_kitti_labels("000000.label")  # (N,) int64 each
    cloud = lattice.io.read("office1.pcd")                    # PointCloud: a dict of numpy arrays
    cloud["xyz"], cloud["colors"], cloud.width, cloud.height

The parsing happens in the C++ core (``lattice/io/io.h``), which checks every size a header
claims against the file before allocating; malformed files raise ``ValueError`` naming the reader,
the path and the problem (``[read_pcd] scan.pcd: expected ..., got ...``). A missing file raises
``FileNotFoundError``.

Results are **numpy arrays** (file I/O is framework-neutral and numpy keeps every file type,
uint16 included); ``torch.from_numpy(a)`` wraps one without a copy, and every lattice op accepts
numpy arrays as they are. Values keep the file's type (a PLY ``ushort`` is ``uint16``); the
only conversions are documented per reader (LAS coordinates are scaled to float64, SemanticKITTI
labels are widened to int64 so they can index and serve as class targets directly).
"""
from __future__ import annotations

import errno
import os
from typing import Any, Union

import numpy as np
import torch
import torch.utils.dlpack

from ._core import core

__all__ = ["PointCloud", "read", "read_kitti", "read_kitti_labels", "read_las", "read_pcd", "read_ply"]

PathLike = Union[str, "os.PathLike[str]"]


class PointCloud(dict):
    """A dict ``name -> numpy array`` (first axis: points) with the file's facts as attributes.

    Attributes:
        format: ``"kitti"``, ``"kitti_labels"``, ``"las"``, ``"pcd"`` or ``"ply"``.
        num_points: N.
        width, height: organized PCD clouds have ``width * height == N``, points stored row by row
            (``cloud["xyz"].reshape(height, width, 3)`` is the image layout), invalid points kept as
            NaN. Every other cloud has ``width == N`` and ``height == 1``.
        meta: header facts as strings in header order (e.g. LAS ``"scale"``, PCD ``"viewpoint"``).
    """

    format: str
    num_points: int
    width: int
    height: int
    meta: dict[str, str]

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.items())
        shape = f", width={self.width}, height={self.height}" if self.height != 1 else ""
        return f"PointCloud(format={self.format!r}, num_points={self.num_points}{shape}, {{{cols}}})"


def _path(path: PathLike, op: str) -> str:
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"[{op}] path: expected a str or os.PathLike, got {type(path).__name__}")
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(errno.ENOENT, f"[{op}] {p}: no such file", p)
    return p


def _numpy(capsule: Any) -> np.ndarray:
    """A numpy array viewing the core array behind a DLPack capsule (no copy)."""
    return torch.utils.dlpack.from_dlpack(capsule).numpy()


def _cloud(d: dict) -> PointCloud:
    cloud = PointCloud()
    for name, type_name, count, capsule in d["columns"]:
        raw = _numpy(capsule)  # (N, count * itemsize) uint8, host byte order
        values = raw.view(np.dtype(type_name))  # (N, count)
        cloud[name] = values.reshape(-1) if count == 1 else values
    cloud.format = d["format"]
    cloud.num_points = int(d["num_points"])
    cloud.width = int(d["width"])
    cloud.height = int(d["height"])
    cloud.meta = dict(d["meta"])
    return cloud


def read_kitti(path: PathLike) -> np.ndarray:
    """A KITTI velodyne scan (``.bin``: float32 x, y, z, reflectance per point, no header).

    Returns:
        ``(N, 4)`` float32 array (metres; reflectance in 0..1).

    Raises:
        ValueError: the file size is not a multiple of 16 bytes.
    """
    return _numpy(core.io_read_kitti(_path(path, "read_kitti")))


def read_kitti_labels(path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """SemanticKITTI labels (``.label``: one uint32 per point).

    Returns:
        ``(semantic, instance)``, each ``(N,)`` int64: the raw class id (low 16 bits, e.g. 10 car,
        40 road) and the instance id (high 16 bits).

    Raises:
        ValueError: the file size is not a multiple of 4 bytes.
    """
    semantic, instance = core.io_read_kitti_labels(_path(path, "read_kitti_labels"))
    return _numpy(semantic), _numpy(instance)


def read_las(path: PathLike) -> PointCloud:
    """An uncompressed LAS 1.0-1.4 file with point format 0, 1, 2, 3, 6, 7 or 8.

    Returns:
        PointCloud with ``"xyz"`` (N, 3) float64 (``raw * scale + offset``), ``"intensity"``
        uint16, ``"return_number"``, ``"number_of_returns"``, ``"classification"`` uint8 (formats
        0-3: the low 5 bits of the class byte; 6-8: the whole byte), ``"user_data"`` uint8,
        ``"point_source_id"`` uint16, and where the format has them ``"gps_time"`` float64
        (1, 3, 6, 7, 8), ``"rgb"`` (N, 3) uint16 (2, 3, 7, 8), ``"nir"`` uint16 (8).
        ``meta``: version, point_format, point_record_length, point_count, scale, offset, min,
        max, system_identifier, generating_software.

    Raises:
        ValueError: not a LAS file, LAZ, another point format, a header whose sizes or counts do
            not fit the file.
    """
    return _cloud(core.io_read(_path(path, "read_las"), "las"))


def read_pcd(path: PathLike) -> PointCloud:
    """A PCD v0.7 file (DATA ascii, binary or binary_compressed).

    Returns:
        PointCloud with every field by name (padding fields ``_`` dropped) with its type
        (``TYPE``/``SIZE``: I1 int8 ... U8 uint64, F4 float32, F8 float64), shape ``(N,)`` or
        ``(N, COUNT)``; derived ``"xyz"`` (N, 3) (float32 when x, y, z are F4, else float64) and
        ``"colors"`` (N, 3) uint8 RGB from a packed ``rgb`` field (0x00RRGGBB) or (N, 4) RGBA from
        ``rgba``. Organized clouds keep every point, NaN ones included (see ``PointCloud``).

    Raises:
        ValueError: a malformed header, unknown types, truncated or corrupt (LZF) data.
    """
    return _cloud(core.io_read(_path(path, "read_pcd"), "pcd"))


def read_ply(path: PathLike) -> PointCloud:
    """A PLY file (ascii, binary_little_endian or binary_big_endian).

    Returns:
        PointCloud with every scalar property of the ``vertex`` element (x, y, z required) with
        its type; derived ``"xyz"`` (N, 3) (float32 when x, y, z are float) and ``"colors"``
        (N, 3) or (N, 4) uint8 from uchar red, green, blue (alpha). Vertex list properties are
        skipped; other elements (faces, edges, ...) are skipped.

    Raises:
        ValueError: a malformed header, unknown property types, no vertex element, truncated data.
    """
    return _cloud(core.io_read(_path(path, "read_ply"), "ply"))


def read(path: PathLike) -> PointCloud:
    """Any supported file, by extension (case-insensitive).

    ``.bin`` (KITTI): ``{"xyz": (N, 3) float32, "reflectance": (N,) float32}``; ``.label``:
    ``{"semantic", "instance"}`` int64; ``.las``, ``.pcd``, ``.ply``: as ``read_las`` /
    ``read_pcd`` / ``read_ply``.

    Raises:
        ValueError: an unknown extension (``.laz`` included) or a malformed file.
    """
    p = _path(path, "read")
    if os.path.splitext(p)[1].lower() == ".label":
        semantic, instance = read_kitti_labels(p)
        cloud = PointCloud(semantic=semantic, instance=instance)
        cloud.format, cloud.num_points, cloud.width, cloud.height = "kitti_labels", len(semantic), len(semantic), 1
        cloud.meta = {}
        return cloud
    return _cloud(core.io_read(p))
