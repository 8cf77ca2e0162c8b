"""Coordinate utilities (SEMANTICS.md "Sparse algebra and coordinate utilities").

Coordinates are ``(N, 4)`` int32 rows ``(batch, x, y, z)`` (int64 within the int32 range and numpy
arrays are accepted); functions that take coordinates also take a :class:`lattice.SparseTensor`
and then use its coordinate set (its cached index is reused). Set operations and lookups go
through the algebra routes, downsampling and Morton codes through the coords routes (see
``lattice.explain``). ``prune``, ``crop``, ``sparse_collate``, ``sparse_from_coordinates``,
``dense`` and ``from_dense`` compute their rows (kept rows, batched coordinates, grid cells,
non-zero sites) on the coords routes and move the features with torch indexing on those rows
(differentiable in the features by torch autograd); they mint a new coordinate identity unless
the rows are unchanged.
"""
from __future__ import annotations

import os

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .._core import as_tensor, as_triple, core, from_core, to_core
from .._device import check_device
from ..tensor import SparseTensor
from .algebra import check_route, check_sparse

IntOr3 = Union[int, Sequence[int]]
CoordsLike = Union[SparseTensor, torch.Tensor, np.ndarray]

MORTON_MIN, MORTON_MAX = -(2**20), 2**20 - 1
# dense(): no fixed element limit (a detection BEV at batch 16 is ~2^27 elements). The grid must be
# addressable with int64 cell indices and fit in the memory available on its device (or in the
# caller's ``max_bytes``); see dense() and _available_bytes().
DENSE_MAX_ELEMENTS = 2**63 - 1

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def coords_tensor(op: str, what: str, value: Any, widths: tuple[int, ...] = (4,)) -> torch.Tensor:
    """(N, w) int32 contiguous CPU tensor from a tensor / array (or a SparseTensor's coords)."""
    if isinstance(value, SparseTensor):
        return value.coords
    t = as_tensor(value, what, op)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"[{op}] {what}: expected an integer tensor (int32), got {t.dtype}")
    if t.dim() != 2 or t.shape[1] not in widths:
        expected = " or ".join(f"(N, {w})" for w in widths)
        raise ValueError(f"[{op}] {what}: expected shape {expected}, got {tuple(t.shape)}")
    if t.dtype != torch.int32:
        if t.numel() and (int(t.min()) < _INT32_MIN or int(t.max()) > _INT32_MAX):
            raise ValueError(
                f"[{op}] {what}: expected values within int32 [-2147483648, 2147483647], "
                f"got range [{int(t.min())}, {int(t.max())}]"
            )
        t = t.to(torch.int32)
    return t.contiguous()


def _coordinate_set(op: str, what: str, value: Any, stride: Any) -> Any:
    """A core coordinate set: a SparseTensor's own, or a fresh one over a coordinate tensor."""
    if isinstance(value, SparseTensor):
        return value._cs
    return core.CoordinateSet.create(to_core(coords_tensor(op, what, value)), stride, None, False)


def _device_of(value: Any) -> torch.device:
    """The device of a SparseTensor or tensor operand (numpy arrays and the rest: the CPU)."""
    if isinstance(value, (SparseTensor, torch.Tensor)):
        return value.device
    return torch.device("cpu")


def _pair(op: str, lhs: Any, rhs: Any) -> tuple[Any, Any]:
    """Coordinate sets for a binary set operation; a plain coordinate tensor takes the stride of a
    SparseTensor operand (else 1). Both operands must be on one device."""
    check_device(op, "rhs", rhs, _device_of(lhs))
    stride = 1
    for v in (lhs, rhs):
        if isinstance(v, SparseTensor):
            stride = v.stride
            break
    return _coordinate_set(op, "lhs", lhs, stride), _coordinate_set(op, "rhs", rhs, stride)


