"""A training conv's weight prepared by the core: one permuting cast, the gradient in the caller's form.

Under ``torch.autocast`` a CUDA training conv hands its float32 master weight to the core as it is
(``lattice.ops.conv._core_prepares``): ``core.conv_compute_weight`` makes the kernel-major copy in
the feature dtype in one pass, ``ConvFunction`` saves it for the backward, and
``core.conv_backward(..., weight_grad_layout, weight_grad_dtype)`` returns the weight gradient in the
parameter's own layout and dtype. What these tests prove, on the CPU (CI) and on a GPU when present:

* ``conv_compute_weight`` equals torch's permute + ``.to(dtype)`` bit for bit, for dense and
  kernel-major weights, float32 -> float16 / bfloat16, float16 -> float32 and same-dtype; it refuses
  integer weights and float64 <-> 16-bit conversions with a TypeError in lattice's format;
* the converted weight gradient equals converting the plain gradient afterwards, bit for bit, and
  naming only one of layout / dtype is a ValueError;
* through autograd, ``ConvFunction(prepare=True)`` with a float32 dense weight and float16 features
  gives the same output and input, weight and bias gradients, bitwise, as casting and permuting
  with torch first (the path ``CORE_PERMUTES_TRAINING_WEIGHTS = False`` takes), and the weight
  gradient arrives in float32 and the dense layout; nothing the caller passed is modified.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_coords
from lattice import ops
from lattice._core import core, from_core, to_core
from lattice.autograd import ConvFunction
from lattice.tensor import SparseTensor

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _setup(device: str, feat_dtype: torch.dtype, ks=(3, 1, 3), c_in: int = 12, c_out: int = 20, seed: int = 5):
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, 400, batches=2, extent=6, spread=8)).to(device)
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(coords.shape[0], c_in, generator=g).to(feat_dtype).to(device)
    x = SparseTensor(coords, feats)
    dense = (torch.randn(c_out, *ks, c_in, generator=g) * 0.2).to(device)
    p = ops.conv.plan("subm_conv3d", "submanifold", x, dense)
    return x, dense, p


def _km(dense: torch.Tensor) -> torch.Tensor:
    kv = dense.shape[1] * dense.shape[2] * dense.shape[3]
    return dense.permute(1, 2, 3, 4, 0).reshape(kv, dense.shape[4], dense.shape[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src, dst", [(torch.float32, torch.float16), (torch.float32, torch.bfloat16),
                                      (torch.float16, torch.float32), (torch.float32, torch.float32),
                                      (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("layout", ["dense", "kernel_major"])
def test_compute_weight_equals_torch_permute_and_cast(device, src, dst, layout) -> None:
    x, dense, p = _setup(device, dst)
    w = dense.to(src) if layout == "dense" else _km(dense).contiguous().to(src)
    before = w.clone()
    got = from_core(core.conv_compute_weight(p, to_core(x.feats), to_core(w)))
    want = _km(dense.to(src)).to(dst).contiguous()
    assert got.dtype == dst and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want)
    assert torch.equal(w, before)  # the caller's weight is untouched


@pytest.mark.parametrize("device", DEVICES)
def test_compute_weight_rejects_what_it_cannot_convert(device) -> None:
    x, dense, p = _setup(device, torch.float16)
    with pytest.raises(TypeError, match=r"\[subm_conv3d\] weight: expected a float dtype, got int32"):
        core.conv_compute_weight(p, to_core(x.feats), to_core(dense.to(torch.int32)))
    with pytest.raises(TypeError, match=r"\[subm_conv3d\] weight: expected float16, bfloat16 or float32 for float16 "
                                        r"features, got float64"):
        core.conv_compute_weight(p, to_core(x.feats), to_core(dense.double()))
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected \(C_out, 3, 1, 3, C_in=12\)"):
        core.conv_compute_weight(p, to_core(x.feats), to_core(dense[..., :5].contiguous()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["dense", "kernel_major"])
def test_weight_grad_in_the_callers_form(device, layout) -> None:
    x, dense, p = _setup(device, torch.float16)
    w16 = _km(dense.half()).contiguous()
    g = torch.Generator().manual_seed(9)
    dy = torch.randn(x.feats.shape[0], 20, generator=g).half().to(device)
    _, dw_plain, _ = core.conv_backward(p, to_core(x.feats), to_core(w16), to_core(dy), False, True, False)
    dw_plain = from_core(dw_plain)
    _, dw, _ = core.conv_backward(p, to_core(x.feats), to_core(w16), to_core(dy), False, True, False,
                                  layout, "float32")
    dw = from_core(dw)
    want = dw_plain.float()
    if layout == "dense":
        want = want.reshape(3, 1, 3, 12, 20).permute(4, 0, 1, 2, 3).contiguous()
    assert dw.dtype == torch.float32 and dw.shape == want.shape
    assert torch.equal(dw, want)
    with pytest.raises(ValueError, match=r"weight_grad_layout: expected weight_grad_layout and weight_grad_dtype"):
        core.conv_backward(p, to_core(x.feats), to_core(w16), to_core(dy), False, True, False, layout, None)
    with pytest.raises(TypeError, match=r"\[subm_conv3d\] weight_grad_dtype: expected a float dtype \(float64 only "
                                        r"for float32 or float64 features\), got int32 for float16 features"):
        core.conv_backward(p, to_core(x.feats), to_core(w16), to_core(dy), False, True, False, layout, "int32")
    with pytest.raises(TypeError, match=r"\[subm_conv3d\] weight_grad_dtype: expected a float dtype \(float64 only "
                                        r"for float32 or float64 features\), got float64 for float16 features"):
        core.conv_backward(p, to_core(x.feats), to_core(w16), to_core(dy), False, True, False, layout, "float64")
    with pytest.raises(ValueError, match=r"weight_grad_layout: expected 'dense' or 'kernel_major', got 'nhwc'"):
        core.conv_backward(p, to_core(x.feats), to_core(w16), to_core(dy), False, True, False, "nhwc", "float32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feat_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_prepared_function_equals_torch_cast_and_permute_bitwise(device, feat_dtype) -> None:
    x, dense, p = _setup(device, feat_dtype)
    g = torch.Generator().manual_seed(11)
    bias = torch.randn(20, generator=g).to(device)
    dy = torch.randn(x.feats.shape[0], 20, generator=g).to(feat_dtype).to(device)
    results = []
    for prepare in (True, False):
        fx = x.feats.detach().clone().requires_grad_(True)
        w = dense.detach().clone().requires_grad_(True)
        b = bias.detach().clone().requires_grad_(True)
        b_cast = b.to(feat_dtype)  # the bias stays torch's cast (as under autocast)
        if prepare:
            y = ConvFunction.apply(fx, w, b_cast, p, True)
        else:
            y = ConvFunction.apply(fx, _km(w.to(feat_dtype)).contiguous(), b_cast, p)
        grads = torch.autograd.grad(y, (fx, w, b), dy)
        results.append([y.detach(), *grads])
    for name, u, v in zip(("output", "input grad", "weight grad", "bias grad"), *results):
        assert u.dtype == v.dtype and u.shape == v.shape, name
        assert torch.equal(u, v), f"{name} differs"
    assert results[0][2].dtype == torch.float32 and results[0][2].shape == dense.shape
