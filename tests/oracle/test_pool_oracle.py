"""Self-checks of the float64 pooling oracle on hand-computed cases.

Every expectation is computed by hand (or by finite differences of the oracle's own forward, for
the gradients), never by calling the function under test twice.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .pool import (
    global_pool,
    global_pool_backward,
    local_pool,
    pool_backward,
    pool_forward,
    pool_transpose,
    trilinear_edges,
)

LINE = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]])
CUBE = np.array([[0, x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)])


@pytest.mark.parametrize(
    "mode, expected, winners",
    [("sum", [[3.0], [3.0]], None), ("avg", [[1.5], [3.0]], None), ("max", [[2.0], [3.0]], [[1], [2]])],
)
def test_three_points_on_a_line_pool_by_two(mode, expected, winners):
    out, y, win, _ = local_pool(LINE, [[1.0], [2.0], [3.0]], 2, 2, mode=mode)
    assert out.tolist() == [[0, 0, 0, 0], [0, 1, 0, 0]]
    assert y.tolist() == expected
    if winners is not None:
        assert win.tolist() == winners


def test_cube_pools_into_one_voxel():
    x = np.arange(1.0, 9.0).reshape(8, 1)
    for mode, value in (("sum", 36.0), ("avg", 4.5), ("max", 8.0)):
        out, y, _, _ = local_pool(CUBE, x, 2, 2, mode=mode)
        assert out.tolist() == [[0, 0, 0, 0]]
        assert y.tolist() == [[value]]


def test_avg_divides_by_present_rows_not_kernel_volume():
    _, y, _, _ = local_pool(CUBE[:3], [[3.0], [6.0], [9.0]], 2, 2, mode="avg")
    assert y.tolist() == [[6.0]]


def test_max_ties_go_to_smallest_input_row_not_first_kernel_row():
    # Row 0 sits at kernel row 7 (1, 1, 1), row 1 at kernel row 0 (0, 0, 0): all values equal.
    coords = np.array([[0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
    _, y, win, _ = local_pool(coords, np.full((3, 2), 5.0), 2, 2, mode="max")
    assert y.tolist() == [[5.0, 5.0]]
    assert win.tolist() == [[0, 0]]
    dx = pool_backward([[1.0, 2.0]], [0, 1, 2], [0, 0, 0], 3, "max", win)
    assert dx.tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]


def test_max_nan_wins_and_smallest_nan_row_among_nans():
    y, win = pool_forward([[1.0], [math.nan], [math.nan], [7.0]], [3, 2, 1, 0], [0, 0, 0, 0], 1, "max")
    assert math.isnan(y[0, 0]) and win.tolist() == [[1]]


def test_row_without_edges_is_zero_and_has_no_winner():
    y, win = pool_forward([[4.0]], [0], [1], 2, "max")
    assert y.tolist() == [[0.0], [4.0]] and win.tolist() == [[-1], [0]]
    y, _ = pool_forward([[4.0]], [0], [1], 2, "avg")
    assert y.tolist() == [[0.0], [4.0]]


@pytest.mark.parametrize("mode", ["sum", "avg", "max", "weighted"])
def test_pool_backward_matches_finite_differences(mode):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 3))
    in_idx = [0, 1, 2, 2, 3, 4, 5, 0]
    out_idx = [0, 0, 0, 1, 1, 2, 2, 2]
    w = rng.random(8) if mode == "weighted" else None
    dy = rng.standard_normal((3, 3))
    _, win = pool_forward(x, in_idx, out_idx, 3, mode, w)
    dx = pool_backward(dy, in_idx, out_idx, 6, mode, win, w)
    h = 1e-6
    num = np.zeros_like(x)
    for i in range(6):
        for c in range(3):
            xp, xm = x.copy(), x.copy()
            xp[i, c] += h
            xm[i, c] -= h
            num[i, c] = ((pool_forward(xp, in_idx, out_idx, 3, mode, w)[0] -
                          pool_forward(xm, in_idx, out_idx, 3, mode, w)[0]) * dy).sum() / (2 * h)
    np.testing.assert_allclose(dx, num, atol=1e-8)


def test_global_pool_groups_by_batch_with_empty_batch():
    coords = np.array([[2, 0, 0, 0], [0, 1, 1, 1], [2, 5, 5, 5], [0, 2, 2, 2]])
    x = np.array([[1.0], [2.0], [3.0], [4.0]])
    y, _ = global_pool(coords, x, "sum")
    assert y.tolist() == [[6.0], [0.0], [4.0]]
    y, _ = global_pool(coords, x, "avg", batch_counts=[2, 0, 2, 0])
    assert y.tolist() == [[3.0], [0.0], [2.0], [0.0]]
    with pytest.raises(ValueError, match="batch 1 has no rows"):
        global_pool(coords, x, "max")
    with pytest.raises(ValueError, match="batch 1 has no rows"):
        global_pool(coords, x, "max", batch_counts=[2, 0, 2])
    y, win = global_pool([[1, 0, 0, 0], [0, 1, 1, 1], [0, 2, 2, 2]], [[5.0], [2.0], [2.0]], "max")
    assert y.tolist() == [[2.0], [5.0]] and win.tolist() == [[1], [0]]
    dx = global_pool_backward(coords, [[1.0], [10.0], [100.0]], "avg")
    assert dx.tolist() == [[50.0], [0.5], [50.0], [0.5]]


def test_pool_transpose_k2_s2_copies_each_parent_into_its_block():
    out, y, _ = pool_transpose([[0, 1, 0, 0]], [[7.0]], 2, 2)
    assert out.tolist() == [[0, 2 + a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    assert y.tolist() == [[7.0]] * 8


def test_pool_transpose_overlapping_children_average_their_parents():
    # 1-D along x: parents 0 and 1 (values 2 and 4), kernel (3, 1, 1), stride (2, 1, 1):
    # parent 0 -> 0, 1, 2; parent 1 -> 2, 3, 4; child 2 averages both.
    out, y, _ = pool_transpose([[0, 0, 0, 0], [0, 1, 0, 0]], [[2.0], [4.0]], (3, 1, 1), (2, 1, 1))
    assert out[:, 1].tolist() == [0, 1, 2, 3, 4]
    assert y[:, 0].tolist() == [2.0, 2.0, 3.0, 4.0, 4.0]


def test_trilinear_edges_stride_two_line_by_hand():
    # Coarse stride 2 at x = 0, 1, 2 (centres 1, 3, 5); fine stride 1 (centres f + 0.5).
    fine = [[0, f, 0, 0] for f in range(6)]
    _, ins, outs, ws = trilinear_edges(LINE, 2, fine, 1)
    y, _ = pool_forward([[1.0], [2.0], [3.0]], ins, outs, 6, "weighted", ws)
    # f=0: centre 0.5 -> u=-0.25: corner -1 absent, only coarse 0; f=1: u=0.25 -> 0.75*1 + 0.25*2;
    # f=2: u=0.75 -> 0.25*1 + 0.75*2; ...; f=5: u=2.25 -> only coarse 2.
    assert y[:, 0].tolist() == [1.0, 1.25, 1.75, 2.25, 2.75, 3.0]


def test_trilinear_edges_odd_ratio_hits_coarse_centre_exactly():
    _, ins, outs, ws = trilinear_edges([[0, 0, 0, 0], [0, 1, 0, 0]], 3, [[0, 1, 1, 1], [0, 2, 1, 1]], 1)
    # fine x=1 is the centre of coarse 0 (weight 1); fine x=2: u = 1/3 -> 2/3 coarse 0, 1/3 coarse 1.
    assert ins.tolist() == [0, 0, 1] and outs.tolist() == [0, 1, 1]
    np.testing.assert_allclose(ws, [1.0, 2 / 3, 1 / 3], rtol=0, atol=1e-15)


def test_trilinear_edges_generated_support_is_children_and_ratio_one_copies():
    fine, ins, outs, ws = trilinear_edges([[0, 0, 0, 0]], 2, stride=2)
    assert fine.tolist() == CUBE.tolist()
    assert ins.tolist() == [0] * 8 and ws.tolist() == [1.0] * 8
    fine, ins, outs, ws = trilinear_edges(LINE, 1, LINE[::-1], 1)
    assert ins.tolist() == [2, 1, 0] and outs.tolist() == [0, 1, 2] and ws.tolist() == [1.0] * 3
