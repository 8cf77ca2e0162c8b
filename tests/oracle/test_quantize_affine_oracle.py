"""Self-checks of the packed affine quantization oracle (hand-computed cases)."""

from __future__ import annotations

import numpy as np
import pytest

from .quantize_affine import _self_test, affine_dequantize_rows, affine_quantize_rows, pack_codes, unpack_words


def test_quantize_affine_oracle_hand_cases_hold() -> None:
    _self_test()


def test_quantize_affine_oracle_min_edge_positive_scale() -> None:
    # |w_min| > |w_max|: edge = w_min = -1.5, s0 = 2/15, q0 = rint(-11.25) = -11 -> scale = 1.5/11
    w = np.linspace(-1.5, 0.5, 32).reshape(1, 32)
    codes, s, b = affine_quantize_rows(w, 4, 32)
    assert s[0, 0] == pytest.approx(1.5 / 11) and b[0, 0] == -1.5
    assert codes[0, 0] == 0 and codes.max() == 15


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_affine_oracle_round_trip_within_one_step(bits, group) -> None:
    rng = np.random.default_rng(bits * 1000 + group)
    w = rng.standard_normal((5, 256))
    codes, s, b = affine_quantize_rows(w, bits, group)
    assert (unpack_words(pack_codes(codes, bits), bits) == codes).all()
    err = np.abs(w - affine_dequantize_rows(codes, s, b, group))
    step = np.repeat(np.abs(s), group, axis=1)
    assert (err <= step * (1 + 1e-9)).all()