def union_coords(lhs: CoordsLike, rhs: CoordsLike, *, route: Optional[str] = None) -> torch.Tensor:
    """(M, 4) int32: the rows of ``lhs``, then the rows of ``rhs`` absent from ``lhs`` (rhs order).

    Both sides must have unique rows (ValueError naming the repeated row otherwise) and, when
    SparseTensors, the same stride.
    """
    r = check_route("union_coords", route)
    a, b = _pair("union_coords", lhs, rhs)
    return from_core(core.union_coords(a, b, r))


def intersection_coords(lhs: CoordsLike, rhs: CoordsLike, *, route: Optional[str] = None) -> torch.Tensor:
    """(M, 4) int32: the rows of ``lhs`` found in ``rhs``, in lhs order (unique rows required)."""
    r = check_route("intersection_coords", route)
    a, b = _pair("intersection_coords", lhs, rhs)
    return from_core(core.intersection_coords(a, b, r))


def _lookup(op: str, coords: CoordsLike, queries: CoordsLike, route: Optional[str], as_bool: bool) -> torch.Tensor:
    r = check_route(op, route)
    q = coords_tensor(op, "queries", queries)
    check_device(op, "queries", q, _device_of(coords))
    table = _coordinate_set(op, "coords", coords, 1)
    out = from_core(core.lookup_coords(table, to_core(q), as_bool, r))
    return out.to(torch.bool) if as_bool else out


def lookup_coords(coords: CoordsLike, queries: CoordsLike, *, route: Optional[str] = None) -> torch.Tensor:
    """(Q,) int64: the row of ``coords`` holding each query row ``(batch, x, y, z)``, or -1.

    ``coords`` must have unique rows; queries may repeat and may hold any int32 values.
    """
    return _lookup("lookup_coords", coords, queries, route, False)


def contains_coords(coords: CoordsLike, queries: CoordsLike, *, route: Optional[str] = None) -> torch.Tensor:
    """(Q,) bool: whether each query row is a row of ``coords``."""
    return _lookup("contains_coords", coords, queries, route, True)


def downsample_coords(coords: CoordsLike, stride: IntOr3, *, return_inverse: bool = False,
                      route: Optional[str] = None) -> Any:
    """Unique ``(batch, floor_div(x, sx), floor_div(y, sy), floor_div(z, sz))`` in first-occurrence order.

    This is the output support of a strided forward convolution or pooling (SEMANTICS.md
    "Relations"). Input rows may repeat; ``stride`` 1 deduplicates.

    Returns:
        (M, 4) int32 coordinates, and with ``return_inverse`` also the (N,) int64 input -> output row.
    """
    op = "downsample_coords"
    r = check_route(op, route)
    c = coords_tensor(op, "coords", coords)
    s = as_triple(stride, "stride", op)
    out, inverse = core.downsample_coords(to_core(c), s, r)
    return (from_core(out), from_core(inverse)) if return_inverse else from_core(out)


def morton_codes(coords: CoordsLike, *, route: Optional[str] = None) -> torch.Tensor:
    """(N,) int64 Morton (Z-order) codes of (N, 3) ``(x, y, z)`` or (N, 4) ``(batch, x, y, z)`` rows.

    Scheme: each of x, y, z is offset by 2^20 and the three 21-bit values are interleaved, x in the
    most significant bit of each triple, into a non-negative 63-bit code. Distinct ``(x, y, z)`` get
    distinct codes; values outside ``[-2^20, 2^20 - 1]`` raise ValueError naming that range (never a
    silent collision). The batch column is not part of the code (see :func:`morton_order`).
    """
    op = "morton_codes"
    r = check_route(op, route)
    return from_core(core.morton(to_core(coords_tensor(op, "coords", coords, (3, 4))), False, r))


def morton_order(coords: CoordsLike, *, route: Optional[str] = None) -> torch.Tensor:
    """(N,) int64 permutation sorting rows by (batch, Morton code); stable (ties keep input order)."""
    op = "morton_order"
    r = check_route(op, route)
    return from_core(core.morton(to_core(coords_tensor(op, "coords", coords, (3, 4))), True, r))


