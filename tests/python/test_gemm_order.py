"""The mask order of a relation's rows (``Relation.gemm_order`` / ``input_gemm_order``).

CUDA implicit-GEMM tiles take 128 rows at a time and visit every kernel offset that any row of the
tile has. In index order a tile of a LiDAR scan's rows sees most of the 27 offsets of a 3^3
kernel while each row has about three; the tiles therefore take the rows sorted by their offset
mask, so that a tile's rows share offsets. What these tests prove:

* the order is a permutation of the rows, sorted by the offset mask (bit k set iff the row has an
  edge of offset k; the mask is recomputed here from the edge list), stable (rows of one mask keep
  ascending index order), for the output side and the input side, on CPU and CUDA, with CUDA equal
  to CPU bitwise; kernel volumes above 64 have no order (None); a submanifold relation's input
  side mirrors its output side: its input order is its output order (which groups the input
  masks, the bit-reversed output masks, just as well) and its input map the scatter's, exactly;
* on a simulated LiDAR scan the mask order visits at most half the offsets per tile that index
  order does (what the order is for: if it stopped grouping rows it would fail here);
* the CUDA implicit-GEMM route with the order (forward, input and weight gradients) equals the
  CPU reference route, also for kernel volumes without an order (125: per-tile masks; 729: above
  the mask's 512 offsets, every offset visited) and for channel counts that need several weight-
  gradient runs per offset and several tiles; it is deterministic (two runs bitwise equal).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cuda_admission as adm
import lattice
from conftest import random_coords
from lattice import ops
from lattice.bench import workloads
from lattice.tensor import SparseTensor

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")

# name -> (op, kernel_size, kwargs, kernel volume)
GEOMS = {
    "subm3": ("subm_conv3d", 3, {}, 27),
    "k2s2": ("conv3d", 2, {"stride": 2}, 8),
    "k4s1": ("conv3d", 4, {}, 64),  # the widest mask (64-bit keys)
    "subm5": ("subm_conv3d", 5, {}, 125),  # no order
    "subm1": ("subm_conv3d", 1, {}, 1),  # the identity: no order (index order is the mask order)
}


def _np(t) -> np.ndarray:
    return lattice._core.from_core(t).cpu().numpy()


def _plan(geom: str, device: str, n: int = 3000, seed: int = 3):
    op, k, kw, _ = GEOMS[geom]
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, n, batches=2, extent=12, spread=14))
    x = SparseTensor(coords.to(device), torch.zeros(coords.shape[0], 2, device=device))
    w = torch.zeros(3, *(k,) * 3, 2, device=device)
    kind = "submanifold" if op == "subm_conv3d" else "forward"
    return ops.conv.plan(op, kind, x, w, kernel_size=k, **kw)


def _masks(rows: np.ndarray, k: np.ndarray, n: int) -> np.ndarray:
    """uint64 offset mask of each of n rows from an edge list (rows[e] has offset k[e])."""
    m = np.zeros(n, dtype=np.uint64)
    np.bitwise_or.at(m, rows.astype(np.int64), np.left_shift(np.uint64(1), k.astype(np.uint64)))
    return m


def _check_order(order: np.ndarray, masks: np.ndarray, what: str) -> None:
    n = masks.shape[0]
    assert order.dtype == np.int32 and order.shape == (n,), what
    assert np.array_equal(np.sort(order), np.arange(n)), f"{what}: not a permutation"
    expected = np.lexsort((np.arange(n), masks))  # by mask, ties by row index
    assert np.array_equal(order, expected), f"{what}: not the stable mask order"


def _check_groups(order: np.ndarray, masks: np.ndarray, what: str) -> None:
    """A permutation under which the rows of each mask are consecutive, in ascending row order."""
    n = masks.shape[0]
    assert order.dtype == np.int32 and order.shape == (n,), what
    assert np.array_equal(np.sort(order), np.arange(n)), f"{what}: not a permutation"
    m = masks[order]
    starts = np.flatnonzero(np.r_[True, m[1:] != m[:-1]])
    assert len(np.unique(m)) == len(starts), f"{what}: the rows of a mask are not consecutive"
    ends = np.r_[starts[1:], n]
    assert all((np.diff(order[s:e]) > 0).all() for s, e in zip(starts, ends)), f"{what}: not stable"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("geom", list(GEOMS))
def test_order_is_the_stable_mask_order(device, geom) -> None:
    p = _plan(geom, device)
    rel = p.relation
    kvol = GEOMS[geom][3]
    assert rel.kernel_volume == kvol
    if kvol > 64 or kvol == 1:
        assert rel.gemm_order() is None and rel.input_gemm_order() is None
        if kvol == 1:
            assert rel.identity and rel.n_edges == rel.n_out == rel.n_in
        return
    a = {k: _np(v) for k, v in rel.arrays().items()}
    assert rel.n_edges > rel.n_out, "the case must have neighbours"
    _check_order(_np(rel.gemm_order()), _masks(a["out_idx"], a["k_idx"], rel.n_out), f"{geom} output side")
    in_masks = _masks(a["in_idx"], a["k_idx"], rel.n_in)
    if rel.mirrors_itself():  # submanifold: the input order is the output order, and it groups the input side
        assert geom.startswith("subm")
        assert np.array_equal(_np(rel.input_gemm_order()), _np(rel.gemm_order()))
        _check_groups(_np(rel.input_gemm_order()), in_masks, f"{geom} input side")
        # the mirrored map is the scatter's: input row i reaches output o through k iff o reaches i through K-1-k
        inv = np.full((rel.n_in, kvol), -1, dtype=np.int32)
        inv[a["in_idx"], a["k_idx"]] = a["out_idx"]
        assert np.array_equal(_np(rel.input_gemm_map()), inv)
    else:
        assert not geom.startswith("subm")
        _check_order(_np(rel.input_gemm_order()), in_masks, f"{geom} input side")
    assert lattice._core.from_core(rel.gemm_order()).device.type == device


@needs_gpu
@pytest.mark.parametrize("geom", ["subm3", "k2s2", "k4s1"])
def test_cuda_order_equals_cpu_order(geom) -> None:
    a, b = _plan(geom, "cpu").relation, _plan(geom, "cuda").relation
    for name in ("gemm_order", "input_gemm_order"):
        assert np.array_equal(_np(getattr(a, name)()), _np(getattr(b, name)())), name


def _tile_offsets(masks: np.ndarray, tile: int = 128) -> float:
    """Mean number of offsets a tile of consecutive rows visits (popcount of the tiles' OR)."""
    ors = [np.bitwise_or.reduce(masks[i:i + tile]) for i in range(0, masks.shape[0], tile)]
    return float(np.mean([bin(int(v)).count("1") for v in ors]))


def test_mask_order_halves_the_offsets_a_tile_visits_on_a_lidar_scan() -> None:
    coords = torch.from_numpy(workloads._fallback_lidar(azimuth_steps=1024).astype(np.int32))
    x = SparseTensor(coords, torch.zeros(coords.shape[0], 1))
    p = ops.conv.plan("subm_conv3d", "submanifold", x, torch.zeros(1, 3, 3, 3, 1), kernel_size=3)
    rel = p.relation
    a = {k: _np(v) for k, v in rel.arrays().items()}
    masks = _masks(a["out_idx"], a["k_idx"], rel.n_out)
    index_order, mask_order = _tile_offsets(masks), _tile_offsets(masks[_np(rel.gemm_order())])
    per_row = rel.n_edges / rel.n_out
    assert mask_order <= 0.5 * index_order, (index_order, mask_order)
    assert mask_order >= per_row  # a tile visits at least what its rows have on average


# ---- the CUDA route with and without an order, against the CPU reference ----------------------


def _conv(op, x, w, b, gy, route, kw):
    fx = x.feats.detach().clone().requires_grad_(True)
    fw = w.detach().clone().requires_grad_(True)
    fb = b.detach().clone().requires_grad_(True)
    y = getattr(ops, op)(x.replace_feats(fx), fw, fb, route=route, **kw)
    grads = torch.autograd.grad(y.feats, (fx, fw, fb), gy)
    return [y.feats.detach(), *grads]


CUDA_CASES = [
    # (op, kernel_size, kwargs, rows, c_in, c_out, dtype)
    ("subm_conv3d", 3, {}, 6000, 64, 64, torch.float16),     # ordered, 16-byte copies
    ("subm_conv3d", 3, {}, 6000, 40, 24, torch.bfloat16),    # ordered, element loads
    ("conv3d", 2, {"stride": 2}, 6000, 32, 64, torch.float16),
    ("subm_conv3d", 3, {}, 20000, 160, 192, torch.float16),  # several C tiles; weight runs doubled
    ("subm_conv3d", 3, {}, 5000, 72, 100, torch.bfloat16),   # 128-channel tiles with element loads
    # A full 18^3 block (rows = -side): every row has nearly all 27 offsets, so the kernel takes
    # 128-row tiles (the sparse cases above take 64-row tiles).
    ("subm_conv3d", 3, {}, -18, 64, 64, torch.float16),
    ("subm_conv3d", 3, {}, -18, 72, 100, torch.bfloat16),
    ("subm_conv3d", 5, {}, 3000, 16, 16, torch.float16),     # K = 125: no order, tile masks
    ("subm_conv3d", 9, {}, 1500, 8, 8, torch.float16),       # K = 729: every offset visited
]


@needs_gpu
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: f"{c[0]}_k{c[1]}_n{c[3]}_{c[4]}x{c[5]}_{str(c[6])[6:]}")
def test_implicit_gemm_route_matches_the_reference(case) -> None:
    op, k, kw, n, c_in, c_out, dtype = case
    rng = np.random.default_rng(11)
    if n < 0:
        side = -n
        g3 = np.stack(np.meshgrid(*([np.arange(side)] * 3), indexing="ij"), -1).reshape(-1, 3)
        coords = torch.from_numpy(np.concatenate([np.zeros((len(g3), 1), np.int64), g3], 1).astype(np.int32))
    else:
        coords = torch.from_numpy(random_coords(rng, n, batches=2, extent=int(round(n ** (1 / 3) * 1.6)), spread=20))
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(coords.shape[0], c_in, generator=g).to(dtype)
    kvol = k ** 3
    w = (torch.randn(c_out, k, k, k, c_in, generator=g) / math.sqrt(c_in * kvol)).to(dtype)
    b = torch.randn(c_out, generator=g).to(dtype)
    kw = dict(kw, kernel_size=k)
    ref_y = getattr(ops, op)(SparseTensor(coords, feats), w, b, route="reference", **kw)
    gy = torch.randn(ref_y.feats.shape, generator=g).to(dtype)
    ref = _conv(op, SparseTensor(coords, feats), w, b, gy, "reference", kw)
    xc = SparseTensor(coords.cuda(), feats.cuda())
    runs = [_conv(op, xc, w.cuda(), b.cuda(), gy.cuda(), "implicit_gemm_sm80", kw) for _ in range(2)]
    tol_name = "f16" if dtype == torch.float16 else "bf16"  # the parity suite's (SEMANTICS.md) bounds
    for name, got, want in zip(("forward", "input grad", "weight grad", "bias grad"), runs[0], ref):
        problems = adm.compare(got, want, tol_name)
        assert not problems, f"{name}: {problems}"
    for a, c in zip(runs[0], runs[1]):
        assert torch.equal(a, c), "two runs differ"
