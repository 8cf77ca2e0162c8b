"""Self-checks of the point <-> voxel oracle on hand-computed cases (and independent dense
matrix formulations), never by calling the function under test twice."""

from __future__ import annotations

import numpy as np
import pytest

from .point_voxel import devoxelize, devoxelize_backward, point_voxel_map, voxelize, voxelize_backward
from .quantize import sparse_quantize

# Voxel 0 = (0, 0, 0, 0) holds points 0, 1, 3; voxel 1 = (0, -1, 0, 0) holds point 2.
PTS = np.array([[0.5, 0.5, 0.5], [0.2, 0.9, 0.1], [-0.5, 0.0, 0.0], [0.7, 0.7, 0.7]])
FEATS = np.array([[1.0, 2.0], [3.0, -1.0], [5.0, 5.0], [3.0, 2.0]])


def test_voxelize_sum_mean_max_hand_computed() -> None:
    coords, out, _ = voxelize(PTS, FEATS, 1.0, "sum")
    assert coords.tolist() == [[0, 0, 0, 0], [0, -1, 0, 0]]
    assert out.tolist() == [[7.0, 3.0], [5.0, 5.0]]
    _, out, _ = voxelize(PTS, FEATS, 1.0, "mean")
    np.testing.assert_allclose(out, [[7 / 3, 1.0], [5.0, 5.0]], rtol=0, atol=1e-15)
    _, out, argmax = voxelize(PTS, FEATS, 1.0, "max")
    assert out.tolist() == [[3.0, 2.0], [5.0, 5.0]]
    # channel 0: 3 at points 1 and 3 -> the first (1); channel 1: 2 at points 0 and 3 -> 0
    assert argmax.tolist() == [[1, 0], [2, 2]]


def test_voxelize_backward_hand_computed() -> None:
    _, inverse, counts = sparse_quantize(PTS, 1.0)
    dy = np.array([[1.0, 10.0], [100.0, 1000.0]])
    assert voxelize_backward(dy, inverse, counts, "sum").tolist() == [[1, 10], [1, 10], [100, 1000], [1, 10]]
    np.testing.assert_allclose(
        voxelize_backward(dy, inverse, counts, "mean"), [[1 / 3, 10 / 3], [1 / 3, 10 / 3], [100, 1000], [1 / 3, 10 / 3]]
    )
    _, _, argmax = voxelize(PTS, FEATS, 1.0, "max")
    assert voxelize_backward(dy, inverse, counts, "max", argmax).tolist() == [[0, 10], [1, 0], [100, 1000], [0, 0]]


def test_voxelize_max_nan_is_the_maximum_and_first_nan_wins() -> None:
    pts = np.zeros((4, 3))
    f = np.array([[1.0], [np.nan], [5.0], [np.nan]])
    _, out, argmax = voxelize(pts, f, 1.0, "max")
    assert np.isnan(out[0, 0]) and argmax.tolist() == [[1]]


def test_voxelize_sum_equals_dense_one_hot_product() -> None:
    rng = np.random.default_rng(0)
    pts = rng.uniform(-2, 2, (50, 3))
    f = rng.standard_normal((50, 3))
    b = rng.integers(0, 2, 50)
    coords, out, _ = voxelize(pts, f, 0.7, "sum", b)
    _, inverse, _ = sparse_quantize(pts, 0.7, b)
    onehot = np.zeros((coords.shape[0], 50))
    onehot[inverse, np.arange(50)] = 1.0
    np.testing.assert_allclose(out, onehot @ f, rtol=1e-13, atol=1e-13)


