"""Self-checks of the algebra, coordinate-utility and feature-op oracles on hand-computed cases
(never by calling the function under test twice)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from . import algebra as A
from . import features as FO

LINE_L = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]])  # three points on a line
LINE_R = np.array([[0, 2, 0, 0], [0, 5, 0, 0], [0, 1, 0, 0]])
FL = np.array([[1.0], [2.0], [3.0]])
FR = np.array([[10.0], [20.0], [30.0]])


@pytest.mark.parametrize("join, coords_x, lrows, rrows", [
    ("inner", [1, 2], [1, 2], [2, 0]),
    ("left", [0, 1, 2], [0, 1, 2], [-1, 2, 0]),
    ("right", [2, 5, 1], [2, -1, 1], [0, 1, 2]),
    ("outer", [0, 1, 2, 5], [0, 1, 2, -1], [-1, 2, 0, 1]),
])
def test_align_line_hand_computed(join, coords_x, lrows, rrows):
    coords, l, r = A.align(LINE_L, LINE_R, join)
    assert coords[:, 1].tolist() == coords_x and (coords[:, [0, 2, 3]] == 0).all()
    assert l.tolist() == lrows and r.tolist() == rrows


def test_align_batch_is_part_of_the_key():
    coords, l, r = A.align([[0, 1, 1, 1]], [[1, 1, 1, 1]], "outer")
    assert coords.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]] and l.tolist() == [0, -1] and r.tolist() == [-1, 0]


def test_align_rejects_repeated_rows():
    with pytest.raises(ValueError, match="repeats"):
        A.align([[0, 1, 1, 1], [0, 1, 1, 1]], [[0, 0, 0, 0]], "inner")


def test_sparse_binary_defaults_and_fill_hand_computed():
    c, f = A.sparse_binary("add", LINE_L, FL, LINE_R, FR)  # outer
    assert f[:, 0].tolist() == [1.0, 32.0, 13.0, 20.0]
    c, f = A.sparse_binary("sub", LINE_L, FL, LINE_R, FR, fill=1.0)
    assert f[:, 0].tolist() == [0.0, -28.0, -7.0, -19.0]
    c, f = A.sparse_binary("mul", LINE_L, FL, LINE_R, FR)  # inner
    assert c[:, 1].tolist() == [1, 2] and f[:, 0].tolist() == [60.0, 30.0]
    c, f = A.sparse_binary("cat", LINE_L, FL, LINE_R, FR, join="left", fill=-1.0)
    assert f.tolist() == [[1.0, -1.0], [2.0, 30.0], [3.0, 10.0]]


def test_maximum_minimum_ties_choose_lhs_and_route_the_gradient_there():
    l, r = np.array([0, 1]), np.array([0, 1])
    x = np.array([[1.0, 5.0], [2.0, np.nan]])
    y = np.array([[1.0, 4.0], [3.0, 0.0]])
    assert A.combine("maximum", x, y, l, r)[0].tolist() == [1.0, 5.0]
    assert A.combine("minimum", x, y, l, r)[0].tolist() == [1.0, 4.0]
    assert np.isnan(A.combine("maximum", x, y, l, r)[1, 1])
    g = np.ones((2, 2))
    dx, dy = A.combine_backward("maximum", x, y, l, r, g)
    assert dx.tolist() == [[1.0, 1.0], [0.0, 1.0]] and dy.tolist() == [[0.0, 0.0], [1.0, 0.0]]
    dx, dy = A.combine_backward("minimum", x, y, l, r, g)
    assert dx.tolist() == [[1.0, 0.0], [1.0, 1.0]] and dy.tolist() == [[0.0, 1.0], [0.0, 0.0]]


def test_combine_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 2)), rng.standard_normal((4, 2))
    l, r = np.array([0, 2, -1, 1]), np.array([3, -1, 0, 1])
    g = rng.standard_normal((4, 2))
    for op in ("add", "sub", "mul", "maximum", "minimum"):
        dx, dy = A.combine_backward(op, x, y, l, r, g, fill=0.5)
        for arr, grad, which in ((x, dx, 0), (y, dy, 1)):
            num = np.zeros_like(arr)
            for idx in np.ndindex(*arr.shape):
                hi, lo = arr.copy(), arr.copy()
                hi[idx] += 1e-6
                lo[idx] -= 1e-6
                args_hi = (hi, y) if which == 0 else (x, hi)
                args_lo = (lo, y) if which == 0 else (x, lo)
                f_hi = (A.combine(op, *args_hi, l, r, 0.5) * g).sum()
                f_lo = (A.combine(op, *args_lo, l, r, 0.5) * g).sum()
                num[idx] = (f_hi - f_lo) / 2e-6
            np.testing.assert_allclose(grad, num, atol=1e-6, err_msg=f"{op} d{'xy'[which]}")


def test_lookup_union_intersection_hand_computed():
    assert A.lookup_coords(LINE_L, [[0, 2, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]).tolist() == [2, 2, -1, 0]
    assert A.union_coords(LINE_L, LINE_R)[:, 1].tolist() == [0, 1, 2, 5]
    assert A.intersection_coords(LINE_R, LINE_L)[:, 1].tolist() == [2, 1]


def test_downsample_floor_divides_and_keeps_first_occurrence():
    c = [[0, -1, 0, 3], [0, -2, 1, 2], [1, -1, 0, 3], [0, 1, 0, 3], [0, 0, 1, 2]]
    out, inv = A.downsample_coords(c, (2, 2, 4))
    assert out.tolist() == [[0, -1, 0, 0], [1, -1, 0, 0], [0, 0, 0, 0]]
    assert inv.tolist() == [0, 0, 1, 2, 2]


def test_morton_code_interleaves_with_x_most_significant():
    base = A.morton_code(0, 0, 0)
    assert base == (0b111 << 60)  # every value is 2^20 after the offset: bit 20 of each axis
    assert A.morton_code(-(1 << 20), -(1 << 20), -(1 << 20)) == 0
    assert A.morton_code(-(1 << 20), -(1 << 20), -(1 << 20) + 1) == 1
    assert A.morton_code(-(1 << 20), -(1 << 20) + 1, -(1 << 20)) == 2
    assert A.morton_code(-(1 << 20) + 1, -(1 << 20), -(1 << 20)) == 4
    assert A.morton_code(-(1 << 20) + 2, -(1 << 20), -(1 << 20)) == 32
    assert A.morton_code((1 << 20) - 1, (1 << 20) - 1, (1 << 20) - 1) == (1 << 63) - 1
    with pytest.raises(ValueError):
        A.morton_code(1 << 20, 0, 0)
    order = A.morton_order([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]])
    assert order.tolist() == [2, 3, 1, 0]


def test_crop_collate_from_coordinates_dense_hand_computed():
    c = np.array([[0, 0, 0, 0], [0, 1, 1, 1], [0, 2, 0, 0], [1, -1, 0, 0]])
    assert A.crop_mask(c, 0, 2).tolist() == [True, True, False, False]
    coords, feats, counts = A.collate([(np.array([[5, 5, 5]]), [[1.0]]), (np.array([[9, 1, 2, 3], [9, 0, 0, 0]]), [[2.0], [3.0]])])
    assert coords.tolist() == [[0, 5, 5, 5], [1, 1, 2, 3], [1, 0, 0, 0]] and counts == [1, 2]
    u, f, inv = A.from_coordinates([[0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 1]], [[1.0], [2.0], [5.0]])
    assert u.tolist() == [[0, 1, 1, 1], [0, 0, 0, 0]] and f[:, 0].tolist() == [3.0, 2.0] and inv.tolist() == [0, 1, 0]
    g = A.to_dense([[0, 1, 0, 0], [1, 0, 1, 0]], [[1.0, 2.0], [3.0, 4.0]], 2, (2, 2, 1))
    assert g.shape == (2, 2, 2, 2, 1) and g[0, :, 1, 0, 0].tolist() == [1.0, 2.0] and g[1, :, 0, 1, 0].tolist() == [3.0, 4.0]
    assert g.sum() == 10.0
    coords, feats = A.from_dense(g, origin=(10, 0, 0))
    assert coords.tolist() == [[0, 11, 0, 0], [1, 10, 1, 0]] and feats.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_feature_oracle_hand_values():
    x = np.array([[-1.0, 0.0, 2.0]])
    assert FO.relu(x).tolist() == [[0.0, 0.0, 2.0]]
    assert FO.leaky_relu(x, 0.1).tolist() == [[-0.1, 0.0, 2.0]]
    assert FO.sigmoid([[0.0]]).tolist() == [[0.5]]
    assert FO.silu([[0.0]]).tolist() == [[0.0]]
    assert FO.gelu([[0.0]]).tolist() == [[0.0]]
    assert math.isclose(FO.gelu([[1.0]])[0, 0], 0.8413447460685429, rel_tol=1e-12)
    assert math.isclose(FO.softplus([[0.0]])[0, 0], math.log(2.0), rel_tol=1e-12)
    assert FO.softplus([[30.0]])[0, 0] == 30.0
    np.testing.assert_allclose(FO.layer_norm([[1.0, 3.0]], eps=0.0), [[-1.0, 1.0]])
    np.testing.assert_allclose(FO.rms_norm([[3.0, 4.0]], eps=0.0), [[3 / math.sqrt(12.5), 4 / math.sqrt(12.5)]])
    np.testing.assert_allclose(FO.batch_norm([[1.0], [3.0]], eps=0.0), [[-1.0], [1.0]])
    np.testing.assert_allclose(FO.linear([[1.0, 2.0]], [[1.0, 1.0], [0.0, 2.0]], [0.5, 0.0]), [[3.5, 4.0]])
