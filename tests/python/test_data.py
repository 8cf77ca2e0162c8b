"""lattice.data: quantize with return_index, label voting, the dict collate function, pickling
of SparseTensor, the ScanFolder dataset (every file format) and a 2-worker DataLoader.

References are brute-force Python/numpy loops written here (first point of each voxel, a
Counter-based majority vote with the documented tie rule); the DataLoader tests compare a
2-worker run with an in-process run of the same seeded dataset.
"""
from __future__ import annotations

import collections
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lattice
from lattice import data as ldata

import io_samples

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
KITTI = SHARED / "semantickitti"


def test_sparse_tensor_pickles_and_is_a_new_identity():
    x = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3], [1, -4, 5, 6]]), torch.randn(2, 3, dtype=torch.float64),
                             stride=(2, 2, 4), batch_counts=[1, 1])
    y = pickle.loads(pickle.dumps(x))
    assert torch.equal(y.coords, x.coords) and torch.equal(y.feats, x.feats)
    assert y.stride == (2, 2, 4) and y.batch_counts == [1, 1] and y.feats.dtype == torch.float64
    assert y.key != x.key  # a fresh coordinate identity, documented


@pytest.mark.parametrize("drop_invalid", [False, True])
def test_sparse_quantize_return_index_is_first_point_of_each_voxel(drop_invalid):
    rng = np.random.default_rng(0)
    pts = rng.uniform(-2, 2, size=(500, 3)).astype(np.float32)
    if drop_invalid:
        pts[[3, 40, 41]] = np.nan
    out = ldata.sparse_quantize(pts, 0.5, drop_invalid=drop_invalid, return_index=True)
    coords, inverse, index = out[0], out[1], out[-1]
    assert len(out) == (5 if drop_invalid else 4)
    kept = np.flatnonzero(np.isfinite(pts).all(1))
    # brute force: walk the kept points in order, the first one seen in each voxel
    first: dict[tuple, int] = {}
    for j, i in enumerate(kept):
        first.setdefault(int(inverse[j]), int(i))
    assert index.tolist() == [first[r] for r in range(coords.shape[0])]
    assert torch.equal(coords[:, 1:], torch.from_numpy(np.floor(pts[index.numpy()] / 0.5).astype(np.int32)))
    assert ldata.sparse_quantize(pts[kept], 0.5)[0].shape == coords.shape
    no_index = ldata.sparse_quantize(pts, 0.5, drop_invalid=drop_invalid)
    assert len(no_index) == len(out) - 1


def _vote_reference(labels, inverse, m, ignore):
    votes = [collections.Counter() for _ in range(m)]
    for lab, v in zip(labels, inverse):
        if lab != ignore:
            votes[v][lab] += 1
    out = []
    for c in votes:
        if not c:
            out.append(ignore)
        else:
            top = max(c.values())
            out.append(min(k for k, n in c.items() if n == top))  # ties: the smallest label
    return out


def test_vote_labels_majority_ignore_and_ties():
    rng = np.random.default_rng(1)
    inverse = rng.integers(0, 40, 600)
    labels = rng.integers(0, 6, 600)
    labels[rng.random(600) < 0.3] = 255
    got = ldata.vote_labels(torch.from_numpy(labels), torch.from_numpy(inverse), 45)
    assert got.tolist() == _vote_reference(labels.tolist(), inverse.tolist(), 45, 255)
    assert got[40:].tolist() == [255] * 5  # voxels without points
    # an explicit tie, in both point orders: the smaller label wins
    for lab in ([3, 1, 3, 1], [1, 3, 1, 3]):
        assert ldata.vote_labels(torch.tensor(lab), torch.zeros(4, dtype=torch.long)).tolist() == [1]
    # a voxel of ignored points only gets the ignore label; a custom ignore label
    assert ldata.vote_labels(torch.tensor([7, 7, 2]), torch.tensor([0, 0, 1]), ignore_label=7).tolist() == [7, 2]
    with pytest.raises(ValueError, match=r"\[vote_labels\] inverse: expected shape \(3,\)"):
        ldata.vote_labels(torch.tensor([1, 2, 3]), torch.tensor([0, 1]))


def test_semantic_kitti_label_map():
    raw = np.array([0, 1, 10, 252, 40, 60, 81, 99, 1000])
    assert ldata.semantic_kitti_labels(raw).tolist() == [255, 255, 0, 0, 8, 8, 18, 255, 255]


def _sample(n, seed, c=4):
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.randint(0, 10, (n, 3), generator=g), dim=0).int()
    m = coords.shape[0]
    return {"coords": coords, "feats": torch.randn(m, c, generator=g), "labels": torch.randint(0, 5, (m,), generator=g),
            "inverse": torch.randint(0, m, (2 * m,), generator=g), "point_labels": np.arange(2 * m),
            "path": f"scan{seed}", "id": seed}


