"""Self-checks of the float64 batch norm oracle: a hand-computed case, the running-statistic
update, the ReLU mask, and the backward against central finite differences of the oracle's own
forward (training and eval, with and without ReLU)."""

from __future__ import annotations

import numpy as np
import pytest

from .batch_norm import batch_norm_backward, batch_norm_forward


def test_hand_computed_two_rows_one_channel():
    # x = [1, 3]: mean 2, biased var 1, unbiased var 2; eps 0 -> xhat = [-1, 1]
    y, rm, rv, mean, invstd = batch_norm_forward([[1.0], [3.0]], [2.0], [0.5], [0.0], [1.0], True, 0.25, 0.0)
    np.testing.assert_allclose(y[:, 0], [-1.5, 2.5])
    np.testing.assert_allclose(mean, [2.0])
    np.testing.assert_allclose(invstd, [1.0])
    np.testing.assert_allclose(rm, [0.75 * 0.0 + 0.25 * 2.0])
    np.testing.assert_allclose(rv, [0.75 * 1.0 + 0.25 * 2.0])


def test_eval_uses_running_statistics_and_relu_clips():
    y, rm, rv, _, _ = batch_norm_forward([[0.0, 5.0]], None, None, [1.0, 1.0], [4.0, 0.25], False, 0.1, 0.0, relu=True)
    np.testing.assert_allclose(y, [[0.0, 8.0]])  # (0 - 1) / 2 = -0.5 -> relu 0; (5 - 1) / 0.5 = 8
    np.testing.assert_allclose(rm, [1.0, 1.0])
    np.testing.assert_allclose(rv, [4.0, 0.25])


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_backward_equals_finite_differences(training, relu):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 3)) * 2 + 1
    w = rng.normal(size=3)
    b = rng.normal(size=3) * 0.3
    rm, rv = rng.normal(size=3), rng.uniform(0.5, 2.0, size=3)
    dy = rng.normal(size=(7, 3))

    def loss(xx, ww, bb):
        return float((batch_norm_forward(xx, ww, bb, rm, rv, training, 0.1, 1e-5, relu)[0] * dy).sum())

    dx, dw, db = batch_norm_backward(x, dy, w, b, rm, rv, training, 1e-5, relu)
    h = 1e-6
    for arr, grad, name in ((x, dx, "x"), (w, dw, "w"), (b, db, "b")):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += h
            minus[idx] -= h
            args = {"x": (x, w, b), "w": (x, w, b), "b": (x, w, b)}[name]
            pa = [plus if a is arr else a for a in args]
            ma = [minus if a is arr else a for a in args]
            num[idx] = (loss(*pa) - loss(*ma)) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-6, err_msg=name)
