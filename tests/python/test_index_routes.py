"""The index builders of pooling and the point family are routes (issue 11, "every choice is a
route"): global pooling's rows per batch and trilinear upsampling's neighbours (family
"pool_edges"), batch id checks and the CSR of points per voxel (family "point_index"), each with a
CPU reference row and a CUDA row chosen by device. These tests prove that the rows exist, that
explain() of a pooling op shows the edge route it ran (every row with its verdict), and that the
reference routes' results are the documented rules (compared with independent numpy builds).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from conftest import random_coords
from lattice import ops
from lattice.routes import route_names
from lattice.tensor import SparseTensor


def _tensor(n: int = 120, batches: int = 3) -> SparseTensor:
    c = torch.from_numpy(random_coords(np.random.default_rng(5), n, batches=batches, extent=6, spread=4))
    return SparseTensor(c, torch.randn(c.shape[0], 3, dtype=torch.float64))


def test_index_families_are_in_the_route_table():
    for family in ("pool_edges", "point_index"):
        assert route_names(family) == ["cuda", "reference"]
        assert route_names(family, device="cpu") == ["reference"]


@pytest.mark.parametrize("op", ["global_avg_pool", "global_max_pool"])
def test_global_pool_explains_its_batch_edge_route(op):
    x = _tensor()
    e = lattice.explain(op, x)
    (edges,) = e.prior
    assert edges.chosen == "reference" and "batch edges" in edges.problem
    rows = {r["route"]: r for r in edges.rows}
    assert rows["cuda"]["reason"] == "runs on cuda; the data is on cpu"
    assert str(e).startswith("first:\n") and "-> reference" in str(e).split(f"route decision for {op} forward")[0]


def test_trilinear_upsample_explains_its_edge_route():
    c = _tensor()
    x = SparseTensor(c.coords, c.feats, stride=2)  # a coarse level: upsampled by 2 per axis
    (edges,) = lattice.explain("trilinear_upsample3d", x).prior
    assert edges.chosen == "reference" and "trilinear edges" in edges.problem


def test_local_pooling_has_no_edge_route():
    """Local pooling reads the relation's edge list; no pool_edges decision is made."""
    assert lattice.explain("max_pool3d", _tensor(), kernel_size=2, stride=2).prior == []


def test_batch_edge_route_groups_rows_by_batch_in_row_order():
    """global_sum_pool through the reference edge route equals a numpy segment sum (rows of each
    batch in row order, so float64 sums agree exactly with a sequential numpy loop)."""
    x = _tensor()
    got = ops.global_sum_pool(x).numpy()
    c = x.coords.numpy()
    f = x.feats.numpy()
    want = np.zeros((c[:, 0].max() + 1, f.shape[1]))
    for r in range(c.shape[0]):
        want[c[r, 0]] += f[r]
    np.testing.assert_array_equal(got, want)


def test_point_batch_ids_are_checked_by_the_reference_route():
    pts = torch.rand(50, 3, dtype=torch.float64) * 4
    bad = torch.zeros(50, dtype=torch.int64)
    bad[7] = -3
    with pytest.raises(ValueError, match=r"batch_indices: expected batch ids >= 0, got batch id -3 at row 7"):
        ops.sparse_quantize(pts, 1.0, batch_indices=bad)
