"""lattice.data: the training-data side of a sparse pipeline (what TorchSparse users take from
``torchsparse.utils``: quantize, collate, datasets).

    from torch.utils.data import DataLoader
    import lattice
    from lattice.data import ScanFolder, sparse_collate_fn

    ds = ScanFolder("sequences/00/velodyne", voxel_size=0.05, augment=True, seed=0)
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=sparse_collate_fn)
    for batch in loader:
        logits = model(batch["input"])             # SparseTensor, coords (batch, x, y, z)
        loss = cross_entropy(logits.feats, batch["labels"], ignore_index=255)

* :func:`sparse_quantize`: :func:`lattice.ops.sparse_quantize` plus ``return_index`` (the first
  point of each voxel, TorchSparse's ``return_index``);
* :func:`vote_labels`: the majority label per voxel (ignore label, deterministic ties);
* :func:`sparse_collate_fn`: a ``DataLoader`` collate function for dict samples;
* :class:`ScanFolder`: a dataset of KITTI ``.bin`` / LAS / PCD / PLY scans with voxelization and
  optional seeded augmentation (rotation about z, scaling, jitter);
* :func:`semantic_kitti_labels`: SemanticKITTI raw ids -> the 19 training classes (255 ignore).

:class:`lattice.SparseTensor` pickles (coordinates, features, stride, batch_counts), so samples
and batches can cross DataLoader worker processes; an unpickled tensor is a new coordinate
identity (relations are rebuilt on first use).
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ._core import as_tensor
from . import io as lio
from . import ops
from .tensor import SparseTensor

__all__ = ["sparse_quantize", "vote_labels", "sparse_collate_fn", "ScanFolder", "Augment", "semantic_kitti_labels",
           "SEMANTIC_KITTI_LEARNING_MAP", "IGNORE_LABEL"]

IGNORE_LABEL = 255


def _scatter_min(base: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``base`` with ``base[index[i]] = min(base[index[i]], values[i])`` (exact integer min: the
    result does not depend on the order of the updates)."""
    with warnings.catch_warnings():  # torch 1.13 calls scatter_reduce "beta"
        warnings.simplefilter("ignore", UserWarning)
        return base.scatter_reduce(0, index, values, reduce="amin", include_self=True)


# ------------------------------------------------------------------------------------------------
# quantization and label voting
# ------------------------------------------------------------------------------------------------


def sparse_quantize(points: Any, voxel_size: Any, batch_indices: Any = None, *, origin: Any = 0.0,
                    drop_invalid: bool = False, return_index: bool = False, route: Optional[str] = None) -> tuple:
    """:func:`lattice.ops.sparse_quantize` (``v = floor((p - origin) / voxel_size)``) with
    ``return_index``.

    Returns ``(coords, inverse, counts)`` (``drop_invalid=True``: ``(coords, inverse, counts,
    kept)``), then, with ``return_index=True``, ``index`` (M,) int64 appended last: for each voxel
    row the index of its first point in ``points`` (indices into the *original* array, also when
    ``drop_invalid`` drops points). Voxels are in first-occurrence order, so ``index`` is
    increasing and ``points[index]`` are the representative points TorchSparse / SPVNAS take
    features and labels from (``feats = block[index]``).
    """
    op = "sparse_quantize"
    if not isinstance(return_index, (bool, np.bool_)):
        raise TypeError(f"[{op}] return_index: expected a bool, got {type(return_index).__name__}")
    out = ops.sparse_quantize(points, voxel_size, batch_indices, origin=origin, drop_invalid=drop_invalid, route=route)
    if not return_index:
        return out
    coords, inverse = out[0], out[1]
    m, p = coords.shape[0], inverse.shape[0]
    rows = torch.arange(p, dtype=torch.int64, device=inverse.device)
    index = torch.full((m,), p, dtype=torch.int64, device=inverse.device)
    index = _scatter_min(index, inverse.long(), rows)
    if drop_invalid:
        index = out[3].nonzero().flatten().to(index.device)[index]  # kept-point index -> original index
    return (*out, index)