def _rows_subset(x: SparseTensor, index: torch.Tensor) -> SparseTensor:
    """The rows ``index`` (ascending int64) of ``x`` as a new SparseTensor (new identity)."""
    coords = x.coords.index_select(0, index)
    counts = None
    if x.batch_counts is not None:
        counts = torch.bincount(coords[:, 0].long(), minlength=len(x.batch_counts)).tolist()
    return SparseTensor(coords, x.feats.index_select(0, index), x.stride, counts)


def prune(x: SparseTensor, mask: Any) -> SparseTensor:
    """The rows of ``x`` where ``mask`` (a bool tensor (N,)) is True, in order.

    Differentiable in the features (pruned rows get zero gradient). Keeps ``x``'s identity when the
    mask keeps every row; otherwise the result has a new identity (with ``batch_counts`` recounted
    when ``x`` has them).
    """
    op = "prune"
    check_sparse(op, "input", x)
    m = as_tensor(mask, "mask", op)
    if m.dtype != torch.bool:
        raise TypeError(f"[{op}] mask: expected a bool tensor of shape (N={len(x)},), got {m.dtype}")
    if tuple(m.shape) != (len(x),):
        raise ValueError(f"[{op}] mask: expected shape (N={len(x)},), got {tuple(m.shape)}")
    check_device(op, "mask", m, x.device)
    return _kept(x, from_core(core.prune_rows(to_core(x.coords), to_core(m.to(torch.uint8).contiguous()))))


def _kept(x: SparseTensor, rows: torch.Tensor) -> SparseTensor:
    """``x`` itself (same identity) when ``rows`` keeps every row, else those rows."""
    if rows.shape[0] == len(x):
        return x.replace_feats(x.feats)
    return _rows_subset(x, rows)


def crop(x: SparseTensor, lo: IntOr3, hi: IntOr3) -> SparseTensor:
    """The rows of ``x`` inside the box ``lo <= (x, y, z) < hi`` (lo inclusive, hi exclusive), in order.

    The box is in ``x``'s logical coordinates (the units of ``x.coords``, i.e. at its stride) and
    applies to every batch. ``hi >= lo`` per axis (an empty box gives an empty tensor). Identity as
    for :func:`prune`.
    """
    op = "crop"
    check_sparse(op, "input", x)
    lo3 = as_triple(lo, "lo", op)
    hi3 = as_triple(hi, "hi", op)
    if any(h < l for l, h in zip(lo3, hi3)):
        raise ValueError(f"[{op}] hi: expected values >= lo {lo3} on every axis, got {hi3}")
    return _kept(x, from_core(core.crop_rows(to_core(x.coords), lo3, hi3)))