def test_sparse_collate_fn_dict_samples():
    """Batch ids 0..B-1 in sample order, batch_counts kept, per-voxel entries aligned with the
    input rows, inverse maps shifted by the voxel offset, per-point counts, other values listed."""
    samples = [_sample(30, 0), _sample(50, 1), _sample(20, 2)]
    b = ldata.sparse_collate_fn(samples)
    x = b["input"]
    counts = [s["coords"].shape[0] for s in samples]
    assert x.batch_counts == counts == b["batch_counts"]
    assert x.coords[:, 0].tolist() == sum(([i] * n for i, n in enumerate(counts)), [])
    assert torch.equal(x.coords[:, 1:], torch.cat([s["coords"] for s in samples]))
    assert torch.equal(x.feats, torch.cat([s["feats"] for s in samples]))
    assert torch.equal(b["labels"], torch.cat([s["labels"] for s in samples]))
    off = np.cumsum([0] + counts[:-1])
    assert torch.equal(b["inverse"], torch.cat([s["inverse"] + o for s, o in zip(samples, off)]))
    # the shifted inverse picks each point's own voxel row out of the batch
    for i, s in enumerate(samples):
        lo = sum(b["counts"]["inverse"][:i])
        rows = b["inverse"][lo:lo + len(s["inverse"])]
        assert torch.equal(x.coords[rows, 1:], s["coords"][s["inverse"]])
        assert bool((x.coords[rows, 0] == i).all())
    assert b["counts"]["point_labels"] == [2 * n for n in counts]
    assert b["path"] == ["scan0", "scan1", "scan2"] and b["id"] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"\[sparse_collate_fn\] samples\[1\]: expected the keys of samples\[0\]"):
        ldata.sparse_collate_fn([samples[0], {"coords": samples[1]["coords"], "feats": samples[1]["feats"]}])
    with pytest.raises(KeyError, match="expected a 'feats' entry"):
        ldata.sparse_collate_fn([{"coords": samples[0]["coords"]}])


def _write_kitti(folder: Path, n_scans: int = 4, n: int = 3000) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    paths = []
    for i in range(n_scans):
        pts = np.concatenate([rng.uniform(-4, 4, (n, 3)), rng.uniform(0, 1, (n, 1))], 1).astype(np.float32)
        raw = rng.choice([0, 10, 40, 48, 70, 252], n)
        (folder / f"{i:06d}.bin").write_bytes(io_samples.kitti_bytes(pts))
        (folder / f"{i:06d}.label").write_bytes(io_samples.label_bytes(raw, np.zeros(n, np.int64)))
        paths.append(folder / f"{i:06d}.bin")
    return paths


def test_scan_folder_kitti_sample_contents(tmp_path):
    _write_kitti(tmp_path, 1)
    ds = ldata.ScanFolder(tmp_path, voxel_size=0.5)
    s = ds[0]
    pts = lattice.io.read_kitti(tmp_path / "000000.bin")
    raw, _ = lattice.io.read_kitti_labels(tmp_path / "000000.label")
    coords, inverse, _, index = ldata.sparse_quantize(pts[:, :3], 0.5, return_index=True)
    assert torch.equal(s["coords"], coords[:, 1:]) and torch.equal(s["inverse"], inverse)
    assert torch.equal(s["feats"], torch.from_numpy(pts)[index])
    lab = ldata.semantic_kitti_labels(raw)
    assert s["point_labels"].tolist() == lab.tolist()
    assert s["labels"].tolist() == _vote_reference(lab.tolist(), inverse.tolist(), coords.shape[0], 255)


def test_scan_folder_semantic_kitti_layout_and_augmentation(tmp_path):
    """labels found in ../labels/; the augmentation is seeded per (seed, epoch, index): the same
    sample twice is equal, another epoch differs, and rotation/scale keep the point count."""
    scans = _write_kitti(tmp_path / "labels_tmp", 2)
    (tmp_path / "velodyne").mkdir()
    (tmp_path / "labels").mkdir()
    for p in scans:
        os.replace(p, tmp_path / "velodyne" / p.name)
        os.replace(p.with_suffix(".label"), tmp_path / "labels" / p.with_suffix(".label").name)
    ds = ldata.ScanFolder(tmp_path / "velodyne", voxel_size=0.25, augment=ldata.Augment(jitter=0.01), seed=3)
    a, b = ds[1], ds[1]
    assert torch.equal(a["feats"], b["feats"]) and "labels" in a
    ds.set_epoch(1)
    c = ds[1]
    assert not torch.equal(a["feats"], c["feats"])
    assert a["inverse"].shape == c["inverse"].shape == (3000,)
    plain = ldata.ScanFolder(tmp_path / "velodyne", voxel_size=0.25)[1]
    r_aug = torch.linalg.norm(a["feats"][:, :2].double(), dim=1).max()
    r_plain = torch.linalg.norm(plain["feats"][:, :2].double(), dim=1).max()
    assert 0.9 < float(r_aug / r_plain) < 1.1  # a rotation + scale in [0.95, 1.05] (+ jitter)


