"""Every conv op, forward and backward (feats, weight, bias), vs the float64 numpy oracle.

The oracle builds its own relation from the coordinates (never lattice's), inputs are rounded to
the storage dtype first (oracle.round_to_dtype) and the comparison uses the SEMANTICS.md
tolerance of the storage dtype (f64 1e-12, f32 1e-5, f16 2e-3, bf16 1e-2).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import lattice
import oracle
from conftest import op_fn, oracle_relation_for, output_stride_for, random_coords, tensor_stride_for

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# (id, op, conv kwargs, onto a target)
CASES = [
    ("conv3d_k3_s2_p1", "conv3d", dict(kernel_size=3, stride=2, padding=1), False),
    ("conv3d_k232_s213_expand", "conv3d", dict(kernel_size=(2, 3, 2), stride=(2, 1, 3), expand=True), False),
    ("conv3d_target_k2_s2", "conv3d", dict(kernel_size=2, stride=2), True),
    ("subm_k3", "subm_conv3d", dict(kernel_size=3), False),
    ("subm_k315_dil2", "subm_conv3d", dict(kernel_size=(3, 1, 5), dilation=2), False),
    ("transpose_k2_s2", "conv_transpose3d", dict(kernel_size=2, stride=2), False),
    ("transpose_target_k3_s2_p1", "conv_transpose3d", dict(kernel_size=3, stride=2, padding=1), True),
    ("generative_k3_s2", "generative_conv_transpose3d", dict(kernel_size=3, stride=2), False),
]
CASE_IDS = [c[0] for c in CASES]

C_IN, C_OUT = 3, 4


def rounded(rng: np.random.Generator, shape: tuple, name: str, scale: float = 1.0) -> tuple[torch.Tensor, np.ndarray]:
    """A random tensor of storage dtype ``name`` and its exact float64 value (oracle-rounded)."""
    raw = rng.standard_normal(shape) * scale
    ref = oracle.round_to_dtype(raw, name)
    t = torch.from_numpy(ref).to(DTYPES[name])
    assert np.array_equal(t.double().numpy(), ref), "torch and the oracle round differently"
    return t, ref


def sparse(coords: np.ndarray, feats: torch.Tensor, stride: Any = 1) -> lattice.SparseTensor:
    return lattice.SparseTensor(torch.from_numpy(coords.copy()), feats, stride=stride)


def run_case(rng: np.random.Generator, case: tuple, name: str, layout: str, n: int = 36) -> None:
    _, op, kw, onto_target = case
    ks = oracle.as_triple(kw["kernel_size"])
    K = ks[0] * ks[1] * ks[2]
    coords = random_coords(rng, n)
    feats, feats_ref = rounded(rng, (coords.shape[0], C_IN), name)
    x = sparse(coords, feats.requires_grad_(), tensor_stride_for(op, kw.get("stride", 1)))

    target_np = None
    call_kw = dict(kw)
    if onto_target:
        gen = oracle_relation_for(op, coords, **kw).out_coords.astype(np.int32)
        target_np = np.concatenate([gen[::2], random_coords(rng, 6, batches=1, spread=40) + [[7, 0, 0, 0]]])
        target_np = target_np.astype(np.int32)
        call_kw["coordinates"] = sparse(target_np, torch.zeros(target_np.shape[0], 1, dtype=DTYPES[name]),
                                        output_stride_for(op, kw.get("stride", 1)))
    ref_rel = oracle_relation_for(op, coords, target=target_np, **kw)
    assert ref_rel.n_edges > 0

    wk, wk_ref = rounded(rng, (K, C_IN, C_OUT), name, scale=0.5)
    if layout == "dense":
        w = torch.from_numpy(oracle.weight_from_kcc(wk.double().numpy(), ks)).to(DTYPES[name])
    else:
        w = wk.clone()
    w.requires_grad_()
    b, b_ref = rounded(rng, (C_OUT,), name)
    b.requires_grad_()

    y = op_fn(op)(x, w, b, **call_kw)
    assert y.dtype == DTYPES[name]
    assert y.stride == output_stride_for(op, kw.get("stride", 1))
    np.testing.assert_array_equal(y.coords.numpy(), ref_rel.out_coords.astype(np.int32))
    ref_y = oracle.conv_forward(feats_ref, wk_ref, ref_rel.in_idx, ref_rel.out_idx, ref_rel.k_idx, ref_rel.n_out, b_ref)
    oracle.assert_close(y.feats, ref_y, name, f"{op} forward")

    dy, dy_ref = rounded(rng, tuple(y.feats.shape), name)
    dx, dw, db = torch.autograd.grad(y.feats, [feats, w, b], dy)
    ref_dx, ref_dwk, ref_db = oracle.conv_backward(feats_ref, wk_ref, dy_ref, ref_rel.in_idx, ref_rel.out_idx, ref_rel.k_idx)
    assert dx.dtype == dw.dtype == db.dtype == DTYPES[name]
    assert tuple(dw.shape) == tuple(w.shape)
    oracle.assert_close(dx, ref_dx, name, f"{op} feats grad")
    ref_dw = oracle.weight_from_kcc(ref_dwk, ks) if layout == "dense" else ref_dwk
    oracle.assert_close(dw, ref_dw, name, f"{op} weight grad")
    oracle.assert_close(db, ref_db, name, f"{op} bias grad")


@pytest.mark.parametrize("layout", ["dense", "kernel_major"])
@pytest.mark.parametrize("name", ["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_conv_f64_f32_forward_and_grads_equal_oracle(rng, case, name, layout):
    run_case(rng, case, name, layout)


@pytest.mark.parametrize("layout", ["dense", "kernel_major"])
@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_conv_f16_bf16_forward_and_grads_equal_oracle_on_rounded_inputs(rng, case, name, layout):
    run_case(rng, case, name, layout)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_subm_conv3d_half_precision_accumulates_in_f32_over_many_offsets(rng, name):
    # 125 active offsets per row of a full 5x5x5 block: rounding after every offset would exceed
    # the f16/bf16 tolerance, one rounding at the end does not.
    g = np.stack(np.meshgrid(range(5), range(5), range(5), indexing="ij"), -1).reshape(-1, 3)
    coords = np.concatenate([np.zeros((125, 1), np.int64), g], 1).astype(np.int32)
    feats, feats_ref = rounded(rng, (125, 8), name)
    wk, wk_ref = rounded(rng, (125, 8, 2), name, scale=0.3)
    feats.requires_grad_()
    wk.requires_grad_()
    rel = oracle.subm_relation(coords, 5)
    for route in ("reference", "gather_gemm_scatter"):
        y = lattice.ops.subm_conv3d(sparse(coords, feats), wk, kernel_size=5, route=route)
        ref = oracle.conv_forward(feats_ref, wk_ref, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
        oracle.assert_close(y.feats, ref, name, f"{route} subm 5x5x5 block")
        dy, dy_ref = rounded(rng, (125, 2), name)
        dx, dw = torch.autograd.grad(y.feats, [feats, wk], dy)
        ref_dx, ref_dw, _ = oracle.conv_backward(feats_ref, wk_ref, dy_ref, rel.in_idx, rel.out_idx, rel.k_idx)
        oracle.assert_close(dx, ref_dx, name, f"{route} subm 5x5x5 feats grad")
        oracle.assert_close(dw, ref_dw, name, f"{route} subm 5x5x5 weight grad")


def test_conv_hand_computed_impulse_picks_weight_row_of_offset():
    # One input voxel at the origin, subm k3 onto itself and a neighbour at +z: the output at
    # the neighbour is x @ W[k] with k the row of offset (0, 0, -1) = (1*3+1)*3+0 = 12.
    coords = np.array([[0, 0, 0, 0], [0, 0, 0, 1]], dtype=np.int32)
    feats = torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    wk = torch.zeros(27, 2, 1, dtype=torch.float64)
    wk[12, :, 0] = torch.tensor([10.0, 100.0])
    wk[13, :, 0] = torch.tensor([1.0, 1.0])
    y = lattice.ops.subm_conv3d(sparse(coords, feats), wk, kernel_size=3)
    assert y.feats.tolist() == [[3.0], [210.0]]
    # dense layout: W_dense[co, x, y, z, ci] == W_km[(x*3+y)*3+z, ci, co]
    wd = torch.zeros(1, 3, 3, 3, 2, dtype=torch.float64)
    wd[0, 1, 1, 0] = torch.tensor([10.0, 100.0])
    wd[0, 1, 1, 1] = torch.tensor([1.0, 1.0])
    assert lattice.ops.subm_conv3d(sparse(coords, feats), wd).feats.tolist() == [[3.0], [210.0]]


def test_conv_rows_without_edges_get_bias_only():
    coords = np.array([[0, 0, 0, 0]], dtype=np.int32)
    target = np.array([[0, 0, 0, 0], [0, 50, 50, 50]], dtype=np.int32)
    x = sparse(coords, torch.ones(1, 2, dtype=torch.float64))
    t = sparse(target, torch.zeros(2, 1, dtype=torch.float64))
    w = torch.ones(1, 1, 1, 1, 2, dtype=torch.float64)
    y = lattice.ops.conv3d(x, w, torch.tensor([0.5], dtype=torch.float64), coordinates=t)
    assert y.feats.tolist() == [[2.5], [0.5]]


@pytest.mark.parametrize("op, kw", [
    ("conv3d", dict(stride=2)),
    ("subm_conv3d", {}),
    ("conv_transpose3d", dict(stride=1)),
    ("generative_conv_transpose3d", dict(stride=1)),
])
def test_conv_empty_input_gives_empty_output_and_zero_grads(op, kw):
    x_feats = torch.zeros(0, 2, dtype=torch.float64, requires_grad=True)
    x = sparse(np.zeros((0, 4), np.int32), x_feats)
    w = torch.randn(3, 3, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = op_fn(op)(x, w, b, **kw)
    assert tuple(y.feats.shape) == (0, 3) and tuple(y.coords.shape) == (0, 4)
    dx, dw, db = torch.autograd.grad(y.feats.sum() + 0 * (w.sum() + b.sum()), [x_feats, w, b])
    assert tuple(dx.shape) == (0, 2)
    assert torch.count_nonzero(dw) == 0 and torch.count_nonzero(db) == 0


def test_conv_transpose3d_empty_input_onto_target_gives_bias_rows():
    x = sparse(np.zeros((0, 4), np.int32), torch.zeros(0, 2, dtype=torch.float64), stride=2)
    t = sparse(np.array([[0, 1, 2, 3], [1, -4, 0, 0]], np.int32), torch.zeros(2, 1, dtype=torch.float64))
    y = lattice.ops.conv_transpose3d(x, torch.ones(3, 2, 2, 2, 2, dtype=torch.float64),
                                     torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), stride=2, coordinates=t)
    assert y.feats.tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    assert y.key == t.key


def test_conv_non_contiguous_feats_weight_bias_equal_contiguous_copies(rng):
    coords = random_coords(rng, 30)
    n = coords.shape[0]
    feats = torch.from_numpy(rng.standard_normal((n + 3, 8)))[3:, ::2]  # storage offset + column stride
    w_km = torch.from_numpy(rng.standard_normal((4, 27, 4))).permute(1, 2, 0)  # (27, C_in=4, C_out=4) view
    w_dense = torch.from_numpy(rng.standard_normal((4, 3, 3, 3, 4))).transpose(0, 4)  # (C_out, 3, 3, 3, C_in) view
    bias = torch.from_numpy(rng.standard_normal(8))[::2]
    assert not (feats.is_contiguous() or w_km.is_contiguous() or w_dense.is_contiguous() or bias.is_contiguous())
    x = sparse(coords, feats)
    xc = x.replace_feats(feats.contiguous())
    rel = oracle.subm_relation(coords, 3)
    for w, wk in ((w_km, w_km.numpy()), (w_dense, oracle.weight_to_kcc(w_dense.numpy()))):
        y = lattice.ops.subm_conv3d(x, w, bias, kernel_size=3)
        yc = lattice.ops.subm_conv3d(xc, w.contiguous(), bias.contiguous(), kernel_size=3)
        assert torch.equal(y.feats, yc.feats)
        ref = oracle.conv_forward(feats.numpy(), wk, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out, bias.numpy())
        oracle.assert_close(y.feats, ref, "f64", "non-contiguous")
    # non-contiguous grad_out
    fe = feats.clone().requires_grad_()
    y = lattice.ops.subm_conv3d(x.replace_feats(fe), w_km, kernel_size=3)
    dy = torch.from_numpy(rng.standard_normal((8, n))).t()[:, ::2]
    (dx,) = torch.autograd.grad(y.feats, [fe], dy)
    ref_dx, _, _ = oracle.conv_backward(feats.numpy(), w_km.numpy(), dy.numpy(), rel.in_idx, rel.out_idx, rel.k_idx)
    oracle.assert_close(dx, ref_dx, "f64", "non-contiguous grad_out")


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("route", ["pointwise_matmul", "gather_gemm_scatter", "reference"])
def test_conv_half_precision_weight_grad_over_thousands_of_edges_accumulates_in_f32(rng, name, route):
    # dW of a 1x1x1 kernel sums X^T dY over every row: 3000 terms per element. Rounding the running
    # sum to f16/bf16 would be far outside the tolerance; one rounding at the end is not.
    coords = random_coords(rng, 3000, batches=2, extent=20, spread=10)
    n = coords.shape[0]
    feats, feats_ref = rounded(rng, (n, 4), name)
    wk, wk_ref = rounded(rng, (1, 4, 3), name)
    dy, dy_ref = rounded(rng, (n, 3), name)
    feats.requires_grad_()
    wk.requires_grad_()
    b = torch.zeros(3, dtype=DTYPES[name], requires_grad=True)
    y = lattice.ops.subm_conv3d(sparse(coords, feats), wk, b, kernel_size=1, route=route)
    dw, db = torch.autograd.grad(y.feats, [wk, b], dy)
    ref_dw = np.einsum("ni,nj->ij", feats_ref, dy_ref)[None]
    oracle.assert_close(dw, ref_dw, name, f"{route} weight grad")
    oracle.assert_close(db, dy_ref.sum(0), name, f"{route} bias grad")


_ZERO_CHANNEL_SCRIPT = r"""
import torch, lattice
coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [1, -1, 2, 3]], dtype=torch.int32)
for route, ks in (("reference", 3), ("gather_gemm_scatter", 3), ("pointwise_matmul", 1)):
    for dtype in (torch.float32, torch.float16):
        feats = torch.zeros(3, 0, dtype=dtype, requires_grad=True)
        w = torch.zeros(2, ks, ks, ks, 0, dtype=dtype, requires_grad=True)
        b = torch.tensor([1.0, -2.0], dtype=dtype, requires_grad=True)
        y = lattice.ops.subm_conv3d(lattice.SparseTensor(coords, feats), w, b, route=route)
        dx, dw, db = torch.autograd.grad(y.feats, [feats, w, b], torch.ones(3, 2, dtype=dtype))
        assert y.feats.tolist() == [[1.0, -2.0]] * 3, y.feats
        assert tuple(dx.shape) == (3, 0) and tuple(dw.shape) == (2, ks, ks, ks, 0)
        assert db.tolist() == [3.0, 3.0], db
        print(route, dtype, "ok", flush=True)
