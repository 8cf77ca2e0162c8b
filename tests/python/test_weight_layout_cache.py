"""Weight layouts cached per parameter version (issue 12, "maps built once").

A dense ``(C_out, Kx, Ky, Kz, C_in)`` weight is permuted to the kernel-major ``(K, C_in, C_out)``
layout the core reads (and cast under autocast) by ``lattice.ops.conv.kernel_major_weight``. For a
weight that needs no gradient the result is cached on the weight, keyed by its storage, version
counter and dtypes. What these tests prove:

* the cache is hit when nothing changed, and missed after every kind of change a user makes
  (in-place update, ``load_state_dict``, ``.to(dtype)``, a new autocast dtype, ``requires_grad``
  under grad mode), so a conv never reads a stale layout: each result is compared with the
  float64 oracle of the *current* weight;
* gradients still reach a 5-D weight that needs them (the permute is differentiable), equal to
  the oracle's weight gradient;
* the switch and the explicit clear work.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
import oracle
import oracle.conv as ocv
from conftest import random_coords
from lattice import ops
from lattice.ops import conv as conv_mod
from lattice.tensor import SparseTensor


def _x(seed: int = 3) -> SparseTensor:
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, 200, batches=2, extent=5, spread=6))
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], 3)).astype(np.float32))
    return SparseTensor(coords, feats)


def _rel(x: SparseTensor):
    return oracle.subm_relation(x.coords.numpy(), 3, 1)


def _oracle(x: SparseTensor, w: torch.Tensor) -> np.ndarray:
    r = _rel(x)
    w_km = ocv.weight_to_kcc(w.detach().double().numpy())
    return ocv.conv_forward(x.feats.double().numpy(), w_km, r.in_idx, r.out_idx, r.k_idx, len(x))


def _check(y: SparseTensor, x: SparseTensor, w: torch.Tensor) -> None:
    np.testing.assert_allclose(y.feats.detach().double().numpy(), _oracle(x, w), rtol=1e-5, atol=1e-5)


def test_hit_when_nothing_changed_and_miss_after_in_place_update() -> None:
    x = _x()
    conv = lattice.nn.SubmConv3d(3, 4, 3).eval()
    with torch.no_grad():
        a = conv_mod.kernel_major_weight(conv.weight, None, 3)
        assert conv_mod.kernel_major_weight(conv.weight, None, 3) is a  # hit
        _check(conv(x), x, conv.weight)
        conv.weight.mul_(-2.0)  # bumps the version counter
        b = conv_mod.kernel_major_weight(conv.weight, None, 3)
        assert b is not a
        _check(conv(x), x, conv.weight)


def test_load_state_dict_and_dtype_change_invalidate() -> None:
    x = _x()
    conv = lattice.nn.SubmConv3d(3, 4, 3).eval()
    with torch.no_grad():
        conv(x)
        new = {k: torch.randn_like(v) for k, v in conv.state_dict().items()}
        conv.load_state_dict(new)
        _check(conv(x), x, conv.weight)
        conv.double()
        y = conv(SparseTensor(x.coords, x.feats.double()))
        assert y.feats.dtype == torch.float64
        _check(y, x, conv.weight)


def test_autocast_dtype_is_part_of_the_key() -> None:
    x = _x()
    conv = lattice.nn.SubmConv3d(3, 4, 3).eval()
    with torch.no_grad():
        f32 = conv_mod.kernel_major_weight(conv.weight, None, 3)
        bf16 = conv_mod.kernel_major_weight(conv.weight, torch.bfloat16, 3)
        assert f32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
        assert conv_mod.kernel_major_weight(conv.weight, None, 3).dtype == torch.float32
        with torch.autocast("cpu", torch.bfloat16):
            y = conv(x)
        assert y.feats.dtype == torch.bfloat16
        np.testing.assert_allclose(y.feats.double().numpy(), _oracle(x, conv.weight), rtol=3e-2, atol=3e-2)


def test_weights_that_need_gradients_are_not_cached_and_get_them() -> None:
    x = _x()
    conv = lattice.nn.SubmConv3d(3, 4, 3)
    a = conv_mod.kernel_major_weight(conv.weight, None, 3)
    b = conv_mod.kernel_major_weight(conv.weight, None, 3)
    assert a is not b and a.requires_grad
    y = conv(x)
    g = torch.randn_like(y.feats)
    (y.feats * g).sum().backward()
    r = _rel(x)
    w_km = ocv.weight_to_kcc(conv.weight.detach().double().numpy())
    _, want, _ = ocv.conv_backward(x.feats.double().numpy(), w_km, g.double().numpy(), r.in_idx, r.out_idx, r.k_idx)
    got = ocv.weight_to_kcc(conv.weight.grad.double().numpy())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    _check(y, x, conv.weight)


def test_the_layout_is_contiguous_so_no_further_copy_happens() -> None:
    """The core reads contiguous (K, C_in, C_out) rows; a strided view would be copied again on
    every call (by torch for CUDA data, by the core for CPU data)."""
    conv = lattice.nn.SubmConv3d(3, 4, 3).eval()
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for amp in (None, torch.bfloat16):
                km = conv_mod.kernel_major_weight(conv.weight, amp, 3)
                assert km.is_contiguous() and km.shape == (27, 3, 4)
                want = conv.weight.detach().permute(1, 2, 3, 4, 0).reshape(27, 3, 4)
                assert torch.equal(km.detach(), want.to(km.dtype))


def test_switch_and_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    conv = lattice.nn.SubmConv3d(3, 4, 3).eval()
    with torch.no_grad():
        a = conv_mod.kernel_major_weight(conv.weight, None, 3)
        conv_mod.clear_weight_cache(conv.weight)
        assert conv_mod.kernel_major_weight(conv.weight, None, 3) is not a
        monkeypatch.setattr(conv_mod, "CACHE_WEIGHT_LAYOUTS", False)
        b = conv_mod.kernel_major_weight(conv.weight, None, 3)
        assert conv_mod.kernel_major_weight(conv.weight, None, 3) is not b


def test_conv_results_equal_with_and_without_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bitwise: the cached layout is the same bytes as the per-call one."""
    x = _x()
    conv = lattice.nn.SubmConv3d(3, 4, 3).eval()
    with torch.no_grad():
        cached = conv(x).feats
        monkeypatch.setattr(conv_mod, "CACHE_WEIGHT_LAYOUTS", False)
        fresh = conv(x).feats
    assert torch.equal(cached, fresh)