def _sample(op: str, i: int, sample: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(coords (N, 3|4) int32 contiguous: the batch column, if any, is ignored; feats (N, C))."""
    if isinstance(sample, SparseTensor):
        return sample.coords, sample.feats
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise TypeError(
            f"[{op}] samples[{i}]: expected a (coords, feats) pair or a lattice.SparseTensor, got {type(sample).__name__}"
        )
    coords = coords_tensor(op, f"samples[{i}] coords", sample[0], (3, 4))
    feats = as_tensor(sample[1], f"samples[{i}] feats", op)
    if not feats.dtype.is_floating_point:
        raise TypeError(f"[{op}] samples[{i}] feats: expected a float tensor, got {feats.dtype}")
    if feats.dim() != 2 or feats.shape[0] != coords.shape[0]:
        raise ValueError(f"[{op}] samples[{i}] feats: expected shape (N={coords.shape[0]}, C), got {tuple(feats.shape)}")
    return coords, feats


def sparse_collate(samples: Sequence[Any], *, stride: IntOr3 = 1, validate: bool = False) -> SparseTensor:
    """One batched SparseTensor from a list of samples.

    Each sample is ``(coords, feats)`` with coords (N_i, 3) ``(x, y, z)`` or (N_i, 4) (its batch column
    is ignored) and feats (N_i, C), or a SparseTensor (its batch column is ignored). Sample i gets
    batch id i; ``batch_counts`` = [N_0, N_1, ...]. Features keep their autograd history (torch.cat).
    All samples share C and the float dtype.

    Rows must be unique within each sample (SEMANTICS.md): they are always checked (the O(N) hash
    index this builds is cached on the result, so the first op on it does not build it again); a
    repeated row raises ``ValueError`` naming the sample, its row and the row it repeats.
    ``validate`` is accepted for compatibility (the check no longer depends on it).
    """
    op = "sparse_collate"
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
        raise TypeError(f"[{op}] samples: expected a sequence of samples, got {type(samples).__name__}")
    if len(samples) == 0:
        raise ValueError(f"[{op}] samples: expected at least one sample, got an empty sequence")
    coords, feats = [], []
    for i, s in enumerate(samples):
        c, f = _sample(op, i, s)
        if i == 0:
            check_device(op, "samples[0] feats", f, c.device)
        else:
            check_device(op, f"samples[{i}] coords", c, feats[0].device)
            check_device(op, f"samples[{i}] feats", f, feats[0].device)
        if feats:
            if f.shape[1] != feats[0].shape[1]:
                raise ValueError(f"[{op}] samples[{i}] feats: expected C={feats[0].shape[1]} columns (those of samples[0]), got {f.shape[1]}")
            if f.dtype != feats[0].dtype:
                raise TypeError(f"[{op}] samples[{i}] feats: expected {feats[0].dtype} (the dtype of samples[0]), got {f.dtype}")
        coords.append(to_core(c))
        feats.append(f)
    batched, counts = core.collate_coords(coords)
    out = SparseTensor(from_core(batched), torch.cat(feats), stride, counts)
    try:
        out._cs.validate(op)
    except ValueError:
        raise _collate_duplicate(op, out.coords, counts) from None
    return out


def _collate_duplicate(op: str, batched: torch.Tensor, counts: Sequence[int]) -> ValueError:
    """The error for repeated rows in sparse_collate's output, in the samples' own terms (sample
    i is batch i, so a repeat always lies within one sample): the first row that repeats an earlier
    row of its sample. Runs only once the index has found a repeat."""
    _, inverse = torch.unique(batched.cpu(), dim=0, return_inverse=True)
    first_row: dict[int, int] = {}
    for r, u in enumerate(inverse.tolist()):
        if u in first_row:
            break
        first_row[u] = r
    else:  # pragma: no cover - the index reported a repeat
        return ValueError(f"[{op}] samples: expected unique rows, got a repeated row")
    start = 0
    for i, n in enumerate(counts):
        if r < start + n:
            break
        start += n
    xyz = tuple(int(v) for v in batched[r, 1:].tolist())
    return ValueError(f"[{op}] samples[{i}] coords: expected unique rows within a sample, got row {r - start} "
                      f"{xyz} equal to row {first_row[u] - start} (merge repeats first, e.g. with "
                      f"lattice.ops.sparse_from_coordinates or sparse_quantize)")


def sparse_from_coordinates(coords: Any, feats: Any, *, reduction: str = "mean", stride: IntOr3 = 1,
                            return_inverse: bool = False) -> Any:
    """A SparseTensor from coordinates that may repeat: repeated rows are reduced into one.

    Output rows are the unique coordinate rows in first-occurrence order; features are the ``sum``
    or the ``mean`` of the rows' features (accumulated in float32 for float16/bfloat16, rounded
    once). Differentiable in ``feats``. With ``return_inverse`` also returns the (N,) int64 input ->
    output row map.
    """
    op = "sparse_from_coordinates"
    if reduction not in ("mean", "sum"):
        raise ValueError(f"[{op}] reduction: expected 'mean' or 'sum', got {reduction!r}")
    c = coords_tensor(op, "coords", coords)
    f = as_tensor(feats, "feats", op)
    if not f.dtype.is_floating_point:
        raise TypeError(f"[{op}] feats: expected a float tensor, got {f.dtype}")
    if f.dim() != 2 or f.shape[0] != c.shape[0]:
        raise ValueError(f"[{op}] feats: expected shape (N={c.shape[0]}, C), got {tuple(f.shape)}")
    check_device(op, "feats", f, c.device)
    unique, inverse = core.downsample_coords(to_core(c), 1, None)
    unique, inverse = from_core(unique), from_core(inverse)
    acc_dtype = torch.float32 if f.dtype in (torch.float16, torch.bfloat16) else f.dtype
    # index_add accumulates in a fixed order on the CPU; on CUDA it uses atomics (float order is
    # not fixed), so the CUDA sum goes through a sort by output row and a segmented reduction
    if f.is_cuda:
        out = _segment_sum(inverse, f.to(acc_dtype), unique.shape[0])
    else:
        out = torch.zeros(unique.shape[0], f.shape[1], dtype=acc_dtype).index_add(0, inverse, f.to(acc_dtype))
    if reduction == "mean":
        counts = torch.bincount(inverse, minlength=unique.shape[0]).to(acc_dtype)
        out = out / counts.clamp_min(1).unsqueeze(1)
    x = SparseTensor(unique, out.to(f.dtype), stride)
    return (x, inverse) if return_inverse else x


def _segment_sum(index: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """(n, C) sums of ``values`` rows grouped by ``index`` (every group non-empty) without float
    atomics: a stable sort by index, then ``torch.segment_reduce`` (one sequential sum per segment,
    deterministic). Differentiable in ``values``."""
    if values.shape[0] == 0 or n == 0:
        return values.new_zeros((n, values.shape[1]))
    order = torch.sort(index, stable=True).indices
    lengths = torch.bincount(index, minlength=n)
    return torch.segment_reduce(values.index_select(0, order), "sum", lengths=lengths, axis=0)


def _available_bytes(device: torch.device) -> Optional[int]:
    """Bytes a new tensor can take on ``device`` now: CUDA free memory plus what torch's caching
    allocator holds unused; on the CPU the kernel's MemAvailable (None when it cannot be read)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def dense(x: SparseTensor, shape: Optional[IntOr3] = None, origin: IntOr3 = 0, *,
          max_bytes: Optional[int] = None) -> torch.Tensor:
    """The dense (B, C, X, Y, Z) grid of ``x`` (channels first, like ``torch.nn.Conv3d``): voxel
    ``(b, x, y, z)`` lands at ``[b, :, x - ox, y - oy, z - oz]``; empty voxels are 0.

    Args:
        shape: (X, Y, Z); default ``max(coords) - origin + 1`` per axis.
        origin: the coordinate of grid cell (0, 0, 0) (default 0); every row must lie in
            ``[origin, origin + shape)`` (ValueError otherwise).
        max_bytes: refuse (ValueError) a grid larger than this many bytes; default: the memory
            available on ``x``'s device now (CUDA: free + cached by torch; CPU: MemAvailable).

    B is ``len(batch_counts)`` when set, else ``max(batch) + 1``. There is no fixed element limit:
    the grid (``B*C*X*Y*Z`` values of the feature dtype) must have fewer than 2^63 elements and fit
    in ``max_bytes``; the ValueError says how much memory it would take. An allocation that fails
    anyway raises MemoryError with the same numbers. Rows must be unique and batch ids >= 0
    (ValueError naming the first offending row otherwise). Differentiable in the features.
    """
    op = "dense"
    check_sparse(op, "input", x)
    o = as_triple(origin, "origin", op)
    xyz = x.coords[:, 1:].long() - torch.tensor(o, device=x.coords.device)
    if shape is None:
        if len(x) and int(xyz.min()) < 0:
            raise ValueError(
                f"[{op}] origin: expected a corner <= every coordinate (pass origin= for negative coordinates), "
                f"got {o} above the minimum {tuple(int(v) for v in (xyz.min(0).values.cpu() + torch.tensor(o)))}"
            )
        size = tuple(int(v) + 1 for v in xyz.max(0).values) if len(x) else (0, 0, 0)
    else:
        size = as_triple(shape, "shape", op)
        if min(size) < 0:
            raise ValueError(f"[{op}] shape: expected non-negative sizes, got {size}")
    batch = x.coords[:, 0].long()
    if len(x) and int(batch.min()) < 0:
        r = int((batch < 0).nonzero()[0, 0])
        raise ValueError(f"[{op}] coords: expected batch ids >= 0, got batch id {int(batch[r])} at row {r}")
    # Rows must be unique (SEMANTICS.md): index_put would keep one of two rows of a cell and drop
    # the other without a sign. The coordinate index is the O(N) hash check naming the first
    # repeated row; it is cached on the coordinate set (free for a tensor an op has indexed).
    x._cs.validate(op)
    b = len(x.batch_counts) if x.batch_counts is not None else (int(batch.max()) + 1 if len(x) else 0)
    c = x.feats.shape[1]
    total = b * c * size[0] * size[1] * size[2]  # Python int: exact
    what = f"{b}*{c}*{size[0]}*{size[1]}*{size[2]} = {total} elements"
    if total > DENSE_MAX_ELEMENTS:
        raise ValueError(f"[{op}] shape: expected a grid of fewer than 2^63 elements (int64 cell indices), got {what}")
    nbytes = total * x.feats.element_size()
    need = f"{what} ({_gib(nbytes)} of {str(x.feats.dtype).replace('torch.', '')})"
    if max_bytes is not None:
        if int(max_bytes) < 0:
            raise ValueError(f"[{op}] max_bytes: expected a non-negative number of bytes, got {max_bytes}")
        if nbytes > int(max_bytes):
            raise ValueError(f"[{op}] shape: expected a grid of at most max_bytes={int(max_bytes)} bytes "
                             f"({_gib(int(max_bytes))}), got {need}")
    else:
        avail = _available_bytes(x.feats.device)
        if avail is not None and nbytes > avail:
            raise ValueError(f"[{op}] shape: expected a grid that fits in the memory available on {x.feats.device} "
                             f"({_gib(avail)}), got {need}; crop first (lattice.ops.crop) or use "
                             f"lattice.models.bev_scatter for a BEV")
    outside = ((xyz < 0) | (xyz >= torch.tensor(size, device=xyz.device))).any(dim=1)
    if bool(outside.any()):
        r = int(outside.nonzero()[0, 0])
        raise ValueError(
            f"[{op}] coords: expected x, y, z within [origin, origin + shape) = [{o}, "
            f"{tuple(a + s for a, s in zip(o, size))}), got row {r} {tuple(x.coords[r].tolist())}"
        )
    cell = from_core(core.dense_index(to_core(x.coords), o, size))
    try:
        grid = x.feats.new_zeros((b * size[0] * size[1] * size[2], c))
    except RuntimeError as e:  # torch's CPU / CUDA allocators report failure as RuntimeError
        raise MemoryError(f"[{op}] shape: expected a grid that can be allocated on {x.feats.device}, got {need}: {e}") from e
    grid.index_put_((cell,), x.feats)  # in place: one grid in memory, not two
    return grid.view(b, *size, c).permute(0, 4, 1, 2, 3)