def vote_labels(labels: Any, inverse: Any, num_voxels: Optional[int] = None, *,
                ignore_label: int = IGNORE_LABEL) -> torch.Tensor:
    """The majority label of each voxel.

    Args:
        labels: (P,) integer label per point (values >= 0).
        inverse: (P,) int point -> voxel row (``sparse_quantize``'s ``inverse``).
        num_voxels: M (default ``inverse.max() + 1``).
        ignore_label: points with this label do not vote; a voxel whose points all carry it (or
            that has no point) gets ``ignore_label``.

    Returns:
        (M,) int64. Ties go to the **smallest** label among the most frequent ones (independent of
        point order, so the result is deterministic and the same on every device).
    """
    op = "vote_labels"
    lab = as_tensor(labels, "labels", op)
    inv = as_tensor(inverse, "inverse", op)
    if lab.dtype.is_floating_point or lab.dtype == torch.bool or inv.dtype.is_floating_point or inv.dtype == torch.bool:
        raise TypeError(f"[{op}] labels, inverse: expected integer tensors, got {lab.dtype} and {inv.dtype}")
    if lab.dim() != 1 or inv.shape != lab.shape:
        raise ValueError(f"[{op}] inverse: expected shape {tuple(lab.shape)} (one voxel per label), got {tuple(inv.shape)}")
    lab, inv = lab.long(), inv.long().to(lab.device)
    if lab.numel() and int(lab.min()) < 0:
        raise ValueError(f"[{op}] labels: expected values >= 0, got {int(lab.min())}")
    m = int(inv.max()) + 1 if num_voxels is None and inv.numel() else int(num_voxels or 0)
    if inv.numel() and (int(inv.min()) < 0 or int(inv.max()) >= m):
        raise ValueError(f"[{op}] inverse: expected values in [0, {m}), got [{int(inv.min())}, {int(inv.max())}]")
    out = torch.full((m,), int(ignore_label), dtype=torch.int64, device=lab.device)
    valid = lab != int(ignore_label)
    lab, inv = lab[valid], inv[valid]
    if lab.numel() == 0:
        return out
    width = int(lab.max()) + 1
    pair, count = torch.unique(inv * width + lab, return_counts=True)  # sorted by (voxel, label)
    voxel, label = pair // width, pair % width
    best = -_scatter_min(torch.zeros(m, dtype=count.dtype, device=count.device), voxel, -count)
    top = count == best[voxel]
    big = torch.full((m,), width, dtype=torch.int64, device=lab.device)
    winner = _scatter_min(big, voxel[top], label[top])
    has = winner < width
    out[has] = winner[has]
    return out


# SemanticKITTI raw class id -> training class (semantic-kitti.yaml "learning_map"; 0 = ignored)
SEMANTIC_KITTI_LEARNING_MAP = {
    0: 0, 1: 0, 10: 1, 11: 2, 13: 5, 15: 3, 16: 5, 18: 4, 20: 5, 30: 6, 31: 7, 32: 8, 40: 9, 44: 10, 48: 11,
    49: 12, 50: 13, 51: 14, 52: 0, 60: 9, 70: 15, 71: 16, 72: 17, 80: 18, 81: 19, 99: 0, 252: 1, 253: 7, 254: 6,
    255: 8, 256: 5, 257: 5, 258: 4, 259: 5,
}


def semantic_kitti_labels(raw: Any, ignore_label: int = IGNORE_LABEL) -> np.ndarray:
    """SemanticKITTI raw class ids (``read_kitti_labels``'s semantic part) -> 0..18 (car 0,
    bicycle 1, ..., traffic-sign 18; moving classes fold onto their static class), unlabeled,
    outliers, other-structure, other-object and unknown ids -> ``ignore_label``. int64."""
    raw = np.asarray(raw).astype(np.int64)
    table = np.full(max(max(SEMANTIC_KITTI_LEARNING_MAP) + 1, int(raw.max(initial=0)) + 1), 0, dtype=np.int64)
    for k, v in SEMANTIC_KITTI_LEARNING_MAP.items():
        table[k] = v
    mapped = table[raw] - 1
    mapped[mapped < 0] = ignore_label
    return mapped


