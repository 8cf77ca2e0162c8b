"""lattice.io readers: the shared real files (counts, bounds, values pinned from an independent
numpy decoder), small files written here for every format variant (tests/python/io_samples.py
builds them with numpy and struct, never with lattice), and one test per malformed-input branch,
each asserting the ``[read_<format>] <path>: expected ..., got ...`` message.

The real files live in <repo>/../shared/data (see its README.md); their tests skip, printing the
reason, when that folder is absent.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import lattice
import lattice.io as lio
from io_samples import (
    kitti_bytes,
    label_bytes,
    las_bytes,
    las_record_dtype,
    lzf_compress,
    pcd_bytes,
    pcd_sample_fields,
    ply_bytes,
    ply_sample_vertex,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
KITTI_BIN = DATA / "semantickitti" / "000000.bin"
KITTI_LABEL = DATA / "semantickitti" / "000000.label"
AUTZEN = DATA / "autzen" / "autzen_trim.las"
OFFICE = DATA / "pcl" / "office1.pcd"


def _need(path: Path) -> Path:
    if not path.exists():
        print(f"skipping: shared data file {path} is absent")
        pytest.skip(f"shared data file {path} is absent")
    return path


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _raises(reader: Callable, path: Path, op: str, part: str) -> str:
    with pytest.raises(ValueError) as info:
        reader(path)
    msg = str(info.value)
    assert msg.startswith(f"[{op}] {path}: expected "), msg
    assert part in msg, msg
    return msg


# ---- the shared real files ------------------------------------------------------------------------


def test_read_kitti_shared_scan_matches_numpy_decoder():
    pts = lio.read_kitti(_need(KITTI_BIN))
    assert pts.shape == (123389, 4) and pts.dtype == np.float32
    np.testing.assert_array_equal(pts, np.fromfile(KITTI_BIN, dtype="<f4").reshape(-1, 4))
    # pinned once from the numpy decoder
    assert pts[0].tolist() == [62.08046340942383, 5.705713748931885, 2.3168118000030518, 0.0]
    assert pts[1000].tolist() == [-17.65302276611328, -5.07185173034668, 0.951396107673645, 0.4000000059604645]
    lo, hi = pts.min(0), pts.max(0)
    assert -80 < lo[0] < -79.5 and -80 < lo[1] < -79.5 and 78.9 < hi[0] < 80 and 78 < hi[1] < 80  # +-80 m
    assert -27.7 < lo[2] < -27.6 and 2.9 < hi[2] < 3.0  # z -27.6 ... 3.0 m (README)
    assert lo[3] == 0.0 and hi[3] <= 1.0  # remission 0..1


def test_read_kitti_labels_shared_labels_split_class_and_instance():
    semantic, instance = lio.read_kitti_labels(_need(KITTI_LABEL))
    assert semantic.shape == instance.shape == (123389,)
    assert semantic.dtype == instance.dtype == np.int64
    raw = np.fromfile(KITTI_LABEL, dtype="<u4")
    np.testing.assert_array_equal(semantic, raw & 0xFFFF)
    np.testing.assert_array_equal(instance, raw >> 16)
    counts = dict(zip(*np.unique(semantic, return_counts=True)))
    # pinned: car, road, sidewalk, vegetation, terrain, moving-car
    assert {k: counts[k] for k in (10, 40, 48, 70, 72, 252)} == {
        10: 544, 40: 20975, 48: 30092, 70: 24514, 72: 30925, 252: 990}
    assert instance.max() == 198 and (semantic[1000], instance[1000]) == (70, 0)


def test_read_las_shared_autzen_matches_numpy_decoder():
    cloud = lio.read_las(_need(AUTZEN))
    raw = AUTZEN.read_bytes()
    offset, = struct.unpack_from("<I", raw, 96)
    n, = struct.unpack_from("<I", raw, 107)
    scale, shift = struct.unpack_from("<3d", raw, 131), struct.unpack_from("<3d", raw, 155)
    rec = np.frombuffer(raw, dtype=las_record_dtype(3), count=n, offset=offset)
    xyz = np.stack([rec[a] * s + o for a, s, o in zip("XYZ", scale, shift)], axis=1)
    assert cloud.num_points == n == 110000 and cloud.format == "las"
    np.testing.assert_array_equal(cloud["xyz"], xyz)
    np.testing.assert_array_equal(cloud["intensity"], rec["intensity"])
    np.testing.assert_array_equal(cloud["gps_time"], rec["gps_time"])
    np.testing.assert_array_equal(cloud["rgb"], np.stack([rec["red"], rec["green"], rec["blue"]], 1))
    cls, cnt = np.unique(cloud["classification"], return_counts=True)
    assert dict(zip(cls.tolist(), cnt.tolist())) == {1: 83893, 2: 26107}  # README
    # pinned once from the numpy decoder
    assert cloud["xyz"][0].tolist() == [637177.98, 849393.9500000001, 411.19]
    assert cloud["xyz"][-1].tolist() == [636037.88, 849336.9400000001, 423.2]
    assert cloud["gps_time"][0] == 245379.39843682514 and cloud["rgb"][0].tolist() == [84, 102, 93]
    assert int(cloud["intensity"][-1]) == 100 and cloud["rgb"][-1].tolist() == [64, 74, 70]
    lo, hi = cloud["xyz"].min(0), cloud["xyz"].max(0)
    # the header's bounds, to half the 0.01 scale (the writer rounded them on its own)
    np.testing.assert_allclose(lo, [float(v) for v in cloud.meta["min"].split()], rtol=0, atol=0.005)
    np.testing.assert_allclose(hi, [float(v) for v in cloud.meta["max"].split()], rtol=0, atol=0.005)
    assert 1170 < hi[0] - lo[0] < 1190 and 550 < hi[1] - lo[1] < 570  # about 1,180 x 560 ft
    assert cloud.meta["version"] == "1.2" and cloud.meta["point_format"] == "3"


def test_read_pcd_shared_office_is_organized_with_nan_points_kept():
    cloud = lio.read_pcd(_need(OFFICE))
    assert cloud.num_points == 307200 and (cloud.width, cloud.height) == (640, 480)
    assert cloud.meta["data"] == "binary_compressed" and cloud.meta["fields"] == "x y z rgb"
    xyz = cloud["xyz"]
    assert xyz.shape == (307200, 3) and xyz.dtype == np.float32
    finite = np.isfinite(xyz).all(1)
    assert finite.sum() == 254456 and np.isnan(xyz[~finite]).all()
    lo, hi = xyz[finite].min(0), xyz[finite].max(0)
    np.testing.assert_allclose(lo, [-2.65, -2.20, 1.83], atol=0.01)  # README extents
    np.testing.assert_allclose(hi, [1.50, 1.58, 5.36], atol=0.01)
    for k, axis in enumerate("xyz"):
        np.testing.assert_array_equal(cloud[axis], xyz[:, k])
    packed = cloud["rgb"].view(np.uint32)
    colors = cloud["colors"]
    assert colors.shape == (307200, 3) and colors.dtype == np.uint8
    np.testing.assert_array_equal(colors[:, 0], (packed >> 16) & 255)
    np.testing.assert_array_equal(colors[:, 2], packed & 255)
    image = xyz.reshape(cloud.height, cloud.width, 3)  # the organized layout, row by row
    assert np.isfinite(image[240, 320]).all()


def test_read_dispatches_on_extension_for_shared_files():
    _need(OFFICE)
    assert lio.read(KITTI_BIN)["xyz"].shape == (123389, 3)
    assert lio.read(KITTI_LABEL)["semantic"].shape == (123389,)
    assert lio.read(AUTZEN).format == "las"
    assert lio.read(str(OFFICE)).format == "pcd"


# ---- KITTI --------------------------------------------------------------------------------------


def test_read_kitti_small_scan_roundtrips(tmp_path, rng):
    pts = rng.normal(size=(7, 4)).astype(np.float32)
    p = _write(tmp_path, "s.bin", kitti_bytes(pts))
    np.testing.assert_array_equal(lio.read_kitti(p), pts)
    cloud = lio.read(p)
    np.testing.assert_array_equal(cloud["xyz"], pts[:, :3])
    np.testing.assert_array_equal(cloud["reflectance"], pts[:, 3])
    assert torch.from_numpy(cloud["xyz"]).shape == (7, 3)  # numpy results wrap into torch


def test_read_kitti_empty_file_gives_zero_points(tmp_path):
    assert lio.read_kitti(_write(tmp_path, "e.bin", b"")).shape == (0, 4)


def test_read_kitti_labels_small_file_roundtrips(tmp_path, rng):
    sem, inst = rng.integers(0, 65536, 9), rng.integers(0, 65536, 9)
    p = _write(tmp_path, "s.label", label_bytes(sem, inst))
    got_sem, got_inst = lio.read_kitti_labels(p)
    np.testing.assert_array_equal(got_sem, sem)
    np.testing.assert_array_equal(got_inst, inst)
    cloud = lio.read(p)
    assert cloud.format == "kitti_labels" and cloud.num_points == 9
    np.testing.assert_array_equal(cloud["semantic"], sem)


def test_read_kitti_size_not_multiple_of_16_raises(tmp_path):
    p = _write(tmp_path, "bad.bin", b"\0" * 20)
    _raises(lio.read_kitti, p, "read_kitti", "a file size that is a multiple of 16 bytes (4 float32 per point), got 20 bytes")


def test_read_kitti_labels_size_not_multiple_of_4_raises(tmp_path):
    p = _write(tmp_path, "bad.label", b"\0" * 6)
    _raises(lio.read_kitti_labels, p, "read_kitti_labels", "multiple of 4 bytes (one uint32 per point), got 6 bytes")


# ---- paths and dispatch -----------------------------------------------------------------------------


def test_read_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"\[read_pcd\] .*nope.pcd: no such file"):
        lio.read_pcd(tmp_path / "nope.pcd")


def test_read_directory_raises_value_error(tmp_path):
    d = tmp_path / "folder.pcd"
    d.mkdir()
    _raises(lio.read_pcd, d, "read_pcd", "a regular file, got a directory")


def test_read_unknown_extension_raises(tmp_path):
    p = _write(tmp_path, "cloud.xyz", b"1 2 3\n")
    _raises(lio.read, p, "read", "a file ending in .bin, .las, .pcd or .ply, got '.xyz'")


def test_read_laz_extension_raises(tmp_path):
    p = _write(tmp_path, "cloud.laz", b"LASF")
    _raises(lio.read, p, "read", "LAZ is not supported")


def test_read_extension_is_case_insensitive(tmp_path, rng):
    p = _write(tmp_path, "CLOUD.PLY", ply_bytes("ascii", ply_sample_vertex(rng, 3)))
    assert lio.read(p).format == "ply"


def test_read_non_path_raises_type_error():
    with pytest.raises(TypeError, match=r"\[read_las\] path: expected a str or os.PathLike, got int"):
        lio.read_las(3)


def test_io_is_part_of_the_package():
    assert lattice.io is lio and "read_pcd" in lio.__all__


def test_io_layer_includes_only_core_and_io_headers():
    """src/io and include/lattice/io depend on the core layer only (CMake: lattice_io -> lattice_core)."""
    import archcheck

    tree = archcheck.Tree(Path(__file__).resolve().parents[2])
    io_files = [r for r in tree.sources if r.startswith(("src/io/", "include/lattice/io"))]
    assert io_files, "no io sources found"
    found = [v for v in archcheck.layer_violations(tree) if v.startswith(("src/io/", "include/lattice/io"))]
    assert not found, "the io layer may reach only lattice/core, lattice/io, src/io and std:\n" + "\n".join(found)


# ---- LAS: every format at 1.2 and 1.4 ---------------------------------------------------------------


def _check_las(cloud: lio.PointCloud, expected: dict[str, np.ndarray]) -> None:
    assert set(cloud) == set(expected), (sorted(cloud), sorted(expected))
    for name, want in expected.items():
        got = cloud[name]
        assert got.dtype == (np.float64 if name in ("xyz", "gps_time") else want.dtype), name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("minor", [2, 4], ids=["v1.2", "v1.4"])
@pytest.mark.parametrize("fmt", [0, 1, 2, 3, 6, 7, 8])
def test_read_las_format_matches_record_layout(tmp_path, rng, minor, fmt):
    data, expected = las_bytes(rng, minor, fmt, 25)
    cloud = lio.read_las(_write(tmp_path, "p.las", data))
    assert cloud.num_points == 25 and cloud.meta["point_format"] == str(fmt)
    assert cloud.meta["version"] == f"1.{minor}"
    _check_las(cloud, expected)
    if fmt >= 6:  # the whole class byte, values above 31 included
        assert (cloud["classification"] > 31).any()


@pytest.mark.parametrize("fmt", [1, 7])
def test_read_las_longer_records_skip_extra_bytes(tmp_path, rng, fmt):
    data, expected = las_bytes(rng, 4, fmt, 10, extra=5, vlr_gap=3)
    cloud = lio.read_las(_write(tmp_path, "p.las", data))
    assert cloud.meta["point_record_length"] == str(las_record_dtype(fmt).itemsize + 5)
    _check_las(cloud, expected)


def test_read_las_version_13_header_reads(tmp_path, rng):
    data, expected = las_bytes(rng, 3, 3, 6)
    _check_las(lio.read_las(_write(tmp_path, "p.las", data)), expected)


def test_read_las_14_zero_64bit_count_uses_legacy_count(tmp_path, rng):
    data, expected = las_bytes(rng, 4, 1, 6, legacy_count=6, count64=0)
    _check_las(lio.read_las(_write(tmp_path, "p.las", data)), expected)


def test_read_las_14_format6_legacy_zero_uses_64bit_count(tmp_path, rng):
    data, expected = las_bytes(rng, 4, 6, 6, legacy_count=0, count64=6)
    assert lio.read_las(_write(tmp_path, "p.las", data)).num_points == 6


def test_read_las_zero_points_gives_empty_columns(tmp_path, rng):
    data, _ = las_bytes(rng, 2, 3, 0)
    cloud = lio.read_las(_write(tmp_path, "p.las", data))
    assert cloud.num_points == 0 and cloud["xyz"].shape == (0, 3) and cloud["rgb"].shape == (0, 3)


def test_read_las_meta_holds_scale_and_offset(tmp_path, rng):
    data, _ = las_bytes(rng, 2, 0, 3)
    meta = lio.read_las(_write(tmp_path, "p.las", data)).meta
    assert meta["scale"] == "0.01 0.02 0.001" and meta["offset"] == "1000 -2000 5.5"
    assert meta["system_identifier"] == "TEST" and meta["generating_software"] == "io_samples"


def _las_patch(rng, minor=2, fmt=3, n=4, **patch) -> bytes:
    data = bytearray(las_bytes(rng, minor, fmt, n)[0])
    for offset, (code, value) in patch.items():
        struct.pack_into(code, data, int(offset[1:]), value)
    return bytes(data)


LAS_ERRORS = {
    "wrong_magic": (lambda rng: b"LASX" + las_bytes(rng, 2, 0, 1)[0][4:], "the LAS signature 'LASF', got 'LASX'"),
    "short_file": (lambda rng: b"LASF" + bytes(100), "a LAS public header of at least 227 bytes, got a file of 104 bytes"),
    "version_minor": (lambda rng: _las_patch(rng, o25=("<B", 5)), "LAS version 1.0-1.4, got 1.5"),
    "version_major": (lambda rng: _las_patch(rng, o24=("<B", 2)), "LAS version 1.0-1.4, got 2.2"),
    "header_size_small": (lambda rng: _las_patch(rng, minor=4, fmt=6, o94=("<H", 227)),
                          "a header size of at least 375 bytes for LAS 1.4, got 227 bytes"),
    "header_beyond_file": (lambda rng: _las_patch(rng, o94=("<H", 60000)),
                           "a header of 60000 bytes (its header size field), got a file of"),
    "point_offset_in_header": (lambda rng: _las_patch(rng, o96=("<I", 100)),
                               "an offset to point data at or after the header (227 bytes), got 100"),
    "laz": (lambda rng: _las_patch(rng, o104=("<B", 0x83)), "LAZ is not supported), got point format byte 131"),
    "format_4": (lambda rng: _las_patch(rng, o104=("<B", 4)), "point data format 0, 1, 2, 3, 6, 7 or 8, got 4"),
    "record_too_short": (lambda rng: _las_patch(rng, o105=("<H", 33)),
                         "a point record length of at least 34 bytes for point format 3, got 33 bytes"),
    "legacy_count_mismatch": (lambda rng: _las_patch(rng, minor=4, fmt=1, o107=("<I", 3)),
                              "a legacy point count of 0 or equal to the LAS 1.4 point count (4), got 3"),
    "truncated": (lambda rng: las_bytes(rng, 2, 3, 4)[0][:-10],
                  "4 points x 34 bytes = 136 bytes of point data at offset 281, got a file of"),
    "point_offset_beyond_file": (lambda rng: _las_patch(rng, o96=("<I", 2**32 - 1)), "bytes of point data at offset 4294967295"),
    "huge_legacy_count": (lambda rng: _las_patch(rng, o107=("<I", 2**32 - 1)), "expected 4294967295 points x 34 bytes"),
    "header_promises_1e12_points": (lambda rng: _las_patch(rng, minor=4, fmt=6, o247=("<Q", 10**12)),
                                    "expected 1000000000000 points x 30 bytes = 30000000000000 bytes"),
    "size_overflow": (lambda rng: _las_patch(rng, minor=4, fmt=6, o247=("<Q", 2**64 - 1)),
                      "the point data size to fit in 64 bits, got 18446744073709551615 x 30 (overflow)"),
}


@pytest.mark.parametrize("case", list(LAS_ERRORS))
def test_read_las_malformed_raises_value_error(tmp_path, rng, case):
    make, part = LAS_ERRORS[case]
    _raises(lio.read_las, _write(tmp_path, "bad.las", make(rng)), "read_las", part)


# ---- PCD ----------------------------------------------------------------------------------------------

ALL_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]


def _typed_values(rng, dtype: str, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.normal(size=shape).astype(dt) * 100
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    v.flat[0], v.flat[-1] = info.min, info.max  # the extremes survive ascii and binary
    return v


@pytest.mark.parametrize("data", ["ascii", "binary", "binary_compressed"])
def test_read_pcd_every_type_and_count_returns_each_field(tmp_path, rng, data):
    n = 6
    fields = [("x", _typed_values(rng, "float32", n)), ("y", _typed_values(rng, "float32", n)),
              ("z", _typed_values(rng, "float32", n))]
    fields += [(f"f_{t}", _typed_values(rng, t, (n, 1 + k % 3))) for k, t in enumerate(ALL_TYPES)]
    fields.append(("normal", np.zeros((n, 3), np.float32)))  # zeros: LZF back references
    cloud = lio.read_pcd(_write(tmp_path, "t.pcd", pcd_bytes(fields, data)))
    assert cloud.num_points == n and cloud.meta["data"] == data
    for name, want in fields:
        want = want if want.ndim == 1 or want.shape[1] > 1 else want[:, 0]
        assert cloud[name].dtype == want.dtype and cloud[name].shape == want.shape, name
        np.testing.assert_array_equal(cloud[name], want, err_msg=name)
    np.testing.assert_array_equal(cloud["xyz"], np.stack([fields[k][1] for k in range(3)], 1))
    assert "colors" not in cloud


@pytest.mark.parametrize("data", ["ascii", "binary", "binary_compressed"])
def test_read_pcd_packed_rgb_gives_uint8_colors(tmp_path, rng, data):
    fields = pcd_sample_fields(rng, 7)
    cloud = lio.read_pcd(_write(tmp_path, "c.pcd", pcd_bytes(fields, data)))
    packed = fields[3][1].view(np.uint32)
    want = np.stack([(packed >> 16) & 255, (packed >> 8) & 255, packed & 255], 1).astype(np.uint8)
    np.testing.assert_array_equal(cloud["colors"], want)
    np.testing.assert_array_equal(cloud["hist"], fields[5][1])
    assert np.isnan(cloud["xyz"][1]).all()  # NaN points are kept


def test_read_pcd_rgba_gives_four_channels(tmp_path):
    rgba = np.array([0x80FF0010, 0x01020304], dtype=np.uint32)
    fields = [("x", np.zeros(2, np.float32)), ("y", np.zeros(2, np.float32)), ("z", np.zeros(2, np.float32)),
              ("rgba", rgba)]
    cloud = lio.read_pcd(_write(tmp_path, "c.pcd", pcd_bytes(fields, "binary")))
    assert cloud["colors"].tolist() == [[255, 0, 16, 128], [2, 3, 4, 1]]


@pytest.mark.parametrize("data", ["ascii", "binary", "binary_compressed"])
def test_read_pcd_organized_cloud_keeps_nan_points_row_by_row(tmp_path, data):
    w, h = 4, 3
    xyz = np.arange(w * h * 3, dtype=np.float32).reshape(w * h, 3)
    xyz[[1, 5, 11]] = np.nan
    fields = [("x", xyz[:, 0]), ("y", xyz[:, 1]), ("z", xyz[:, 2])]
    cloud = lio.read_pcd(_write(tmp_path, "o.pcd", pcd_bytes(fields, data, width=w, height=h)))
    assert (cloud.num_points, cloud.width, cloud.height) == (12, 4, 3)
    np.testing.assert_array_equal(cloud["xyz"], xyz)
    assert np.isnan(cloud["xyz"].reshape(h, w, 3)[2, 3]).all()


def test_read_pcd_float64_xyz_gives_float64_stack(tmp_path, rng):
    fields = [("x", rng.normal(size=3)), ("y", rng.normal(size=3).astype(np.float32)), ("z", np.arange(3, dtype=np.int32))]
    cloud = lio.read_pcd(_write(tmp_path, "d.pcd", pcd_bytes(fields, "binary")))
    assert cloud["xyz"].dtype == np.float64
    np.testing.assert_array_equal(cloud["xyz"], np.stack([f[1].astype(np.float64) for f in fields], 1))


@pytest.mark.parametrize("data", ["binary", "binary_compressed"])
def test_read_pcd_padding_fields_are_dropped(tmp_path, data):
    fields = [("x", np.array([1, 2], np.float32)), ("_", np.zeros((2, 4), np.uint8)), ("y", np.array([3, 4], np.float32)),
              ("z", np.array([5, 6], np.float32))]
    text = pcd_bytes(fields, data)
    cloud = lio.read_pcd(_write(tmp_path, "p.pcd", text))
    assert "_" not in cloud and cloud["xyz"].tolist() == [[1, 3, 5], [2, 4, 6]]


@pytest.mark.parametrize("data", ["ascii", "binary", "binary_compressed"])
def test_read_pcd_zero_points_gives_empty_columns(tmp_path, data):
    fields = [("x", np.zeros(0, np.float32)), ("y", np.zeros(0, np.float32)), ("z", np.zeros(0, np.float32))]
    cloud = lio.read_pcd(_write(tmp_path, "e.pcd", pcd_bytes(fields, data)))
    assert cloud.num_points == 0 and cloud["xyz"].shape == (0, 3)


def test_read_pcd_ascii_accepts_signs_nan_inf_and_crlf(tmp_path):
    text = ("# comment\r\n\r\nVERSION .7\r\nFIELDS x y z\r\nSIZE 4 4 8\r\nTYPE F F F\r\nWIDTH 3\r\nDATA ascii\r\n"
            "+1.5 NaN -inf\r\n1e39 -1e39 1e-400\r\n0 0 -0.0001e+400\r\n")
    cloud = lio.read_pcd(_write(tmp_path, "a.pcd", text.encode()))
    x = cloud["xyz"]
    assert x.dtype == np.float64 and x[0, 0] == 1.5 and np.isnan(x[0, 1]) and x[0, 2] == -np.inf
    assert cloud["x"][1] == np.inf and cloud["y"][1] == -np.inf  # float32 overflow rounds to inf
    assert x[1, 2] == 0.0 and x[2, 2] == -np.inf  # float64 underflow gives 0, overflow inf (as strtod)


def test_read_pcd_without_points_and_height_uses_width(tmp_path):
    text = b"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nWIDTH 2\nDATA ascii\n1 2 3\n4 5 6\n"
    cloud = lio.read_pcd(_write(tmp_path, "a.pcd", text))
    assert (cloud.num_points, cloud.width, cloud.height) == (2, 2, 1)


def test_read_pcd_points_without_width_is_unorganized(tmp_path):
    text = b"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1\nDATA ascii\n1 2 3\n"
    assert lio.read_pcd(_write(tmp_path, "a.pcd", text)).num_points == 1


def _pcd(fields="x y z", size="4 4 4", type_="F F F", count="1 1 1", width="2", height="1", points="2",
         data="ascii", version="0.7", extra="", body=b"1 2 3\n4 5 6\n") -> bytes:
    lines = [("VERSION", version), ("FIELDS", fields), ("SIZE", size), ("TYPE", type_), ("COUNT", count),
             ("WIDTH", width), ("HEIGHT", height), ("POINTS", points)]
    head = "".join(f"{k} {v}\n" for k, v in lines if v is not None) + extra
    if data is not None:
        head += f"DATA {data}\n"
    return head.encode() + body


def _compressed(plain_size: int, stream: bytes, compressed_size=None) -> bytes:
    size = len(stream) if compressed_size is None else compressed_size
    return struct.pack("<II", size, plain_size) + stream


PCD_ERRORS = {
    "wrong_magic": (b"LASF\x01\x02\x00\n", "a PCD header starting with 'VERSION 0.7' (after # comments), got 'LASF\\x01\\x02\\x00'"),
    "empty_file": (b"", "a PCD header line ending in DATA, got the end of the file"),
    "version": (_pcd(version="0.6"), "VERSION 0.7, got '0.6'"),
    "keyword_twice": (_pcd(extra="WIDTH 2\n"), "each PCD header keyword once, got 'WIDTH' twice"),
    "unknown_keyword": (_pcd(extra="COLOR 1\n"), "a PCD header keyword (VERSION, FIELDS"),
    "keyword_two_values": (_pcd(width="2 3"), "one value after WIDTH, got 2 values"),
    "width_not_integer": (_pcd(width="-2"), "WIDTH as a non-negative integer, got '-2'"),
    "data_kind": (_pcd(data="gzip"), "DATA ascii, binary or binary_compressed, got 'gzip'"),
    "no_data_line": (_pcd(data=None, body=b""), "a PCD header line ending in DATA, got the end of the file"),
    "no_fields": (_pcd(fields=None), "a FIELDS line naming at least one field, got none"),
    "size_entries": (_pcd(size="4 4"), "SIZE with 3 entries (one per field: x y z), got 2 entries"),
    "type_entries": (_pcd(type_="F F"), "TYPE with 3 entries"),
    "count_entries": (_pcd(count="1"), "COUNT with 3 entries"),
    "count_zero": (_pcd(count="1 0 1"), "COUNT of field 'y' at least 1, got 0"),
    "count_huge": (_pcd(count="1 1 5000000000"), "COUNT of field 'z' at most 2^32, got 5000000000"),
    "unknown_type": (_pcd(type_="F F X"), "got TYPE 'X' SIZE '4'"),
    "float_size_2": (_pcd(size="4 4 2"), "got TYPE 'F' SIZE '2'"),
    "int_size_3": (_pcd(size="4 4 3", type_="F F I"), "got TYPE 'I' SIZE '3'"),
    "duplicate_field": (_pcd(fields="x y x"), "distinct field names, got 'x' twice"),
    "too_many_fields": (_pcd(fields=" ".join(f"f{i}" for i in range(10001)), size=None, type_=None, count=None),
                        "at most 10000 FIELDS, got 10001"),
    "no_width_or_points": (_pcd(width=None, points=None), "WIDTH and HEIGHT (or POINTS), got neither"),
    "points_mismatch": (_pcd(points="3"), "POINTS = WIDTH x HEIGHT = 2 x 1 = 2, got 3"),
    "width_height_overflow": (_pcd(width=str(2**32), height=str(2**32), points=None),
                              "WIDTH x HEIGHT to fit in 64 bits, got 4294967296 x 4294967296 (overflow)"),
    "data_size_overflow": (_pcd(width=str(2**62), points=None, size="8 8 8", count="1 1 4"),
                           "the point data size to fit in 64 bits"),
    "ascii_promises_1e12_points": (_pcd(width=str(10**12), points=None),
                                   "1000000000000 points x 3 values of ascii data (at least one byte each), got 12 bytes of data"),
    "ascii_truncated": (_pcd(body=b"1 2 3\n4\n"), "6 ascii values (2 points x 3), got the end of the data after 4 values"),
    "ascii_bad_float": (_pcd(body=b"1 2 abc\n4 5 6\n"), "field 'z' of point 0 as float32 (a decimal number, nan or inf), got 'abc'"),
    "ascii_int_out_of_range": (_pcd(size="4 4 1", type_="F F U", body=b"1 2 3\n4 5 300\n"),
                               "field 'z' of point 1 as uint8 (a decimal integer in range), got '300'"),
    "ascii_extra_values": (_pcd(body=b"1 2 3\n4 5 6\n7\n"), "more data after the last point"),
    "binary_truncated": (_pcd(data="binary", body=bytes(20)), "2 points x 12 bytes = 24 bytes of binary data at offset"),
    "binary_promises_1e12_points": (_pcd(data="binary", width=str(10**12), points=None, body=bytes(24)),
                                    "1000000000000 points x 12 bytes = 12000000000000 bytes of binary data"),
    "compressed_sizes_missing": (_pcd(data="binary_compressed", body=b"\x01\x02\x03"),
                                 "4 bytes of the compressed size at offset"),
    "compressed_size_mismatch": (_pcd(data="binary_compressed", body=_compressed(999, b"\x00\x00")),
                                 "an uncompressed size of 2 points x 12 bytes = 24, got 999"),
    "compressed_truncated": (_pcd(data="binary_compressed", body=_compressed(24, b"\x00" * 10, compressed_size=100)),
                             "100 bytes of compressed data at offset"),
    "compressed_expansion": (_pcd(data="binary_compressed", width="300000000", points=None,
                                  body=_compressed(3600000000, b"\x00" * 10)),
                             "an uncompressed size LZF can reach from 10 bytes (at most 88x), got 3600000000 bytes"),
    "compressed_corrupt": (_pcd(data="binary_compressed", body=_compressed(24, b"\x20\x05" + b"\x00" * 4)),
                           "LZF data that decompresses to 24 bytes, got a back reference 6 bytes back at output offset 0"),
    "compressed_short": (_pcd(data="binary_compressed", body=_compressed(24, lzf_compress(bytes(range(20))))),
                         "LZF data that decompresses to 24 bytes, got 20 bytes"),
}


@pytest.mark.parametrize("case", list(PCD_ERRORS))
def test_read_pcd_malformed_raises_value_error(tmp_path, case):
    data, part = PCD_ERRORS[case]
    _raises(lio.read_pcd, _write(tmp_path, "bad.pcd", data), "read_pcd", part)


# ---- PLY ----------------------------------------------------------------------------------------------

PLY_ENCODINGS = ["ascii", "binary_little_endian", "binary_big_endian"]
PLY_TYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "float32", "float64"]


@pytest.mark.parametrize("faces_first", [True, False], ids=["faces_before_vertex", "faces_after_vertex"])
@pytest.mark.parametrize("encoding", PLY_ENCODINGS)
def test_read_ply_every_scalar_type_with_other_elements(tmp_path, rng, encoding, faces_first):
    n = 5
    vertex = [("x", _typed_values(rng, "float32", n)), ("y", _typed_values(rng, "float32", n)),
              ("z", _typed_values(rng, "float32", n))]
    vertex += [(f"p_{t}", _typed_values(rng, t, n)) for t in PLY_TYPES]
    data = ply_bytes(encoding, vertex, faces=[(0, 1, 2), (4, 3, 2, 1), ()], faces_first=faces_first,
                     vertex_list=True)
    cloud = lio.read_ply(_write(tmp_path, "t.ply", data))
    assert cloud.num_points == n and cloud.meta["format"] == encoding
    assert cloud.meta["elements"] == ("edge 2, face 3, vertex 5" if faces_first else "vertex 5, face 3, edge 2")
    for name, want in vertex:
        assert cloud[name].dtype == want.dtype, name
        np.testing.assert_array_equal(cloud[name], want, err_msg=name)
    assert "extras" not in cloud  # vertex list properties are skipped
    assert cloud["xyz"].dtype == np.float32
    np.testing.assert_array_equal(cloud["xyz"], np.stack([v for _, v in vertex[:3]], 1))


@pytest.mark.parametrize("encoding", PLY_ENCODINGS)
def test_read_ply_uchar_red_green_blue_give_colors(tmp_path, rng, encoding):
    vertex = ply_sample_vertex(rng, 4)
    cloud = lio.read_ply(_write(tmp_path, "c.ply", ply_bytes(encoding, vertex)))
    want = np.stack([vertex[3][1], vertex[4][1], vertex[5][1]], 1)
    np.testing.assert_array_equal(cloud["colors"], want)
    np.testing.assert_array_equal(cloud["quality"], vertex[6][1])
    assert cloud.meta["comments"] == "io_samples"


def test_read_ply_alpha_gives_four_channels_and_type_aliases(tmp_path):
    text = (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float32 x\nproperty float64 y\nproperty int16 z\n"
            b"property uint8 red\nproperty uint8 green\nproperty uint8 blue\nproperty uint8 alpha\nend_header\n"
            b"1 2 3 4 5 6 7\n")
    cloud = lio.read_ply(_write(tmp_path, "a.ply", text))
    assert cloud["colors"].tolist() == [[4, 5, 6, 7]] and cloud["z"].dtype == np.int16
    assert cloud["xyz"].dtype == np.float64 and cloud["xyz"].tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("encoding", PLY_ENCODINGS)
def test_read_ply_zero_vertices_gives_empty_columns(tmp_path, encoding):
    vertex = [(a, np.zeros(0, np.float32)) for a in "xyz"]
    cloud = lio.read_ply(_write(tmp_path, "e.ply", ply_bytes(encoding, vertex, faces=[])))
    assert cloud.num_points == 0 and cloud["xyz"].shape == (0, 3)


def test_read_ply_crlf_header_reads(tmp_path):
    text = b"ply\r\nformat binary_little_endian 1.0\r\nelement vertex 1\r\nproperty float x\r\nproperty float y\r\n" \
           b"property float z\r\nend_header\r\n" + np.array([1, 2, 3], "<f4").tobytes()
    assert lio.read_ply(_write(tmp_path, "c.ply", text))["xyz"].tolist() == [[1, 2, 3]]


def _ply(body: bytes = b"", header: str = "element vertex 1\nproperty float x\nproperty float y\nproperty float z\n",
         fmt: str = "format ascii 1.0\n") -> bytes:
    return f"ply\n{fmt}{header}end_header\n".encode() + body


XYZ = "property float x\nproperty float y\nproperty float z\n"
FACE = "element face 1\nproperty list uchar int vertex_indices\n"
LE = "format binary_little_endian 1.0\n"

PLY_ERRORS = {
    "wrong_magic": (b"PLY\nformat ascii 1.0\n", "the PLY signature 'ply' on the first line, got 'PLY'"),
    "binary_magic": (b"LASF\x00\x01\n", "the PLY signature 'ply' on the first line, got 'LASF\\x00\\x01'"),
    "empty_file": (b"", "the PLY signature 'ply' on the first line, got ''"),
    "no_format": (_ply(fmt=""), "a 'format' line in the PLY header, got none"),
    "format_twice": (_ply(fmt="format ascii 1.0\nformat ascii 1.0\n"), "one format line, got two"),
    "format_words": (_ply(fmt="format ascii\n"), "'format <ascii|binary_little_endian|binary_big_endian> 1.0', got 'format ascii'"),
    "format_kind": (_ply(fmt="format binary 1.0\n"), "format ascii, binary_little_endian or binary_big_endian, got 'binary'"),
    "format_version": (_ply(fmt="format ascii 2.0\n"), "PLY format version 1.0, got '2.0'"),
    "element_words": (_ply(header="element vertex\n"), "'element <name> <count>', got 'element vertex'"),
    "element_count": (_ply(header="element vertex -1\n"), "the count of element 'vertex' as a non-negative integer, got '-1'"),
    "property_before_element": (_ply(header="property float x\n"), "an element line before the first property"),
    "property_words": (_ply(header="element vertex 1\nproperty float\n"), "'property <type> <name>', got 'property float'"),
    "list_words": (_ply(header="element face 1\nproperty list uchar int\n"),
                   "'property list <count type> <item type> <name>'"),
    "unknown_type": (_ply(header="element vertex 1\nproperty int128 x\n"), "a PLY property type (char, uchar"),
    "float_list_count": (_ply(header="element face 1\nproperty list float int idx\n"),
                         "an integer list count type for property 'idx', got 'float'"),
    "duplicate_property": (_ply(header="element vertex 1\n" + XYZ + "property float x\n"),
                           "distinct property names in element 'vertex', got 'x' twice"),
    "unknown_keyword": (_ply(header="elements vertex 1\n"), "a PLY header keyword (format, comment"),
    "no_end_header": (b"ply\nformat ascii 1.0\nelement vertex 1\n", "a PLY header line (the header ends with end_header), got the end of the file"),
    "too_many_elements": (_ply(header="".join(f"element e{i} 0\n" for i in range(10001))), "at most 10000 elements, got more"),
    "too_many_properties": (_ply(header="element vertex 0\n" + "".join(f"property float p{i}\n" for i in range(10001))),
                            "at most 10000 properties per element, got more"),
    "no_vertex": (_ply(header=FACE), "an element named 'vertex', got elements 'face'"),
    "no_elements": (_ply(header=""), "an element named 'vertex', got no elements"),
    "missing_z": (_ply(header="element vertex 1\nproperty float x\nproperty float y\n"),
                  "scalar vertex properties x, y and z, got no scalar 'z'"),
    "list_z": (_ply(header="element vertex 1\nproperty float x\nproperty float y\nproperty list uchar float z\n"),
               "got no scalar 'z'"),
    "binary_promises_1e12_vertices": (_ply(header="element vertex 1000000000000\n" + XYZ, fmt=LE, body=bytes(12)),
                                      "1000000000000 vertices x 12 bytes = 12000000000000 bytes at offset"),
    "binary_vertex_size_overflow": (_ply(header=f"element vertex {2**62}\n" + XYZ, fmt=LE),
                                    "the vertex data size to fit in 64 bits"),
    "binary_vertex_truncated": (_ply(header="element vertex 2\n" + XYZ, fmt=LE, body=bytes(18)),
                                "2 vertices x 12 bytes = 24 bytes at offset"),
    "binary_fixed_element_overflow": (_ply(header=f"element edge {10**19}\nproperty int a\nproperty int b\n"
                                                  "element vertex 0\n" + XYZ, fmt=LE),
                                      "the size of element 'edge' to fit in 64 bits"),
    "binary_fixed_element_truncated": (_ply(header="element edge 5\nproperty int a\nproperty int b\nelement vertex 0\n" + XYZ,
                                            fmt=LE, body=bytes(8)),
                                       "40 bytes of element 'edge' (5 records)"),
    "binary_face_truncated": (_ply(header="element face 5\nproperty list uchar int vertex_indices\nelement vertex 0\n" + XYZ,
                                   fmt=LE, body=b"\x01\x00\x00\x00\x00"),
                              "1 byte of element 'face' at offset"),
    "binary_face_list_truncated": (_ply(header=FACE + "element vertex 0\n" + XYZ, fmt=LE, body=b"\x03\x00\x00"),
                                   "12 bytes of element 'face'"),
    "binary_negative_list_length": (_ply(header="element face 1\nproperty list char int vertex_indices\nelement vertex 0\n" + XYZ,
                                         fmt=LE, body=b"\xff"),
                                    "a non-negative list length of property 'vertex_indices' in element 'face', got -1"),
    "binary_huge_list_length": (_ply(header="element face 1\nproperty list uint double vertex_indices\nelement vertex 0\n" + XYZ,
                                     fmt=LE, body=b"\xff" * 4),
                                "34359738360 bytes of element 'face'"),
    "int64_type": (_ply(header="element vertex 1\nproperty int64 x\n"), "a PLY property type (char, uchar"),
    "binary_vertex_list_truncated": (_ply(header="element vertex 1\n" + XYZ + "property list uchar float extras\n", fmt=LE,
                                          body=bytes(12) + b"\x05" + bytes(4)),
                                     "20 bytes of vertex list 'extras'"),
    "ascii_promises_1e12_vertices": (_ply(header="element vertex 1000000000000\n" + XYZ, body=b"1 2 3\n"),
                                     "1000000000000 vertices x 3 values of ascii data (at least one byte each), got 6 bytes left"),
    "ascii_truncated": (_ply(header="element vertex 2\n" + XYZ, body=b"1 2 3\n4 5\n"),
                        "property 'z' of vertex 1 (of 2), got the end of the file"),
    "ascii_bad_value": (_ply(body=b"1 2 x\n"), "property 'z' of vertex 0 as float32 (a decimal number, nan or inf), got 'x'"),
    "ascii_float_for_uchar": (_ply(header="element vertex 1\n" + XYZ + "property uchar red\n", body=b"1 2 3 1.5\n"),
                              "property 'red' of vertex 0 as uint8 (a decimal integer in range), got '1.5'"),
    "ascii_face_negative_length": (_ply(header=FACE + "element vertex 0\n" + XYZ, body=b"-3 0 1 2\n"),
                                   "a non-negative list length of property 'vertex_indices' in element 'face', got '-3'"),
    "ascii_face_truncated": (_ply(header=FACE + "element vertex 0\n" + XYZ, body=b"5 0 1\n"),
                             "a value of element 'face', got the end of the file"),
    "ascii_vertex_list_bad_length": (_ply(header="element vertex 1\n" + XYZ + "property list uchar float extras\n",
                                          body=b"1 2 3 x\n"),
                                     "a non-negative list length of vertex property 'extras', got 'x'"),
    "ascii_vertex_list_truncated": (_ply(header="element vertex 1\n" + XYZ + "property list uchar float extras\n",
                                         body=b"1 2 3 4 0.5\n"),
                                    "an item of vertex list 'extras', got the end of the file"),
}


@pytest.mark.parametrize("case", list(PLY_ERRORS))
def test_read_ply_malformed_raises_value_error(tmp_path, case):
    data, part = PLY_ERRORS[case]
    _raises(lio.read_ply, _write(tmp_path, "bad.ply", data), "read_ply", part)
