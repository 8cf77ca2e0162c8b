"""torch.autograd.gradcheck in float64 for feats, weight and bias of every conv kind.

Small problems (a few dozen rows, C_in=2, C_out=2) so the finite differences stay quick; the
relation is built once (replace_feats keeps the coordinate identity, so it is cached).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from conftest import op_fn, output_stride_for, random_coords, tensor_stride_for

CASES = [
    ("conv3d_k3_s2_p1", "conv3d", dict(kernel_size=3, stride=2, padding=1), False, "dense"),
    ("conv3d_k2_s2_expand", "conv3d", dict(kernel_size=2, stride=2, expand=True), False, "kernel_major"),
    ("conv3d_target_k3_s1", "conv3d", dict(kernel_size=3), True, "dense"),
    ("subm_k3", "subm_conv3d", dict(kernel_size=3), False, "dense"),
    ("subm_k131_dil2", "subm_conv3d", dict(kernel_size=(1, 3, 1), dilation=2), False, "kernel_major"),
    ("transpose_k2_s2", "conv_transpose3d", dict(kernel_size=2, stride=2), False, "dense"),
    ("transpose_target_k3_s2_p1", "conv_transpose3d", dict(kernel_size=3, stride=2, padding=1), True, "kernel_major"),
    ("generative_k232_s212", "generative_conv_transpose3d", dict(kernel_size=(2, 3, 2), stride=(2, 1, 2)), False, "dense"),
]


@pytest.mark.parametrize("route", [None, "reference"], ids=["default_route", "reference_route"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_gradcheck_f64_feats_weight_bias_pass(rng, torch_gen, case, route):
    _, op, kw, onto_target, layout = case
    coords = random_coords(rng, 24, batches=2, extent=4, spread=4)
    stride_in = tensor_stride_for(op, kw.get("stride", 1))
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.zeros(coords.shape[0], 2, dtype=torch.float64),
                             stride=stride_in)
    call_kw = dict(kw)
    if onto_target:
        gen = op_fn(op)(x, torch.zeros(1, *_ks(kw), 2, dtype=torch.float64), **kw)
        t = gen.coords.numpy()[::2].copy()
        extra = np.array([[1, 99, 99, 99]], dtype=np.int32)
        call_kw["coordinates"] = lattice.SparseTensor(torch.from_numpy(np.concatenate([t, extra])),
                                                      torch.zeros(t.shape[0] + 1, 1, dtype=torch.float64),
                                                      stride=output_stride_for(op, kw.get("stride", 1)))
    k = int(np.prod(_ks(kw)))
    feats = torch.randn(coords.shape[0], 2, dtype=torch.float64, generator=torch_gen, requires_grad=True)
    if layout == "dense":
        w = torch.randn(2, *_ks(kw), 2, dtype=torch.float64, generator=torch_gen, requires_grad=True)
    else:
        w = torch.randn(k, 2, 2, dtype=torch.float64, generator=torch_gen, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, generator=torch_gen, requires_grad=True)
    conv = op_fn(op)

    def f(fe, we, be):
        return conv(x.replace_feats(fe), we, be, route=route, **call_kw).feats

    # sanity: the problem is not degenerate (some output depends on some input)
    out = f(feats, w, b)
    assert out.shape[0] > 0
    (g,) = torch.autograd.grad(out.sum(), [feats])
    assert torch.count_nonzero(g) > 0
    assert torch.autograd.gradcheck(f, (feats, w, b), eps=1e-6, atol=1e-8, rtol=1e-6)


def _ks(kw):
    k = kw["kernel_size"]
    return (k, k, k) if isinstance(k, int) else tuple(k)