def from_dense(grid: Any, *, origin: IntOr3 = 0, stride: IntOr3 = 1) -> SparseTensor:
    """A SparseTensor of the sites of a dense (B, C, X, Y, Z) grid where any channel is non-zero.

    Rows come in (batch, x, y, z) lexicographic order with coordinates ``index + origin``;
    ``batch_counts`` has B entries. Differentiable in the grid values that are kept.
    """
    op = "from_dense"
    g = as_tensor(grid, "dense", op)
    if not g.dtype.is_floating_point:
        raise TypeError(f"[{op}] dense: expected a float tensor, got {g.dtype}")
    if g.dim() != 5:
        raise ValueError(f"[{op}] dense: expected shape (B, C, X, Y, Z), got {tuple(g.shape)}")
    o = as_triple(origin, "origin", op)
    last = g.permute(0, 2, 3, 4, 1)  # (B, X, Y, Z, C)
    site = (last != 0).any(dim=-1)
    hi = [int(s) - 1 + int(v) for s, v in zip(g.shape[2:], o)]
    if any(v > _INT32_MAX for v in hi):
        raise ValueError(f"[{op}] origin: expected origin + shape within int32, got origin {o} with shape {tuple(g.shape[2:])}")
    coords, cell, counts = core.nonzero_sites(to_core(site.to(torch.uint8).contiguous()), o)  # lexicographic
    feats = last.reshape(site.numel(), g.shape[1]).index_select(0, from_core(cell))
    return SparseTensor(from_core(coords), feats, stride, counts)