def test_scan_folder_las_pcd_ply(tmp_path):
    """Every format through lattice.io: LAS (intensity feature, classification labels), PCD and
    PLY (x, y, z only)."""
    rng = np.random.default_rng(0)
    las, expect = io_samples.las_bytes(rng, 2, 3, 50)
    (tmp_path / "a.las").write_bytes(las)
    fields = [("x", rng.normal(size=40).astype(np.float32)), ("y", rng.normal(size=40).astype(np.float32)),
              ("z", rng.normal(size=40).astype(np.float32))]
    (tmp_path / "b.pcd").write_bytes(io_samples.pcd_bytes(fields, "binary"))
    (tmp_path / "c.ply").write_bytes(io_samples.ply_bytes("binary_little_endian", fields))
    s_las = ldata.ScanFolder([str(tmp_path / "a.las")], voxel_size=1e7)[0]  # random raw ints: a huge extent
    ds = ldata.ScanFolder([str(tmp_path / "b.pcd"), str(tmp_path / "c.ply")], voxel_size=1e-3)
    s_pcd, s_ply = ds[0], ds[1]
    assert s_las["feats"].shape[1] == 4 and "labels" in s_las
    assert s_las["point_labels"].tolist() == expect["classification"].astype(np.int64).tolist()
    assert s_pcd["feats"].shape[1] == 3 and s_ply["feats"].shape[1] == 3 and "labels" not in s_pcd
    torch.testing.assert_close(s_pcd["feats"][torch.argsort(s_pcd["feats"][:, 0])],
                               s_ply["feats"][torch.argsort(s_ply["feats"][:, 0])])


class _TensorDataset(torch.utils.data.Dataset):
    """Samples that are SparseTensors themselves (they cross the worker boundary by pickling)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        s = _sample(20 + 5 * i, i)
        return {"coords": s["coords"], "feats": s["feats"],
                "st": lattice.SparseTensor(torch.cat([torch.zeros(len(s["coords"]), 1, dtype=torch.int32), s["coords"]], 1),
                                           s["feats"])}


def test_two_worker_dataloader_equals_in_process(tmp_path):
    """A 2-worker DataLoader over an augmented ScanFolder gives the same batches as num_workers=0
    (augmentation seeded per sample, not per worker); SparseTensor values cross the workers."""
    _write_kitti(tmp_path, 4, n=1500)
    ds = ldata.ScanFolder(tmp_path, voxel_size=0.2, augment=True, seed=5)
    batches = []
    for workers in (0, 2):
        loader = DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=ldata.sparse_collate_fn)
        batches.append(list(loader))
    assert len(batches[1]) == 2
    for b0, b2 in zip(*batches):
        assert isinstance(b2["input"], lattice.SparseTensor)
        assert torch.equal(b0["input"].coords, b2["input"].coords) and torch.equal(b0["input"].feats, b2["input"].feats)
        assert b0["batch_counts"] == b2["batch_counts"] == b2["input"].batch_counts
        assert torch.equal(b0["labels"], b2["labels"]) and torch.equal(b0["inverse"], b2["inverse"])
        assert b2["labels"].shape[0] == len(b2["input"])
    (b,) = list(DataLoader(_TensorDataset(), batch_size=4, num_workers=2, collate_fn=ldata.sparse_collate_fn))[:1]
    assert isinstance(b["st"], lattice.SparseTensor) and len(b["st"]) == len(b["input"])
    assert torch.equal(b["st"].coords, b["input"].coords)


@pytest.mark.skipif(not KITTI.is_dir(), reason="../shared/data/semantickitti not present")
def test_scan_folder_reads_the_real_semantickitti_scan():
    ds = ldata.ScanFolder(KITTI, voxel_size=0.05, box=((-10, -10, -3), (10, 10, 3)))
    s = ds[0]
    assert s["feats"].shape[1] == 4 and s["labels"].shape[0] == s["coords"].shape[0] > 1000
    valid = s["labels"][s["labels"] != 255]
    assert valid.numel() > 0 and int(valid.max()) < 19