"""


def test_conv_zero_input_channels_gives_bias_output_and_empty_grads_on_every_route():
    # Run in a child process: a crash (e.g. SIGFPE from a division by C_in) must fail this test,
    # not kill the test session.
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(lattice.__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _ZERO_CHANNEL_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"child exited with {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-2000:]}"
    assert r.stdout.count(" ok") == 6


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("route", ["reference", "gather_gemm_scatter"])
def test_conv_half_precision_output_and_grads_are_the_exact_sum_rounded_once(rng, name, route):
    # Integer inputs make every f32 partial sum exact, so "accumulate in f32, round once at the
    # end" has exactly one right answer: round_to_nearest_even(exact sum). Truncation, or rounding
    # after each offset, gives other values.
    coords = random_coords(rng, 60, batches=2, extent=4, spread=3)
    n = coords.shape[0]
    dt = DTYPES[name]
    feats_ref = rng.integers(-12, 13, size=(n, 4)).astype(np.float64)
    wk_ref = rng.integers(-12, 13, size=(27, 4, 3)).astype(np.float64)
    dy_ref = rng.integers(-12, 13, size=(n, 3)).astype(np.float64)
    feats = torch.from_numpy(feats_ref).to(dt).requires_grad_()
    wk = torch.from_numpy(wk_ref).to(dt).requires_grad_()
    y = lattice.ops.subm_conv3d(sparse(coords, feats), wk, kernel_size=3, route=route)
    dx, dw = torch.autograd.grad(y.feats, [feats, wk], torch.from_numpy(dy_ref).to(dt))
    rel = oracle.subm_relation(coords, 3)
    ref_y = oracle.conv_forward(feats_ref, wk_ref, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
    ref_dx, ref_dw, _ = oracle.conv_backward(feats_ref, wk_ref, dy_ref, rel.in_idx, rel.out_idx, rel.k_idx)
    assert np.abs(ref_y).max() > 256, "sums too small to need rounding"
    for what, got, exact in (("forward", y.feats, ref_y), ("feats grad", dx, ref_dx), ("weight grad", dw, ref_dw)):
        np.testing.assert_array_equal(got.detach().double().numpy(), oracle.round_to_dtype(exact, name), err_msg=what)


def test_conv_numpy_coords_and_feats_are_accepted_and_equal_oracle(rng):
    coords = random_coords(rng, 30).astype(np.int64)
    feats = rng.standard_normal((coords.shape[0], 3))
    x = lattice.SparseTensor(coords, feats)
    assert isinstance(x.coords, torch.Tensor) and x.coords.dtype == torch.int32
    wk = torch.from_numpy(rng.standard_normal((8, 3, 2)))
    y = lattice.ops.conv3d(x, wk, kernel_size=2, stride=2)
    rel = oracle.forward_relation(coords, 2, 2)
    np.testing.assert_array_equal(y.coords.numpy(), rel.out_coords)
    oracle.assert_close(y.feats, oracle.conv_forward(feats, wk.numpy(), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out), "f64")