def test_point_voxel_map_nearest_hand_computed_with_border_and_missing_voxel() -> None:
    voxels = np.array([[0, 0, 0, 0], [0, -1, 0, 0], [1, 0, 0, 0]])
    pts = np.array([[0.0, 0.0, 0.0], [-1e-12, 0.5, 0.5], [1.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
    idx, w = point_voxel_map(pts, voxels, 1.0, "nearest", batch_indices=[0, 0, 0, 1])
    assert idx[:, 0].tolist() == [0, 1, -1, 2]  # 1.0 lies in voxel 1 (absent); batch 1 has its own voxel
    assert w[:, 0].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert (idx[:, 1:] == -1).all() and (w[:, 1:] == 0).all()


def test_point_voxel_map_trilinear_hand_computed_weights() -> None:
    voxels = np.array([[0, 0, 0, 0], [0, 1, 0, 0]])
    # centres at 0.5 and 1.5 on x; (1.0, .5, .5) sits half way, (0.75, .5, .5) a quarter of the way
    idx, w = point_voxel_map([[1.0, 0.5, 0.5], [0.75, 0.5, 0.5]], voxels, 1.0, "trilinear", normalize=False)
    assert idx[0].tolist() == [0, -1, -1, -1, 1, -1, -1, -1]
    assert w[0].tolist() == [0.5, 0, 0, 0, 0.5, 0, 0, 0]
    assert w[1].tolist() == [0.75, 0, 0, 0, 0.25, 0, 0, 0]


def test_point_voxel_map_trilinear_renormalises_missing_corners() -> None:
    voxels = np.array([[0, 0, 0, 0]])
    _, raw = point_voxel_map([[1.0, 0.5, 0.5]], voxels, 1.0, "trilinear", normalize=False)
    _, norm = point_voxel_map([[1.0, 0.5, 0.5]], voxels, 1.0, "trilinear", normalize=True)
    assert raw[0, 0] == 0.5 and norm[0, 0] == 1.0


def test_point_voxel_map_trilinear_negative_coordinates() -> None:
    voxels = np.array([[0, 0, 0, 0], [0, -1, -1, -1]])
    # u = -0.75 per axis -> lower -1, t = 0.25: corner (-1,-1,-1) is k=0 (0.75^3), (0,0,0) is k=7 (0.25^3)
    idx, w = point_voxel_map([[-0.25, -0.25, -0.25]], voxels, 1.0, "trilinear", normalize=False)
    assert idx[0, 0] == 1 and idx[0, 7] == 0
    np.testing.assert_allclose([w[0, 0], w[0, 7]], [27 / 64, 1 / 64], rtol=1e-15)
    _, wn = point_voxel_map([[-0.25, -0.25, -0.25]], voxels, 1.0, "trilinear")
    np.testing.assert_allclose([wn[0, 0], wn[0, 7]], [27 / 28, 1 / 28], rtol=1e-14)


def test_point_voxel_map_all_corners_missing_gives_zeros() -> None:
    idx, w = point_voxel_map([[10.0, 10.0, 10.0]], np.array([[0, 0, 0, 0]]), 1.0, "trilinear")
    assert (idx == -1).all() and (w == 0).all()


def test_point_voxel_map_stride_scales_the_voxel_size() -> None:
    # stride-2 voxels: base voxel floor((-0.5, 1.5, 0.2)) = (-1, 1, 0) -> floor_div by 2 -> (-1, 0, 0)
    idx, _ = point_voxel_map([[-0.5, 1.5, 0.2]], np.array([[0, -1, 0, 0]]), 1.0, "nearest", stride=2)
    assert idx[0, 0] == 0
    # physical size 2: the centre of voxel 0 is (1, 1, 1)
    idx, w = point_voxel_map([[1.0, 1.0, 1.0]], np.array([[0, 0, 0, 0]]), 1.0, "trilinear", stride=2)
    assert idx[0, 0] == 0 and w[0, 0] == 1.0


def test_devoxelize_hand_computed_and_backward_is_the_transpose() -> None:
    vf = np.array([[1.0, 2.0], [3.0, 4.0]])
    idx = np.full((1, 8), -1)
    idx[0, 0], idx[0, 4] = 0, 1
    w = np.zeros((1, 8))
    w[0, 0], w[0, 4] = 0.5, 0.5
    assert devoxelize(vf, idx, w).tolist() == [[2.0, 3.0]]
    assert devoxelize_backward([[1.0, 1.0]], idx, w, 2).tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_devoxelize_equals_dense_interpolation_matrix() -> None:
    rng = np.random.default_rng(1)
    pts = rng.uniform(-2, 2, (40, 3))
    coords, _, _ = sparse_quantize(rng.uniform(-2, 2, (60, 3)), 0.5)
    idx, w = point_voxel_map(pts, coords, 0.5, "trilinear")
    dense = np.zeros((40, coords.shape[0]))
    for p in range(40):
        for k in range(8):
            if idx[p, k] >= 0:
                dense[p, idx[p, k]] += w[p, k]
    vf = rng.standard_normal((coords.shape[0], 3))
    dy = rng.standard_normal((40, 3))
    np.testing.assert_allclose(devoxelize(vf, idx, w), dense @ vf, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(devoxelize_backward(dy, idx, w, coords.shape[0]), dense.T @ dy, rtol=1e-13, atol=1e-13)
    rows = dense.sum(axis=1)
    assert np.all((np.abs(rows - 1) < 1e-12) | (rows == 0))  # normalised rows sum to 1 or are empty


def test_sparse_quantize_drop_invalid_equals_quantizing_the_kept_points() -> None:
    pts = np.array([[0.5, 0.5, 0.5], [np.nan, 0, 0], [1.5, 0, 0], [0, np.inf, 0], [0.1, 0.2, 0.3]])
    coords, inv, counts, kept = sparse_quantize(pts, 1.0, np.array([0, 5, 1, 5, 0]), drop_invalid=True)
    assert kept.tolist() == [True, False, True, False, True]
    assert coords.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0]]
    assert inv.tolist() == [0, 1, 0] and counts.tolist() == [2, 1]
    with pytest.raises(ValueError):
        sparse_quantize(pts, 1.0)