# ------------------------------------------------------------------------------------------------
# collate
# ------------------------------------------------------------------------------------------------

_INDEX_KEYS = ("inverse", "inverse_map")


def sparse_collate_fn(samples: Sequence[Mapping[str, Any]], *, coords_key: str = "coords", feats_key: str = "feats",
                      index_keys: Iterable[str] = _INDEX_KEYS) -> dict:
    """Collates a list of dict samples into one batch (``DataLoader(collate_fn=sparse_collate_fn)``).

    Each sample holds ``coords`` (N_i, 3) ``(x, y, z)`` integer voxel coordinates (or (N_i, 4), the
    batch column is then replaced), ``feats`` (N_i, C) float, and any other entries. The batch is a
    dict with

    * ``"input"``: a :class:`lattice.SparseTensor`, sample i at batch id i, rows in sample order,
      ``batch_counts = [N_0, N_1, ...]`` (also under ``"batch_counts"``);
    * every other tensor / numpy entry concatenated along dim 0 (per-voxel ``labels`` line up with
      ``"input"``'s rows; per-point entries such as point labels or an inverse map stay in point
      order), its per-sample lengths under ``batch["counts"][key]``. Entries named in
      ``index_keys`` (default ``inverse``, ``inverse_map``: point -> voxel indices) are shifted by
      the voxel offset of their sample, so they index the batched rows;
    * a value that is a SparseTensor: collated like the input (``lattice.ops.sparse_collate``);
    * anything else (ints, strings, paths, None): a list, one per sample.

    Every sample must have the same keys.
    """
    op = "sparse_collate_fn"
    if isinstance(samples, Mapping) or not isinstance(samples, Sequence) or len(samples) == 0:
        raise TypeError(f"[{op}] samples: expected a non-empty list of dict samples, got {type(samples).__name__}")
    keys = list(samples[0].keys())
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise TypeError(f"[{op}] samples[{i}]: expected a dict, got {type(s).__name__}")
        if set(s.keys()) != set(keys):
            raise ValueError(f"[{op}] samples[{i}]: expected the keys of samples[0] {sorted(keys)}, got {sorted(s.keys())}")
        for k in (coords_key, feats_key):
            if k not in s:
                raise KeyError(f"[{op}] samples[{i}]: expected a {k!r} entry, got keys {sorted(s.keys())}")
    pairs = []
    for i, s in enumerate(samples):
        c = as_tensor(s[coords_key], f"samples[{i}][{coords_key!r}]", op)
        f = as_tensor(s[feats_key], f"samples[{i}][{feats_key!r}]", op)
        if c.dim() != 2 or c.shape[1] not in (3, 4):
            raise ValueError(f"[{op}] samples[{i}][{coords_key!r}]: expected shape (N, 3) (x, y, z), got {tuple(c.shape)}")
        pairs.append((c.to(torch.int32) if not c.dtype.is_floating_point else c, f))
    x = ops.sparse_collate(pairs)
    counts = list(x.batch_counts)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    index_keys = set(index_keys)
    batch: dict[str, Any] = {"input": x, "batch_counts": counts, "counts": {}}
    for k in keys:
        if k in (coords_key, feats_key):
            continue
        vals = [s[k] for s in samples]
        if all(isinstance(v, SparseTensor) for v in vals):
            batch[k] = ops.sparse_collate(vals)
        elif all(isinstance(v, (torch.Tensor, np.ndarray)) and np.ndim(v) >= 1 for v in vals):
            ts = [as_tensor(v, f"samples[{i}][{k!r}]", op) for i, v in enumerate(vals)]
            if k in index_keys:
                ts = [t.long() + off for t, off in zip(ts, offsets)]
            batch[k] = torch.cat(ts, 0)
            batch["counts"][k] = [int(t.shape[0]) for t in ts]
        else:
            batch[k] = vals
    return batch