EXPLAINED = ("union_coords", "intersection_coords", "lookup_coords", "contains_coords", "downsample_coords",
             "morton_codes", "morton_order", "sparse_from_coordinates", "prune", "crop", "sparse_collate", "dense",
             "from_dense")


def _collate_rows(samples: Any) -> int:
    """Total rows of sparse_collate's samples (validated as sparse_collate does, without features)."""
    op = "sparse_collate"
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
        raise TypeError(f"[{op}] samples: expected a sequence of samples, got {type(samples).__name__}")
    return sum(len(s) if isinstance(s, SparseTensor) else int(_sample(op, i, s)[0].shape[0])
               for i, s in enumerate(samples))


def _samples_device(samples: Any) -> str:
    """The device sparse_collate runs on: that of its first sample's coordinates (cpu when empty)."""
    for s in samples:
        c = s.coords if isinstance(s, SparseTensor) else (s[0] if isinstance(s, (tuple, list)) and s else None)
        if isinstance(c, torch.Tensor):
            return str(c.device)
        break
    return "cpu"


def explain(op: str, *args: Any, **kwargs: Any) -> Any:
    """Route decision of a coordinate utility called with these arguments (without running it)."""
    kwargs.pop("pass_", None)
    if op in ("union_coords", "intersection_coords"):
        a, b = _pair(op, *args[:2])
        return core.explain_align(op, a, b, "outer" if op == "union_coords" else "inner")
    if op in ("lookup_coords", "contains_coords"):
        table = _coordinate_set(op, "coords", args[0], 1)
        return core.explain_lookup(op, table, int(coords_tensor(op, "queries", args[1]).shape[0]))
    if op in ("prune", "crop", "dense"):
        check_sparse(op, "input", args[0] if args else None)
        return core.explain_coords(op, to_core(args[0].coords))
    if op == "sparse_collate":
        samples = args[0] if args else kwargs.get("samples")
        return core.explain_coords_rows(op, _collate_rows(samples), _samples_device(samples))
    if op == "from_dense":
        g = as_tensor(args[0] if args else kwargs.get("grid"), "dense", op)
        cells = int(g.shape[0] * g.shape[2] * g.shape[3] * g.shape[4]) if g.dim() == 5 else 0
        return core.explain_coords_rows(op, cells, str(g.device))
    widths = (3, 4) if op.startswith("morton") else (4,)
    name = "downsample_coords" if op == "sparse_from_coordinates" else op
    return core.explain_coords(name, to_core(coords_tensor(op, "coords", args[0], widths)))
