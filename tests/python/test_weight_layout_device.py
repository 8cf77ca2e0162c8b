"""Dense CUDA weights are permuted on the device by the core (no host round trip, no torch ops).

A training conv on the GPU passes its dense ``(C_out, Kx, Ky, Kz, C_in)`` weight to the core as
it is (``lattice.ops.conv.CORE_PERMUTES_TRAINING_WEIGHTS``): the core gathers the kernel-major
layout on the device (``Array::strided_view`` + the CUDA allocator's strided copy) and returns the
weight gradient in the dense layout. Before, torch permuted it (a copy and two autograd nodes per
call), and the C++ API (``core.conv_forward`` with a dense device weight) copied it to the host and
back. What these tests prove, on a GPU:

* the outputs and the input, weight and bias gradients are bitwise equal to the torch-permute path
  (the same kernels read the same kernel-major bytes), with and without autocast, for a
  submanifold, a strided and a transposed conv with non-cubic kernels;
* the C++ API with a dense device weight makes no host synchronisation (forward and backward) and
  equals the kernel-major call bitwise; the weight gradient comes back dense.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from conftest import random_coords
from lattice import ops
from lattice._core import core, from_core, to_core
from lattice.tensor import SparseTensor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")

CASES = [
    ("subm_conv3d", (3, 1, 5), {}),
    ("conv3d", (2, 3, 2), {"stride": 2}),
    ("conv_transpose3d", (2, 2, 1), {"stride": 2}),
]


def _inputs(op: str, dtype: torch.dtype, seed: int = 4):
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, 1500, batches=2, extent=9, spread=12)).cuda()
    g = torch.Generator().manual_seed(seed)
    c_in, c_out = 24, 40
    feats = torch.randn(coords.shape[0], c_in, generator=g).to(dtype).cuda()
    return coords, feats, c_in, c_out, g


def _run(op, ks, kw, core_permutes: bool, amp: bool, monkeypatch):
    monkeypatch.setattr(ops.conv, "CORE_PERMUTES_TRAINING_WEIGHTS", core_permutes)
    dtype = torch.float32 if amp else torch.float16
    coords, feats, c_in, c_out, g = _inputs(op, dtype)
    w = (torch.randn(c_out, *ks, c_in, generator=g) * 0.1).to(dtype).cuda().requires_grad_(True)
    b = torch.randn(c_out, generator=g).to(dtype).cuda().requires_grad_(True)
    x = SparseTensor(coords, feats)
    if op == "conv_transpose3d":  # onto a coarse input (stride 2) made by a strided conv
        with torch.no_grad():
            x = ops.conv3d(x, torch.ones(c_in, 2, 2, 2, c_in, dtype=dtype, device="cuda"), kernel_size=2, stride=2)
    fx = x.feats.detach().clone().requires_grad_(True)
    x = x.replace_feats(fx)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        y = getattr(ops, op)(x, w, b, kernel_size=ks, **kw)
    gy = torch.randn(y.feats.shape, generator=g).to(y.feats.dtype).cuda()
    grads = torch.autograd.grad(y.feats, (fx, w, b), gy)
    return [y.feats.detach(), *grads]


@pytest.mark.parametrize("amp", [False, True], ids=["half", "autocast"])
@pytest.mark.parametrize("op, ks, kw", CASES, ids=[c[0] for c in CASES])
def test_core_permute_equals_torch_permute_bitwise(op, ks, kw, amp, monkeypatch) -> None:
    a = _run(op, ks, kw, True, amp, monkeypatch)
    b = _run(op, ks, kw, False, amp, monkeypatch)
    for name, u, v in zip(("output", "input grad", "weight grad", "bias grad"), a, b):
        assert u.shape == v.shape and u.dtype == v.dtype, name
        assert torch.equal(u, v), f"{name} differs"
    assert a[2].shape == (40, *ks, 24)  # the weight gradient in the dense layout


def test_cpp_api_dense_device_weight_needs_no_host_copy() -> None:
    coords, feats, c_in, c_out, g = _inputs("subm_conv3d", torch.float16)
    x = SparseTensor(coords, feats)
    dense = (torch.randn(c_out, 3, 3, 3, c_in, generator=g) * 0.1).half().cuda()
    km = dense.permute(1, 2, 3, 4, 0).reshape(27, c_in, c_out).contiguous()
    p = ops.conv.plan("subm_conv3d", "submanifold", x, dense, kernel_size=3)
    gy = torch.randn(coords.shape[0], c_out, generator=g).half().cuda()
    want_y = from_core(core.conv_forward(p, to_core(feats), to_core(km), None))
    want = core.conv_backward(p, to_core(feats), to_core(km), to_core(gy), True, True, False)
    torch.cuda.synchronize()
    before = lattice.cuda.host_syncs()
    y = from_core(core.conv_forward(p, to_core(feats), to_core(dense), None))
    dx, dw, _ = core.conv_backward(p, to_core(feats), to_core(dense), to_core(gy), True, True, False)
    assert lattice.cuda.host_syncs() == before, "the dense weight went through the host"
    assert torch.equal(y, want_y)
    assert torch.equal(from_core(dx), from_core(want[0]))
    dw_dense = from_core(dw)
    assert dw_dense.shape == dense.shape
    assert torch.equal(dw_dense.permute(1, 2, 3, 4, 0).reshape(27, c_in, c_out), from_core(want[1]))