# ------------------------------------------------------------------------------------------------
# dataset
# ------------------------------------------------------------------------------------------------


class Augment:
    """Training augmentation of an (N, 3) point array with a numpy generator.

    Order: rotation about z by ``U(-rotate, rotate)`` radians (default the full circle), scaling by
    ``U(scale[0], scale[1])`` (one factor for all axes), then per-point Gaussian jitter with
    standard deviation ``jitter`` (metres; 0 disables it). Float64 maths, result in the input dtype.
    """

    def __init__(self, rotate: float = np.pi, scale: tuple[float, float] = (0.95, 1.05), jitter: float = 0.0) -> None:
        if rotate < 0 or jitter < 0 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"[Augment] rotate, scale, jitter: expected rotate >= 0, 0 < scale[0] <= scale[1], "
                             f"jitter >= 0, got {rotate}, {scale}, {jitter}")
        self.rotate, self.scale, self.jitter = float(rotate), (float(scale[0]), float(scale[1])), float(jitter)

    def __call__(self, xyz: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        theta = rng.uniform(-self.rotate, self.rotate)
        s = rng.uniform(*self.scale)
        c, n = np.cos(theta), np.sin(theta)
        rot = np.array([[c, -n, 0.0], [n, c, 0.0], [0.0, 0.0, 1.0]]) * s
        out = xyz.astype(np.float64) @ rot.T
        if self.jitter > 0:
            out = out + rng.normal(0.0, self.jitter, size=out.shape)
        return out.astype(xyz.dtype)

    def __repr__(self) -> str:
        return f"Augment(rotate={self.rotate}, scale={self.scale}, jitter={self.jitter})"


_EXTENSIONS = (".bin", ".las", ".pcd", ".ply")


class ScanFolder(torch.utils.data.Dataset):
    """A folder of point-cloud scans (KITTI ``.bin``, ``.las``, ``.pcd``, ``.ply``), voxelized.

    Sample i (files sorted by name) is a dict for :func:`sparse_collate_fn`:

    * ``coords`` (M, 3) int32 voxel indices ``floor(xyz / voxel_size)`` (first-occurrence order),
    * ``feats`` (M, C) float32: the features of each voxel's first point (SPVNAS's choice):
      ``x, y, z`` (metres, after augmentation) plus the intensity column when the format has one
      (KITTI remission, LAS intensity / 65535), so C = 4 for KITTI and LAS, 3 for PCD / PLY;
    * ``labels`` (M,) int64 when labels exist: the majority vote (:func:`vote_labels`) of the point
      labels; KITTI: ``<stem>.label`` beside the scan or in ``../labels/`` (SemanticKITTI layout),
      mapped with :func:`semantic_kitti_labels` unless ``label_map`` is given (a callable raw ->
      labels); LAS: the ``classification`` field, through ``label_map`` when given;
    * ``point_labels`` (P,) int64 and ``inverse`` (P,) int64 (point -> voxel row) when labels exist,
      for per-point evaluation; ``path`` (str).

    Args:
        root: the folder (or a list of files).
        voxel_size: metres per voxel.
        augment: ``None``/``False`` (none), ``True`` (``Augment()``) or an :class:`Augment`.
        seed: augmentation seed. Sample i of epoch e uses ``numpy.random.default_rng([seed, e, i])``,
            so the result does not depend on which worker loads it; call :meth:`set_epoch` per epoch.
        box: optional ``((xmin, ymin, zmin), (xmax, ymax, zmax))`` crop in metres (before augmentation).
        ignore_label: the ignore value of the labels (255).
    """

    def __init__(self, root: Union[str, os.PathLike, Sequence[str]], voxel_size: float, *,
                 augment: Union[None, bool, Augment] = None, seed: int = 0,
                 box: Optional[tuple[Sequence[float], Sequence[float]]] = None,
                 label_map: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                 ignore_label: int = IGNORE_LABEL) -> None:
        if isinstance(root, (str, os.PathLike)):
            root = os.fspath(root)
            if not os.path.isdir(root):
                raise FileNotFoundError(f"[ScanFolder] root: expected a folder, got {root!r}")
            files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.lower().endswith(_EXTENSIONS))
        else:
            files = [os.fspath(f) for f in root]
        if not files:
            raise ValueError(f"[ScanFolder] root: expected at least one {'/'.join(_EXTENSIONS)} file, got none in {root!r}")
        if not voxel_size > 0:
            raise ValueError(f"[ScanFolder] voxel_size: expected a positive size, got {voxel_size}")
        self.files, self.voxel_size, self.seed, self.epoch = files, float(voxel_size), int(seed), 0
        self.augment = Augment() if augment is True else (augment or None)
        self.box = None if box is None else (np.asarray(box[0], np.float64), np.asarray(box[1], np.float64))
        self.label_map, self.ignore_label = label_map, int(ignore_label)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.files)

    def _read(self, path: str) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
        """(xyz (P, 3) float32, intensity (P,) float32 or None, labels (P,) int64 or None)."""
        ext = os.path.splitext(path)[1].lower()
        if ext == ".bin":
            pts = lio.read_kitti(path)
            xyz, inten = pts[:, :3], pts[:, 3]
            labels = None
            stem = os.path.splitext(os.path.basename(path))[0]
            for cand in (os.path.join(os.path.dirname(path), stem + ".label"),
                         os.path.join(os.path.dirname(os.path.dirname(path)), "labels", stem + ".label")):
                if os.path.isfile(cand):
                    raw, _ = lio.read_kitti_labels(cand)
                    if raw.shape[0] != xyz.shape[0]:
                        raise ValueError(f"[ScanFolder] {cand}: expected {xyz.shape[0]} labels (one per point), got {raw.shape[0]}")
                    labels = self.label_map(raw) if self.label_map else semantic_kitti_labels(raw, self.ignore_label)
                    break
            return np.ascontiguousarray(xyz, np.float32), np.ascontiguousarray(inten, np.float32), labels
        cloud = lio.read(path)
        xyz = np.asarray(cloud["xyz"], np.float64)
        finite = np.isfinite(xyz).all(axis=1)
        inten = None
        if "intensity" in cloud:
            inten = (np.asarray(cloud["intensity"], np.float64) / (65535.0 if cloud.format == "las" else 1.0))[finite]
        labels = None
        if "classification" in cloud:
            raw = np.asarray(cloud["classification"]).astype(np.int64)[finite]
            labels = self.label_map(raw) if self.label_map else raw
        xyz = xyz[finite]
        if cloud.format == "las":  # State-Plane / UTM magnitudes: centre the scan (float32 keeps cm)
            xyz = xyz - xyz.min(axis=0)
        return (xyz.astype(np.float32), None if inten is None else inten.astype(np.float32),
                None if labels is None else np.asarray(labels, np.int64))

    def __getitem__(self, i: int) -> dict:
        path = self.files[i]
        xyz, inten, labels = self._read(path)
        if self.box is not None:
            keep = ((xyz >= self.box[0]) & (xyz < self.box[1])).all(axis=1)
            xyz, inten = xyz[keep], None if inten is None else inten[keep]
            labels = None if labels is None else labels[keep]
        if self.augment is not None:
            xyz = self.augment(xyz, np.random.default_rng([self.seed, self.epoch, int(i)]))
        coords, inverse, _, index = sparse_quantize(torch.from_numpy(xyz), self.voxel_size, return_index=True)
        cols = [xyz] if inten is None else [xyz, inten[:, None]]
        feats = torch.from_numpy(np.concatenate(cols, axis=1).astype(np.float32))[index]
        sample = {"coords": coords[:, 1:].contiguous(), "feats": feats, "path": path}
        if labels is not None:
            lab = torch.from_numpy(labels)
            sample["labels"] = vote_labels(lab, inverse, coords.shape[0], ignore_label=self.ignore_label)
            sample["point_labels"] = lab
            sample["inverse"] = inverse
        return sample
