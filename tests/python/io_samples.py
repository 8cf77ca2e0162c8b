"""Writers of small point-cloud files for the reader tests (numpy + struct only; never imports
lattice), each returning the bytes and the values a correct reader must give back.

* ``kitti_bytes`` / ``label_bytes``: KITTI velodyne scans and SemanticKITTI labels;
* ``las_bytes``: LAS 1.2 / 1.3 / 1.4 with point formats 0-3 and 6-8 (records built as numpy
  structured arrays from the ASPRS tables), optional extra bytes per record;
* ``pcd_bytes``: PCD v0.7 ascii / binary / binary_compressed with any fields (``lzf_compress`` is
  a small greedy LZF encoder written from the format description, so back references occur);
* ``ply_bytes``: PLY ascii / binary_little_endian / binary_big_endian with elements (faces with
  list properties) before and after the vertex element;
* ``sample_files``: one small valid file per format variant (for the fuzz test).
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

# ---- KITTI --------------------------------------------------------------------------------------


def kitti_bytes(points: np.ndarray) -> bytes:
    return np.ascontiguousarray(points, dtype="<f4").tobytes()


def label_bytes(semantic: np.ndarray, instance: np.ndarray) -> bytes:
    return ((instance.astype("<u4") << 16) | semantic.astype("<u4")).astype("<u4").tobytes()


# ---- LZF ----------------------------------------------------------------------------------------


def lzf_compress(data: bytes) -> bytes:
    """Greedy LZF: literal runs of <= 32 bytes; back references of 3..264 bytes, distance <= 8192."""
    out = bytearray()
    literal = bytearray()
    table: dict[bytes, int] = {}

    def flush() -> None:
        while literal:
            chunk = literal[:32]
            out.append(len(chunk) - 1)
            out.extend(chunk)
            del literal[:32]

    i, n = 0, len(data)
    while i < n:
        if i + 3 <= n:
            key = data[i:i + 3]
            ref = table.get(key)
            table[key] = i
            if ref is not None and i - ref <= 8192:
                length, limit = 3, min(264, n - i)
                while length < limit and data[ref + length] == data[i + length]:
                    length += 1
                flush()
                dist, code = i - ref - 1, length - 2
                if code < 7:
                    out.append((code << 5) | (dist >> 8))
                else:
                    out += bytes([(7 << 5) | (dist >> 8), code - 7])
                out.append(dist & 0xFF)
                i += length
                continue
        literal.append(data[i])
        i += 1
    flush()
    return bytes(out)


def lzf_decompress(data: bytes, size: int) -> bytes:
    """The reference decoder of the tests (written from the format description)."""
    out = bytearray()
    i = 0
    while i < len(data):
        c = data[i]
        i += 1
        if c < 32:
            out += data[i:i + c + 1]
            i += c + 1
            continue
        length = c >> 5
        if length == 7:
            length += data[i]
            i += 1
        start = len(out) - (((c & 31) << 8) | data[i]) - 1
        i += 1
        for k in range(length + 2):
            out.append(out[start + k])
    assert len(out) == size
    return bytes(out)


# ---- PCD ----------------------------------------------------------------------------------------

PCD_TYPES = {  # numpy dtype -> (TYPE, SIZE)
    np.dtype("int8"): ("I", 1), np.dtype("int16"): ("I", 2), np.dtype("int32"): ("I", 4),
    np.dtype("int64"): ("I", 8), np.dtype("uint8"): ("U", 1), np.dtype("uint16"): ("U", 2),
    np.dtype("uint32"): ("U", 4), np.dtype("uint64"): ("U", 8), np.dtype("float32"): ("F", 4),
    np.dtype("float64"): ("F", 8),
}


def _ascii(v: Any) -> str:
    if isinstance(v, (np.floating, float)):
        return "nan" if np.isnan(v) else repr(float(v))
    return str(int(v))


def pcd_bytes(
    fields: Sequence[tuple[str, np.ndarray]],
    data: str,
    width: Optional[int] = None,
    height: int = 1,
    header_extra: str = "",
) -> bytes:
    """A PCD v0.7 file. ``fields``: (name, values (N,) or (N, COUNT)) in file order."""
    cols = [(name, v[:, None] if v.ndim == 1 else v) for name, v in fields]
    n = len(cols[0][1])
    width = n if width is None else width
    types = [PCD_TYPES[v.dtype] for _, v in cols]
    header = (
        "# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\n"
        f"FIELDS {' '.join(name for name, _ in cols)}\n"
        f"SIZE {' '.join(str(s) for _, s in types)}\nTYPE {' '.join(t for t, _ in types)}\n"
        f"COUNT {' '.join(str(v.shape[1]) for _, v in cols)}\n"
        f"WIDTH {width}\nHEIGHT {height}\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\n{header_extra}DATA {data}\n"
    ).encode()
    if data == "ascii":
        lines = [" ".join(_ascii(x) for _, v in cols for x in v[i]) for i in range(n)]
        return header + "".join(line + "\n" for line in lines).encode()
    if data == "binary":
        rec = np.dtype([(f"f{k}", v.dtype.newbyteorder("<"), (v.shape[1],)) for k, (_, v) in enumerate(cols)])
        arr = np.zeros(n, dtype=rec)
        for k, (_, v) in enumerate(cols):
            arr[f"f{k}"] = v
        return header + arr.tobytes()
    assert data == "binary_compressed"
    # field-major blocks; padding fields ("_") are not stored (PCL's layout)
    plain = b"".join(v.astype(v.dtype.newbyteorder("<")).tobytes() for name, v in cols if name != "_")
    packed = lzf_compress(plain)
    return header + struct.pack("<II", len(packed), len(plain)) + packed


# ---- LAS ----------------------------------------------------------------------------------------

LAS_MIN_RECORD = {0: 20, 1: 28, 2: 26, 3: 34, 6: 30, 7: 36, 8: 38}
LAS_HEADER_SIZE = {2: 227, 3: 235, 4: 375}


def las_record_dtype(fmt: int, extra: int = 0) -> np.dtype:
    if fmt < 6:
        fields = [("X", "<i4"), ("Y", "<i4"), ("Z", "<i4"), ("intensity", "<u2"), ("bits", "u1"),
                  ("class_byte", "u1"), ("scan_angle", "i1"), ("user_data", "u1"), ("point_source_id", "<u2")]
        if fmt in (1, 3):
            fields.append(("gps_time", "<f8"))
        if fmt in (2, 3):
            fields += [("red", "<u2"), ("green", "<u2"), ("blue", "<u2")]
    else:
        fields = [("X", "<i4"), ("Y", "<i4"), ("Z", "<i4"), ("intensity", "<u2"), ("bits", "u1"),
                  ("flags", "u1"), ("class_byte", "u1"), ("user_data", "u1"), ("scan_angle", "<i2"),
                  ("point_source_id", "<u2"), ("gps_time", "<f8")]
        if fmt in (7, 8):
            fields += [("red", "<u2"), ("green", "<u2"), ("blue", "<u2")]
        if fmt == 8:
            fields.append(("nir", "<u2"))
    if extra:
        fields.append(("extra", f"V{extra}"))
    dt = np.dtype(fields)
    assert dt.itemsize == LAS_MIN_RECORD[fmt] + extra
    return dt


def las_expected(rec: np.ndarray, fmt: int, scale: Sequence[float], offset: Sequence[float]) -> dict[str, np.ndarray]:
    """What a reader must return for these records (the ASPRS bit layouts, decoded in numpy)."""
    xyz = np.stack([rec[a].astype(np.float64) * s + o for a, s, o in zip("XYZ", scale, offset)], axis=1)
    out = {"xyz": xyz, "intensity": rec["intensity"], "user_data": rec["user_data"],
           "point_source_id": rec["point_source_id"]}
    if fmt < 6:
        out["return_number"] = rec["bits"] & 7
        out["number_of_returns"] = (rec["bits"] >> 3) & 7
        out["classification"] = rec["class_byte"] & 31
    else:
        out["return_number"] = rec["bits"] & 15
        out["number_of_returns"] = rec["bits"] >> 4
        out["classification"] = rec["class_byte"]
    if "gps_time" in rec.dtype.names:
        out["gps_time"] = rec["gps_time"]
    if "red" in rec.dtype.names:
        out["rgb"] = np.stack([rec["red"], rec["green"], rec["blue"]], axis=1)
    if "nir" in rec.dtype.names:
        out["nir"] = rec["nir"]
    return out


def las_bytes(
    rng: np.random.Generator,
    minor: int,
    fmt: int,
    n: int,
    extra: int = 0,
    vlr_gap: int = 54,
    legacy_count: Optional[int] = None,
    count64: Optional[int] = None,
) -> tuple[bytes, dict[str, np.ndarray]]:
    """A LAS 1.<minor> file of n random points of format ``fmt``; ``vlr_gap`` bytes between the
    header and the points (where VLRs would be). Returns (bytes, expected columns)."""
    dt = las_record_dtype(fmt, extra)
    rec = np.zeros(n, dtype=dt)
    for name in dt.names:
        if name == "extra":
            continue
        kind = dt[name]
        if kind.kind == "f":
            rec[name] = rng.uniform(0, 1e6, n)
        else:
            info = np.iinfo(kind)
            rec[name] = rng.integers(info.min, info.max, n, endpoint=True, dtype=kind.newbyteorder("="))
    if extra:
        rec["extra"] = np.frombuffer(rng.bytes(extra * n), dtype=f"V{extra}")
    scale, offset = (0.01, 0.02, 0.001), (1000.0, -2000.0, 5.5)
    header_size = LAS_HEADER_SIZE.get(minor, 227)
    h = bytearray(header_size)
    h[0:4] = b"LASF"
    h[24], h[25] = 1, minor
    h[26:30] = b"TEST"
    h[58:68] = b"io_samples"
    point_offset = header_size + vlr_gap
    legacy = (n if fmt < 6 or minor < 4 else 0) if legacy_count is None else legacy_count
    struct.pack_into("<HIIBHI", h, 94, header_size, point_offset, 0, fmt, dt.itemsize, legacy)
    struct.pack_into("<3d3d", h, 131, *scale, *offset)
    exp = las_expected(rec, fmt, scale, offset)
    if n:
        mx, mn = exp["xyz"].max(0), exp["xyz"].min(0)
        struct.pack_into("<6d", h, 179, mx[0], mn[0], mx[1], mn[1], mx[2], mn[2])
    if minor >= 4:
        struct.pack_into("<Q", h, 247, n if count64 is None else count64)
    return bytes(h) + b"\0" * vlr_gap + rec.tobytes(), exp


# ---- PLY ----------------------------------------------------------------------------------------

PLY_TYPES = {  # numpy dtype -> PLY type name
    np.dtype("int8"): "char", np.dtype("uint8"): "uchar", np.dtype("int16"): "short",
    np.dtype("uint16"): "ushort", np.dtype("int32"): "int", np.dtype("uint32"): "uint",
    np.dtype("float32"): "float", np.dtype("float64"): "double",
}


def ply_bytes(
    encoding: str,
    vertex: Sequence[tuple[str, np.ndarray]],
    faces: Sequence[Sequence[int]] = ((0, 1, 2), (0, 2, 3, 1)),
    faces_first: bool = True,
    vertex_list: bool = False,
) -> bytes:
    """A PLY file: an "edge" element (2 ints) and a "face" element (list uchar int) before the
    vertex element when ``faces_first``, after it otherwise; ``vertex_list`` adds a list property
    to each vertex (which readers skip)."""
    big = encoding == "binary_big_endian"
    order = ">" if big else "<"
    n = len(vertex[0][1])
    edges = [(0, 1), (1, 2)]

    def header_element(name: str) -> str:
        if name == "vertex":
            props = "".join(f"property {PLY_TYPES[v.dtype]} {p}\n" for p, v in vertex)
            if vertex_list:
                props += "property list uchar float extras\n"
            return f"element vertex {n}\n{props}"
        if name == "face":
            return f"element face {len(faces)}\nproperty list uchar int vertex_indices\n"
        return f"element edge {len(edges)}\nproperty int vertex1\nproperty int vertex2\n"

    order_names = ["edge", "face", "vertex"] if faces_first else ["vertex", "face", "edge"]
    header = f"ply\nformat {encoding} 1.0\ncomment io_samples\n"
    header += "".join(header_element(e) for e in order_names) + "end_header\n"

    def body(name: str) -> bytes:
        if encoding == "ascii":
            if name == "vertex":
                rows = []
                for i in range(n):
                    row = [_ascii(v[i]) for _, v in vertex]
                    if vertex_list:
                        row += ["2", "0.5", "-1.5"]
                    rows.append(" ".join(row))
                return "".join(r + "\n" for r in rows).encode()
            if name == "face":
                return "".join(f"{len(f)} {' '.join(map(str, f))}\n" for f in faces).encode()
            return "".join(f"{a} {b}\n" for a, b in edges).encode()
        if name == "vertex":
            out = bytearray()
            for i in range(n):
                for _, v in vertex:
                    out += v[i:i + 1].astype(v.dtype.newbyteorder(order)).tobytes()
                if vertex_list:
                    out += bytes([2]) + np.array([0.5, -1.5], dtype=order + "f4").tobytes()
            return bytes(out)
        if name == "face":
            return b"".join(bytes([len(f)]) + np.array(f, dtype=order + "i4").tobytes() for f in faces)
        return np.array(edges, dtype=order + "i4").tobytes()

    return header.encode() + b"".join(body(e) for e in order_names)


# ---- one small valid file per variant -----------------------------------------------------------


def pcd_sample_fields(rng: np.random.Generator, n: int) -> list[tuple[str, np.ndarray]]:
    xyz = rng.normal(size=(n, 3)).astype(np.float32)
    xyz[1] = np.nan
    return [
        ("x", xyz[:, 0]), ("y", xyz[:, 1]), ("z", xyz[:, 2]),
        ("rgb", rng.integers(0, 2**24, n).astype(np.uint32).view(np.float32)),
        ("label", rng.integers(-5, 5, n).astype(np.int16)),
        ("hist", rng.normal(size=(n, 3)).astype(np.float64)),
    ]


def ply_sample_vertex(rng: np.random.Generator, n: int) -> list[tuple[str, np.ndarray]]:
    return [
        ("x", rng.normal(size=n).astype(np.float32)), ("y", rng.normal(size=n).astype(np.float32)),
        ("z", rng.normal(size=n).astype(np.float32)),
        ("red", rng.integers(0, 256, n).astype(np.uint8)), ("green", rng.integers(0, 256, n).astype(np.uint8)),
        ("blue", rng.integers(0, 256, n).astype(np.uint8)), ("quality", rng.integers(0, 65536, n).astype(np.uint16)),
    ]


def sample_files(folder: Path, seed: int = 0) -> list[Path]:
    """Small valid files of every format variant (a few hundred bytes each)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {
        "scan.bin": kitti_bytes(rng.normal(size=(6, 4))),
        "scan.label": label_bytes(rng.integers(0, 300, 6), rng.integers(0, 9, 6)),
    }
    for minor, fmt in [(2, 0), (2, 1), (2, 2), (2, 3), (4, 6), (4, 7), (4, 8), (3, 3)]:
        files[f"f{fmt}_v1{minor}.las"] = las_bytes(rng, minor, fmt, 4, extra=2 if fmt == 3 else 0, vlr_gap=8)[0]
    fields = pcd_sample_fields(rng, 5)
    for data in ("ascii", "binary", "binary_compressed"):
        files[f"{data}.pcd"] = pcd_bytes(fields, data)
    organized = [("x", np.array([1, np.nan, 3, 4, 5, np.nan], np.float32)),
                 ("y", np.zeros(6, np.float32)), ("z", np.ones(6, np.float32))]
    files["organized.pcd"] = pcd_bytes(organized, "binary_compressed", width=3, height=2)
    vertex = ply_sample_vertex(rng, 4)
    for enc in ("ascii", "binary_little_endian", "binary_big_endian"):
        files[f"{enc}.ply"] = ply_bytes(enc, vertex, vertex_list=enc != "ascii")
    paths = []
    for name, data in files.items():
        p = folder / name
        p.write_bytes(data)
        paths.append(p)
    return paths
